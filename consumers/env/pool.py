"""Simulators kept between sessions: an RL job opens new sessions every iteration, and starting a
simulator can cost far more than its episodes (a ManiSkill simulator in its own process imports
SAPIEN and builds a scene: minutes on a loaded 2-core machine, against seconds of stepping).

Guarantee: a pooled simulator gives the same episodes as a new one, because an episode is a pure
function of its reset seed and actions (tested per simulator family: ``tests/test_sim_*.py``,
"an episode is a pure function of its seed", reset after other episodes). Only a simulator whose
session finished cleanly comes back; one that raised, hung, or belonged to a session that was
revoked or cancelled is closed, as before. Simulators are kept per tenant and per
``EnvSessionRequested`` shape (env id, observation mode, image size, cameras, episode limit):
tenants never share one. At most ``max_idle`` wait per key, each for at most ``idle_ttl_s``.

Thread-safe: sessions acquire from the watchdog's worker thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from envs.base import Simulator
from infra.logging import get_logger
from schemas import events as ev

__all__ = ["SimulatorPool"]

log = get_logger("consumers.env.pool")

Key = tuple[str, str, str, int, int, int | None]


def _key(spec: ev.EnvSessionRequested) -> Key:
    return (spec.tenant_id, spec.env_id, spec.obs_mode, spec.image_size, spec.cameras, spec.max_episode_steps)


def close_quietly(sim: Simulator) -> None:
    """In a daemon thread: a broken simulator may hang in close() too."""

    def close() -> None:
        try:
            sim.close()
        except Exception as exc:
            log.warning("simulator close failed", error=str(exc)[:200])

    threading.Thread(target=close, daemon=True, name="sim-close").start()


class SimulatorPool:
    def __init__(self, make: Callable[[ev.EnvSessionRequested], Simulator], max_idle: int = 8,
                 idle_ttl_s: float = 300.0, clock: Callable[[], float] = time.monotonic):
        self.make = make
        self.max_idle = max_idle
        self.idle_ttl_s = idle_ttl_s
        self.clock = clock
        self.made = 0  # simulators started
        self.reused = 0  # sessions served by a kept simulator
        self.starting = 0  # starts in flight now
        self._idle: dict[Key, list[tuple[float, Simulator]]] = {}
        self._lock = threading.Lock()

    def acquire(self, spec: ev.EnvSessionRequested) -> Simulator:
        with self._lock:
            idle = self._idle.get(_key(spec))
            if idle:
                self.reused += 1
                return idle.pop()[1]
            self.made += 1
            self.starting += 1
        try:
            return self.make(spec)
        finally:
            with self._lock:
                self.starting -= 1

    def release(self, spec: ev.EnvSessionRequested, sim: Simulator) -> None:
        """A simulator whose session finished cleanly: kept for the next session like it."""
        with self._lock:
            idle = self._idle.setdefault(_key(spec), [])
            if len(idle) < self.max_idle:
                idle.append((self.clock(), sim))
                return
        close_quietly(sim)

    def expire(self) -> int:
        """Closes the simulators idle for longer than ``idle_ttl_s``; returns how many."""
        cutoff, stale = self.clock() - self.idle_ttl_s, []
        with self._lock:
            for key, idle in list(self._idle.items()):
                stale += [sim for since, sim in idle if since < cutoff]
                self._idle[key] = [(since, sim) for since, sim in idle if since >= cutoff]
                if not self._idle[key]:
                    del self._idle[key]
        for sim in stale:
            close_quietly(sim)
        return len(stale)

    def close(self) -> None:
        with self._lock:
            sims = [sim for idle in self._idle.values() for _, sim in idle]
            self._idle.clear()
        for sim in sims:
            close_quietly(sim)

    @property
    def idle(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._idle.values())
