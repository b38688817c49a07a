"""Scripted experts for the built-in 2D tasks; they read ground truth through ``sim.privileged()``.

Both steer at full speed and slow down proportionally near their aim point.
``noise`` adds seeded Gaussian noise to every action (diversity for
demonstrations, at some cost in success); the noise stream restarts at
``reset(seed)``, so a recorded episode is a pure function of its seed.
"""

from __future__ import annotations

import numpy as np

from envs.base import NoisyExpert, SimObs, Simulator
from envs.builtin import AGENT_RADIUS, BLOCK_RADIUS, SPEED

__all__ = ["PushExpert", "ReachExpert"]

CONTACT = AGENT_RADIUS + BLOCK_RADIUS


def _toward(offset: np.ndarray, gain: float = 1.0) -> np.ndarray:
    """The action that covers ``offset`` (world units) as fast as the bounds allow, keeping its direction."""
    action = gain * offset / SPEED
    largest = float(np.abs(action).max())
    return action / largest if largest > 1.0 else action


class ReachExpert(NoisyExpert):
    """Straight to the named target."""

    def act(self, obs: SimObs, sim: Simulator) -> np.ndarray:
        truth = sim.privileged()  # type: ignore[attr-defined]
        return self._finish(_toward(truth["goal"] - truth["agent"]))


class PushExpert(NoisyExpert):
    """Go around the block to its side away from the goal, then push along the block-goal line.

    With ``u`` the unit vector block -> goal, the push starts from
    ``block - u * (contact + margin)``. When the straight way there would touch
    the block, the agent instead follows a circle around the block (radius
    ``orbit``), one step of arc at a time, towards that side.
    """

    margin = 0.03
    orbit = CONTACT + 0.08

    def act(self, obs: SimObs, sim: Simulator) -> np.ndarray:
        truth = sim.privileged()  # type: ignore[attr-defined]
        agent, block, goal = truth["agent"], truth["block"], truth["goal"]
        to_goal = goal - block
        u = to_goal / max(float(np.linalg.norm(to_goal)), 1e-9)
        rel = agent - block
        along = float(rel @ u)
        lateral = float(np.linalg.norm(rel - along * u))
        if along < -0.8 * CONTACT and lateral < 0.03:  # behind and in line: push
            aim = block + u * min(float(np.linalg.norm(to_goal)), SPEED) - u * CONTACT
            return self._finish(_toward(_toward(aim - agent, gain=1.5) + 0.5 * u, gain=SPEED))
        start = block - u * (CONTACT + self.margin)
        if not _crosses(agent, start, block, CONTACT + 0.01):
            return self._finish(_toward(start - agent))
        return self._finish(_toward(self._orbit_aim(rel, u) + block - agent))

    def _orbit_aim(self, rel: np.ndarray, u: np.ndarray) -> np.ndarray:
        """The point one step of arc further round the orbit, towards the push side (-u)."""
        angle = np.arctan2(rel[1], rel[0])
        behind = np.arctan2(-u[1], -u[0])
        gap = (behind - angle + np.pi) % (2 * np.pi) - np.pi  # signed, in (-pi, pi]
        arc = min(abs(gap), 1.5 * SPEED / self.orbit)
        angle += np.sign(gap) * arc if gap else arc
        return self.orbit * np.array([np.cos(angle), np.sin(angle)])


def _crosses(start: np.ndarray, end: np.ndarray, center: np.ndarray, radius: float) -> bool:
    """Whether the segment start -> end passes within ``radius`` of ``center``."""
    seg = end - start
    t = float(np.clip((center - start) @ seg / max(float(seg @ seg), 1e-12), 0.0, 1.0))
    return float(np.linalg.norm(start + t * seg - center)) < radius
