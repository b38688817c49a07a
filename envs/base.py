"""The simulator interface every environment of the env role implements (no Kafka here).

A simulator is one episode stream: ``reset(seed)`` starts an episode that is a
pure function of the seed, ``step(action)`` advances it. Observations carry
what a VLA policy sees: camera images, an instruction, proprioception, and
optionally the privileged simulator state.

Errors: a simulator that raises, hangs past its deadline or returns garbage
(wrong shapes, NaN) surfaces as ``SimulatorError`` with the cause chained, so
the session layer restarts it; an action or seed the caller got wrong is an
``InvalidAction`` (the simulator is fine, the request is not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from infra.errors import JoynexusError

__all__ = ["OBS_MODES", "Expert", "InvalidAction", "NoisyExpert", "SimObs", "SimSpec", "SimStep", "Simulator",
           "SimulatorError"]

OBS_MODES = ("rgb", "state", "rgb+state")  # proprio and the instruction come with every mode


class SimulatorError(JoynexusError):
    """A simulator failed (raised, hung, returned garbage); its session restarts it."""


class InvalidAction(JoynexusError):
    """The caller's fault: an action of the wrong shape or not finite, a bad seed, a step with no episode."""


@dataclass(frozen=True)
class SimSpec:
    env_id: str
    action_dim: int
    proprio_dim: int
    state_dim: int  # 0 when the observation mode has no state
    max_episode_steps: int
    image_size: int | None  # square camera resolution; None when there are no images
    cameras: int  # 0 when there are no images
    action_low: float = -1.0
    action_high: float = 1.0


@dataclass(frozen=True)
class SimObs:
    instruction: str
    proprio: np.ndarray  # float32 [proprio_dim]
    image: np.ndarray | None = None  # uint8 [cameras, H, W, 3]
    state: np.ndarray | None = None  # float32 [state_dim]


@dataclass(frozen=True)
class SimStep:
    obs: SimObs
    reward: float
    terminated: bool
    truncated: bool
    success: bool


class Simulator(Protocol):
    spec: SimSpec

    def reset(self, seed: int) -> SimObs: ...

    def step(self, action: np.ndarray) -> SimStep: ...

    def close(self) -> None: ...


class Expert(Protocol):
    """A scripted policy that solves a task well enough to record demonstrations."""

    def reset(self, seed: int) -> None: ...

    def act(self, obs: SimObs, sim: Simulator) -> np.ndarray: ...


class NoisyExpert:
    """Base of scripted experts: seeded Gaussian action noise that restarts at ``reset(seed)``,
    so a recorded episode is a pure function of its seed. ``noise`` is relative to the
    half-range of the action bounds ``low``..``high``."""

    low, high = -1.0, 1.0

    def __init__(self, noise: float = 0.0):
        self.noise = noise
        self.rng = np.random.default_rng(0)

    def reset(self, seed: int) -> None:
        self.rng = np.random.default_rng([seed, 0x5EED])

    def _finish(self, action: np.ndarray) -> np.ndarray:
        if self.noise:
            action = action + self.rng.normal(0.0, self.noise * (self.high - self.low) / 2, action.shape)
        return np.clip(action, self.low, self.high).astype(np.float32)
