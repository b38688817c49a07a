"""The wrapper ``make_simulator`` puts around every simulator: one contract, whatever runs inside.

It owns what must not differ between simulators: actions are checked (shape,
finite) and clipped to the spec's bounds, the episode limit truncates, a step
with no running episode is refused, every observation is checked against the
spec (shape, dtype, finite), and anything the inner simulator raises becomes
a ``SimulatorError`` with the cause chained, so the session layer restarts it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envs.base import InvalidAction, SimObs, SimSpec, SimStep, Simulator, SimulatorError
from infra.logging import get_logger

__all__ = ["MAX_SEED", "GuardedSimulator"]

MAX_SEED = 2**32 - 1  # numpy, torch and ManiSkill all take seeds of this width

log = get_logger("envs")


class GuardedSimulator:
    """A ``Simulator`` that enforces the contract of ``envs.base`` on an inner one."""

    def __init__(self, inner: Simulator):
        self.inner = inner
        self.spec: SimSpec = inner.spec
        self.elapsed_steps = 0
        self.episode_seed: int | None = None
        self._running = False

    def __repr__(self) -> str:
        return f"GuardedSimulator({self.spec.env_id!r}, inner={type(self.inner).__name__})"

    def reset(self, seed: int) -> SimObs:
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed <= MAX_SEED:
            raise InvalidAction(f"{self.spec.env_id}: seed must be an int in [0, 2**32), got {seed!r}")
        self._running = False
        try:
            obs = self.inner.reset(int(seed))
        except SimulatorError:
            raise
        except Exception as exc:
            raise SimulatorError(f"{self.spec.env_id}: reset(seed={seed}) failed: {exc!r}") from exc
        self._check_obs(obs, "reset")
        self.elapsed_steps, self.episode_seed, self._running = 0, int(seed), True
        return obs

    def step(self, action: Any) -> SimStep:
        if not self._running:
            raise InvalidAction(f"{self.spec.env_id}: no running episode (step before reset, or after "
                                "the episode ended); call reset(seed)")
        clipped = self._check_action(action)
        self._running = False  # stays False if the inner step raises: the episode is lost
        try:
            out = self.inner.step(clipped)
        except SimulatorError:
            raise
        except Exception as exc:
            raise SimulatorError(f"{self.spec.env_id}: step {self.elapsed_steps + 1} of the episode "
                                 f"with seed {self.episode_seed} failed: {exc!r}") from exc
        self._check_obs(out.obs, "step")
        if not np.isfinite(out.reward):
            raise SimulatorError(f"{self.spec.env_id}: step returned a non-finite reward {out.reward!r}")
        self.elapsed_steps += 1
        truncated = bool(out.truncated) or (self.elapsed_steps >= self.spec.max_episode_steps
                                            and not out.terminated)
        self._running = not (out.terminated or truncated)
        return SimStep(obs=out.obs, reward=float(out.reward), terminated=bool(out.terminated),
                       truncated=truncated, success=bool(out.success))

    def close(self) -> None:
        self._running = False
        try:
            self.inner.close()
        except Exception as exc:  # closing a broken simulator must not hide why it broke
            log.warning("simulator close failed", env_id=self.spec.env_id, error=repr(exc))

    def privileged(self) -> dict[str, np.ndarray]:
        """Ground truth for scripted experts (object and goal poses...), whatever the observation mode."""
        getter = getattr(self.inner, "privileged", None)
        if getter is None:
            raise SimulatorError(f"{self.spec.env_id}: this simulator exposes no privileged state")
        try:
            return getter()
        except Exception as exc:
            raise SimulatorError(f"{self.spec.env_id}: privileged() failed: {exc!r}") from exc

    def _check_action(self, action: Any) -> np.ndarray:
        try:
            arr = np.asarray(action, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise InvalidAction(f"{self.spec.env_id}: action is not numeric: {exc}") from exc
        if arr.shape != (self.spec.action_dim,):
            raise InvalidAction(f"{self.spec.env_id}: action must have shape ({self.spec.action_dim},), "
                                f"got {arr.shape}")
        if not np.isfinite(arr).all():
            raise InvalidAction(f"{self.spec.env_id}: action has NaN/Inf: {arr.tolist()}")
        return np.clip(arr, self.spec.action_low, self.spec.action_high)

    def _check_obs(self, obs: SimObs, where: str) -> None:
        spec, problems = self.spec, []
        if not isinstance(obs, SimObs):
            raise SimulatorError(f"{spec.env_id}: {where} returned {type(obs).__name__}, not SimObs")
        if not obs.instruction:
            problems.append("empty instruction")
        problems += _array_problems("proprio", obs.proprio, (spec.proprio_dim,), np.float32)
        if spec.cameras:
            size = spec.image_size
            problems += _array_problems("image", obs.image, (spec.cameras, size, size, 3), np.uint8)
        elif obs.image is not None:
            problems.append("image present in a mode without images")
        if spec.state_dim:
            problems += _array_problems("state", obs.state, (spec.state_dim,), np.float32)
        elif obs.state is not None:
            problems.append("state present in a mode without state")
        if problems:
            raise SimulatorError(f"{spec.env_id}: {where} returned a bad observation: {'; '.join(problems)}")


def _array_problems(name: str, arr: Any, shape: tuple[int, ...], dtype: type) -> list[str]:
    if not isinstance(arr, np.ndarray):
        return [f"{name} is {type(arr).__name__}, not an ndarray"]
    if arr.shape != shape or arr.dtype != dtype:
        return [f"{name} is {arr.dtype}{list(arr.shape)}, expected {np.dtype(dtype)}{list(shape)}"]
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        return [f"{name} has NaN/Inf"]
    return []
