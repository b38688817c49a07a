"""Env ids -> simulators and scripted experts; ``make_simulator`` is the one way in.

Heavy simulator libraries (gymnasium's MuJoCo, ManiSkill/SAPIEN, torch) are
imported only when a simulator of theirs is made, so the built-in tasks start
in milliseconds. Every simulator comes wrapped in ``GuardedSimulator``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from envs.base import Expert, Simulator, SimulatorError
from envs.guard import GuardedSimulator
from envs.options import NoOptions, SimOptions, parse_task_options, split_env_id
from infra.errors import ConfigError
from infra.logging import get_logger

__all__ = ["ENVS", "EnvEntry", "env_ids", "make_expert", "make_simulator"]

log = get_logger("envs")

Builder = Callable[[str, SimOptions, Mapping[str, Any]], Simulator]


@dataclass(frozen=True)
class EnvEntry:
    family: str  # builtin | gymnasium | maniskill | test
    build: Builder
    expert: Callable[..., Expert] | None = None


def _planar(kind: str) -> Builder:
    def build(env_id: str, options: SimOptions, raw: Mapping[str, Any]) -> Simulator:
        from envs.builtin import PlanarOptions, PushSim, ReachSim

        cls = ReachSim if kind == "reach" else PushSim
        return cls(env_id, options, parse_task_options(env_id, PlanarOptions, raw))
    return build


def _planar_expert(kind: str) -> Callable[..., Expert]:
    def make(**kwargs: Any) -> Expert:
        from envs.builtin_experts import PushExpert, ReachExpert

        return (ReachExpert if kind == "reach" else PushExpert)(**kwargs)
    return make


def _faulty(env_id: str, options: SimOptions, raw: Mapping[str, Any]) -> Simulator:
    from envs.faulty import FaultyOptions, FaultySim

    return FaultySim(env_id, options, parse_task_options(env_id, FaultyOptions, raw))


def _gym(env_id: str, options: SimOptions, raw: Mapping[str, Any]) -> Simulator:
    from envs.gym_sims import GymSim

    parse_task_options(env_id, NoOptions, raw)
    return GymSim(env_id, options)


def _gym_expert(name: str) -> Callable[..., Expert]:
    def make(**kwargs: Any) -> Expert:
        from envs import gym_experts

        return getattr(gym_experts, name)(**kwargs)
    return make


def _maniskill(env_id: str, options: SimOptions, raw: Mapping[str, Any]) -> Simulator:
    from envs.maniskill import ManiSkillOptions, ManiSkillSim

    return ManiSkillSim(env_id, options, parse_task_options(env_id, ManiSkillOptions, raw))


def _maniskill_expert(name: str) -> Callable[..., Expert]:
    def make(**kwargs: Any) -> Expert:
        from envs import maniskill_experts

        return getattr(maniskill_experts, name)(**kwargs)
    return make


ENVS: dict[str, EnvEntry] = {
    "joynexus/Reach-v0": EnvEntry("builtin", _planar("reach"), _planar_expert("reach")),
    "joynexus/Push-v0": EnvEntry("builtin", _planar("push"), _planar_expert("push")),
    "joynexus/Faulty-v0": EnvEntry("test", _faulty, _planar_expert("reach")),
    "Pendulum-v1": EnvEntry("gymnasium", _gym, _gym_expert("PendulumExpert")),
    "Reacher-v5": EnvEntry("gymnasium", _gym, _gym_expert("ReacherExpert")),
    "Pusher-v5": EnvEntry("gymnasium", _gym),
    "PushCube-v1": EnvEntry("maniskill", _maniskill, _maniskill_expert("PushCubeExpert")),
    "PickCube-v1": EnvEntry("maniskill", _maniskill, _maniskill_expert("PickCubeExpert")),
    "StackCube-v1": EnvEntry("maniskill", _maniskill, _maniskill_expert("StackCubeExpert")),
    "PullCube-v1": EnvEntry("maniskill", _maniskill, _maniskill_expert("PullCubeExpert")),
    "LiftPegUpright-v1": EnvEntry("maniskill", _maniskill),
}


def env_ids(family: str | None = None) -> list[str]:
    return sorted(k for k, entry in ENVS.items() if family is None or entry.family == family)


def family_of(env_id: str) -> str:
    """builtin, gymnasium, maniskill or test (ConfigError for an unknown id)."""
    return _entry(env_id)[1].family


def open_simulator(env_id: str, isolation: str = "auto", **make_kwargs: Any) -> Simulator:
    """``make_simulator`` in this process (``"thread"``) or in a child process (``"process"``:
    ``IsolatedSimulator``, so a segfault, a hang or a native call that holds the GIL for seconds
    costs the child only). ``"auto"`` isolates ManiSkill, whose SAPIEN start-up held a process's
    GIL long enough to stop its Kafka and health heartbeats, and runs the others in-process."""
    if isolation == "auto":
        isolation = "process" if family_of(env_id) == "maniskill" else "thread"
    if isolation == "process":
        from envs.isolated import IsolatedSimulator

        return IsolatedSimulator(env_id, **make_kwargs)
    return make_simulator(env_id, **make_kwargs)


def _entry(env_id: str) -> tuple[str, EnvEntry, dict[str, str]]:
    base, query = split_env_id(env_id)
    if base not in ENVS:
        raise ConfigError(f"unknown env id {base!r}; valid ids: {', '.join(env_ids())}")
    return base, ENVS[base], query


def make_simulator(env_id: str, *, obs_mode: str = "rgb", image_size: int = 64,
                   max_episode_steps: int | None = None, cameras: int = 1,
                   options: Mapping[str, Any] | None = None) -> GuardedSimulator:
    """A ready simulator (call ``reset(seed)`` next).

    Task options come from the env id's query (``joynexus/Faulty-v0?fault=hang``)
    and/or ``options``; naming one in both is an error. Bad ids, modes and
    options raise ``ConfigError``; a simulator that fails to start raises
    ``SimulatorError`` with the cause chained.
    """
    base, entry, query = _entry(env_id)
    clash = sorted(set(query) & set(options or {}))
    if clash:
        raise ConfigError(f"option(s) {clash} given both in the env id {env_id!r} and in options")
    sim_options = SimOptions(obs_mode=obs_mode, image_size=image_size,
                             max_episode_steps=max_episode_steps, cameras=cameras)
    try:
        inner = entry.build(base, sim_options, {**query, **(options or {})})
    except (ConfigError, SimulatorError):
        raise
    except Exception as exc:
        raise SimulatorError(f"{env_id}: the simulator failed to start: {exc!r}") from exc
    if env_id != base:  # the spec names the simulator as asked for, options included
        inner.spec = replace(inner.spec, env_id=env_id)
    log.debug("simulator made", env_id=env_id, obs_mode=obs_mode, image_size=image_size)
    return GuardedSimulator(inner)


def make_expert(env_id: str, **kwargs: Any) -> Expert:
    """The scripted expert of a task (``kwargs`` go to its constructor, e.g. ``noise=0.1``)."""
    base, entry, _ = _entry(env_id)
    if entry.expert is None:
        with_experts = [k for k, e in ENVS.items() if e.expert is not None]
        raise ConfigError(f"{base} has no scripted expert; these do: {', '.join(sorted(with_experts))}")
    return entry.expert(**kwargs)
