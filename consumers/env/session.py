"""One env session: a simulator stepping episode after episode, speaking through Kafka.

A session is created from an ``EnvSessionRequested`` and runs until its episode
count is reached or it is closed. Per episode ``k``: reset with ``seed + k``,
publish an Observation, wait for the Action that answers it, step, record a
RolloutRecord, repeat; at the episode's end its rollouts and the session's new
progress are committed in ONE transaction. So a worker that dies mid-episode
leaves no trace of that episode, and whoever takes the session over re-runs it
from its reset seed: no episode lost, none counted twice.

The simulator runs in a worker thread under a watchdog. A step or reset that
raises or exceeds ``step_timeout_s`` restarts the simulator in place (a new
instance; a hung thread is abandoned), tells the tenant with an
``EnvSessionRestarted`` on its status topic, and re-runs the episode; after
``max_restarts`` failures in a row the session is marked FAILED.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from consumers.env.pool import close_quietly
from envs.base import InvalidAction, SimObs, SimStep, Simulator
from infra.logging import get_logger
from schemas import events as ev
from schemas.tensors import from_numpy, to_numpy

__all__ = ["PolicyFailed", "SessionPorts", "SessionRunner", "SimulatorFailed", "SimulatorHung"]

log = get_logger("consumers.env.session")
START_TIMEOUT_S = 300.0  # a simulator's start, which may import and initialise a physics engine
ACTION_TIMEOUT_S = 10.0  # an env that waited this long for an action asks again


class SimulatorFailed(Exception):
    """A simulator call raised or hung; the session restarts the simulator."""


class PolicyFailed(Exception):
    """The tenant's action was unusable (wrong shape, NaN): not the simulator's fault, so
    restarting it would not help; the session fails and the tenant is told why."""


class SimulatorHung(SimulatorFailed):
    """A simulator call exceeded the watchdog's limit."""


@dataclass
class SessionPorts:
    """What a session needs from its worker: where to publish, how to get actions."""

    publish_observation: Callable  # async (Observation) -> None
    commit_episode: Callable  # async (list[RolloutRecord], EnvSessionProgress) -> None
    publish_status: Callable  # async (Event) -> None
    next_action: Callable  # async (session_id, episode_id, step) -> Action
    make_simulator: Callable[[ev.EnvSessionRequested], Simulator]
    # a cleanly finished session's simulator goes here, for the next session like it (pool.py)
    release_simulator: Callable[[ev.EnvSessionRequested, Simulator], None] | None = None
    # seconds from an observation's first publish to its action, re-asks included (the worker's stats)
    action_waited: Callable[[float], None] | None = None
    # False once the worker no longer runs this session (its partition was revoked): answers for it
    # go to whichever worker has it now, so asking again would only load inference for nobody
    still_mine: Callable[[], bool] | None = None


class SessionRunner:
    def __init__(self, spec: ev.EnvSessionRequested, progress: ev.EnvSessionProgress | None,
                 ports: SessionPorts, worker_id: str, step_timeout_s: float = 30.0,
                 max_restarts: int = 3, action_timeout_s: float = ACTION_TIMEOUT_S):
        self.spec = spec
        self.ports = ports
        self.worker_id = worker_id
        self.step_timeout_s = step_timeout_s
        self.max_restarts = max_restarts
        self.action_timeout_s = action_timeout_s
        self.episodes = progress.episodes_completed if progress else 0
        self.steps = progress.steps_completed if progress else 0
        self.successes = progress.successes if progress else 0
        self.restarts = progress.restarts if progress else 0
        self.log = log.bind(tenant=spec.tenant_id, session=spec.session_id)
        self._sim: Simulator | None = None

    def _envelope(self) -> ev.Envelope:
        return ev.Envelope(tenant_id=self.spec.tenant_id, producer_id=f"env/{self.worker_id}",
                           correlation_id=self.spec.job_id)

    def done(self) -> bool:
        return self.spec.episodes is not None and self.episodes >= self.spec.episodes

    async def run(self) -> None:
        try:
            failures = 0
            while not self.done():
                try:
                    await self._episode()
                    failures = 0
                except SimulatorFailed as exc:  # bus errors are not the simulator's: they propagate
                    failures += 1
                    await self._restart(exc)
                    if failures > self.max_restarts:
                        await self._fail("SimulatorFailed", f"{failures} failures in a row: {exc}")
                        return
                except PolicyFailed as exc:
                    await self._fail("InvalidAction", str(exc))
                    return
            await self._finish(ev.SessionStatus.CLOSED)
            if self._sim is not None and self.ports.release_simulator is not None:
                sim, self._sim = self._sim, None
                self.ports.release_simulator(self.spec, sim)
        finally:
            self._close_sim()

    async def _call(self, fn, *args, timeout_s: float | None = None):
        timeout_s = timeout_s or self.step_timeout_s
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn, *args), timeout_s)
        except TimeoutError:
            name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", repr(fn))
            raise SimulatorHung(f"{name} exceeded {timeout_s}s") from None
        except InvalidAction as exc:
            raise PolicyFailed(str(exc)) from exc
        except Exception as exc:
            raise SimulatorFailed(f"{type(exc).__name__}: {exc}") from exc

    async def _episode(self) -> None:
        spec, k = self.spec, self.episodes
        episode_id, seed = f"{spec.session_id}/{k}", spec.seed + k
        if self._sim is None:
            # a first start may import a physics engine (ManiSkill: over 30 s under load)
            self._sim = await self._call(self.ports.make_simulator, spec,
                                         timeout_s=max(self.step_timeout_s, START_TIMEOUT_S))
        limit = spec.max_episode_steps or self._sim.spec.max_episode_steps
        obs: SimObs = await self._call(self._sim.reset, seed)
        records: list[ev.RolloutRecord] = []
        success = False
        for step in range(limit):
            observation = self._observation(obs, episode_id, step)
            action = await self._ask(observation)
            result: SimStep = await self._call(self._sim.step, _action_vector(action))
            success = success or result.success
            truncated = result.truncated or (step == limit - 1 and not result.terminated)
            records.append(ev.RolloutRecord(
                envelope=self._envelope(), session_id=spec.session_id, episode_id=episode_id,
                step=step, reset_seed=seed, observation=observation, action=action.action,
                reward=float(result.reward), terminated=result.terminated, truncated=truncated,
                success=result.success, policy_version=action.policy_version,
                log_prob=action.log_prob, value=action.value))
            obs = result.obs
            if result.terminated or truncated:
                break
        progress = self._progress(ev.SessionStatus.RUNNING, k + 1, len(records), success)
        await self.ports.commit_episode(records, progress)
        self.episodes, self.steps = k + 1, self.steps + len(records)
        self.successes += int(success)

    async def _ask(self, observation: ev.Observation) -> ev.Action:
        """Publish an observation and wait for its action; ask again if none comes in time
        (an inference worker may have died with it). Answers are keyed by (episode, step),
        so a duplicate answer is simply dropped."""
        asked = time.monotonic()
        while True:
            await self.ports.publish_observation(observation)
            try:
                action = await asyncio.wait_for(
                    self.ports.next_action(observation.session_id, observation.episode_id,
                                           observation.step), self.action_timeout_s)
                if self.ports.action_waited is not None:
                    self.ports.action_waited(time.monotonic() - asked)
                return action
            except TimeoutError:
                task = asyncio.current_task()
                revoked = self.ports.still_mine is not None and not self.ports.still_mine()
                if revoked or (task is not None and task.cancelling()):
                    # Python 3.11's wait_for can swallow a cancel that lands as it times out
                    # (gh-86296), and a quick demo on mini-pretrained still had a revoked session
                    # ask again for 50 s on the worker that lost it: its worker's word decides
                    self.log.info("revoked session stops asking", episode=observation.episode_id,
                                  step=observation.step)
                    raise asyncio.CancelledError from None
                self.log.warning("no action in time; asking again", episode=observation.episode_id,
                                 step=observation.step, waited_s=self.action_timeout_s)

    def _observation(self, obs: SimObs, episode_id: str, step: int) -> ev.Observation:
        return ev.Observation(
            envelope=self._envelope(), session_id=self.spec.session_id, episode_id=episode_id,
            step=step, instruction=obs.instruction,
            image=from_numpy(obs.image) if obs.image is not None else None,
            state=from_numpy(obs.state) if obs.state is not None else None,
            proprio=from_numpy(np.asarray(obs.proprio, dtype=np.float32)))

    def _progress(self, status: ev.SessionStatus, episodes: int, new_steps: int = 0,
                  success: bool = False) -> ev.EnvSessionProgress:
        return ev.EnvSessionProgress(
            envelope=self._envelope(), session_id=self.spec.session_id, job_id=self.spec.job_id,
            status=status, episodes_completed=episodes, steps_completed=self.steps + new_steps,
            successes=self.successes + int(success), restarts=self.restarts, worker_id=self.worker_id)

    async def _restart(self, exc: BaseException) -> None:
        self.restarts += 1
        cause = exc.__cause__ or exc
        name = "SimulatorHung" if isinstance(exc, SimulatorHung) else type(cause).__name__
        self.log.warning("simulator restarted in place", error_class=name, error=str(exc)[:300],
                         episode=self.episodes, restarts=self.restarts)
        self._close_sim()
        await self.ports.publish_status(ev.EnvSessionRestarted(
            envelope=self._envelope(), session_id=self.spec.session_id, job_id=self.spec.job_id,
            episode_id=f"{self.spec.session_id}/{self.episodes}", error_class=name,
            reason=str(exc)[:1000], restarts=self.restarts))

    async def _fail(self, error_class: str, reason: str) -> None:
        await self.ports.publish_status(ev.JobFailed(
            envelope=self._envelope(), job_id=self.spec.job_id, error_class=error_class,
            reason=f"session {self.spec.session_id}: {reason}"[:2000], stage="env"))
        await self._finish(ev.SessionStatus.FAILED)

    async def _finish(self, status: ev.SessionStatus) -> None:
        await self.ports.commit_episode([], self._progress(status, self.episodes))
        self.log.info("session finished", status=status.value, episodes=self.episodes,
                      successes=self.successes, restarts=self.restarts)

    def _close_sim(self) -> None:
        sim, self._sim = self._sim, None
        if sim is not None:  # off the event loop: a hung simulator may hang in close() too
            close_quietly(sim)


def _action_vector(action: ev.Action) -> np.ndarray:
    """The env executes one action per observation: the first row of an action chunk."""
    array = to_numpy(action.action).astype(np.float32)
    return array.reshape(-1, array.shape[-1])[0] if array.ndim > 1 else array
