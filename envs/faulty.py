"""``joynexus/Faulty-v0``: the built-in Reach task with a fault injected on purpose, for isolation tests.

Options (in the env id's query, e.g. ``joynexus/Faulty-v0?fault=hang&at_step=3``,
or ``make_simulator(..., options={...})``):

* ``fault``: ``raise`` (a ``RuntimeError`` inside the simulator, which the guard
  turns into ``SimulatorError``), ``hang`` (the call blocks for ``hang_s``
  seconds; ``close()`` from another thread ends it early with a
  ``SimulatorError``), ``nan`` (returns a NaN observation: garbage the guard
  catches) or ``exit`` (``os._exit(17)``: the process dies, as a segfaulting
  simulator would; only meaningful in an ``IsolatedSimulator``). Default ``raise``.
* ``at_step``: the step of every episode (1-based) that faults. Default 3.
* ``at_reset``: fault in the n-th ``reset`` of this instance (1-based) instead of a step.
* ``hang_s``: how long ``hang`` blocks. Default 3600.
* ``once_file``: a path; fault only while it does not exist, and create it when
  faulting. A restarted simulator (a new instance, even in another process)
  then runs cleanly, which is how a test shows "fails once, recovers after restart".

Episodes are otherwise exactly ``joynexus/Reach-v0``'s (pure functions of the seed).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from envs.base import SimObs, SimStep
from envs.builtin import PlanarOptions, ReachSim
from envs.options import SimOptions
from infra.errors import ConfigError

__all__ = ["FAULTS", "FaultyOptions", "FaultySim"]

FAULTS = ("raise", "hang", "nan", "exit")
EXIT_CODE = 17


@dataclass(frozen=True)
class FaultyOptions:
    fault: Literal["raise", "hang", "nan", "exit"] = "raise"
    at_step: int = 3
    at_reset: int | None = None
    hang_s: float = 3600.0
    once_file: str | None = None
    distractors: int = 1

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ConfigError(f"fault must be one of {FAULTS}, got {self.fault!r}")
        if self.at_step < 1 or (self.at_reset is not None and self.at_reset < 1):
            raise ConfigError("at_step and at_reset count from 1")
        if self.hang_s < 0:
            raise ConfigError(f"hang_s must be >= 0, got {self.hang_s}")


class FaultySim(ReachSim):
    """Reach, faulting where its options say; counts ``resets`` and ``steps`` of the current episode."""

    def __init__(self, env_id: str, options: SimOptions, faults: FaultyOptions):
        super().__init__(env_id, options, PlanarOptions(distractors=faults.distractors))
        self.faults = faults
        self.resets = 0
        self.steps = 0
        self._closed = threading.Event()

    def _armed(self) -> bool:
        once = self.faults.once_file
        return once is None or not Path(once).exists()

    def _fault(self, where: str, obs: SimObs) -> SimObs:
        """Injects the configured fault; what it returns (garbage for ``nan``) is what the call returns."""
        if self.faults.once_file is not None:
            Path(self.faults.once_file).touch()
        if self.faults.fault == "raise":
            raise RuntimeError(f"injected fault in {where}")
        if self.faults.fault == "exit":
            os._exit(EXIT_CODE)
        if self.faults.fault == "hang" and self._closed.wait(self.faults.hang_s):
            raise RuntimeError(f"closed while hanging in {where}")
        return _poisoned(obs) if self.faults.fault == "nan" else obs  # a hang that ran out: just slow

    def reset(self, seed: int) -> SimObs:
        self.resets += 1
        self.steps = 0
        obs = super().reset(seed)
        if self.resets == self.faults.at_reset and self._armed():
            return self._fault(f"reset {self.resets}", obs)
        return obs

    def step(self, action: np.ndarray) -> SimStep:
        self.steps += 1
        out = super().step(action)
        if self.faults.at_reset is None and self.steps == self.faults.at_step and self._armed():
            obs = self._fault(f"step {self.steps}", out.obs)
            return SimStep(obs, out.reward, out.terminated, out.truncated, out.success)
        return out

    def close(self) -> None:
        self._closed.set()


def _poisoned(obs: SimObs) -> SimObs:
    proprio = obs.proprio.copy()
    proprio[0] = np.nan
    return SimObs(obs.instruction, proprio, obs.image, obs.state)
