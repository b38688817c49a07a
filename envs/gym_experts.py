"""Scripted experts for the gymnasium tasks, from gym's own observation vector (``sim.privileged()['obs']``).

* Pendulum: energy pumping until the pendulum nears the top, then a PD hold.
* Reacher: analytic inverse kinematics (link lengths 0.1 and 0.11 m), then a joint-space PD.

Deterministic (``noise`` adds seeded Gaussian noise for demonstration diversity).
"""

from __future__ import annotations

import numpy as np

from envs.base import NoisyExpert, SimObs, Simulator

__all__ = ["PendulumExpert", "ReacherExpert"]

PENDULUM_MAX_TORQUE = 2.0
REACHER_LINKS = (0.1, 0.11)


class PendulumExpert(NoisyExpert):
    """Energy shaping (gym's pendulum: g=10, m=l=1) far from the top, PD within 0.6 rad of it."""

    low, high = -PENDULUM_MAX_TORQUE, PENDULUM_MAX_TORQUE

    def act(self, obs: SimObs, sim: Simulator) -> np.ndarray:
        cos, sin, velocity = sim.privileged()["obs"]  # type: ignore[attr-defined]
        angle = float(np.arctan2(sin, cos))  # 0 is upright
        if abs(angle) < 0.6:
            torque = -(12.0 * angle + 2.5 * velocity)
        else:
            energy = velocity**2 / 6.0 + 5.0 * cos  # (m l^2 / 3) w^2 / 2 + m g (l / 2) cos
            torque = 4.0 * (5.0 - energy) * np.sign(velocity if abs(velocity) > 1e-3 else 1.0)
        return self._finish(np.array([torque]))


class ReacherExpert(NoisyExpert):
    """Analytic inverse kinematics for the target (the elbow branch nearest the arm's), then joint PD."""

    kp, kd = 5.0, 0.3

    def act(self, obs: SimObs, sim: Simulator) -> np.ndarray:
        o = sim.privileged()["obs"]  # type: ignore[attr-defined]
        q, velocity, target = np.arctan2(o[2:4], o[0:2]), o[6:8], o[4:6]
        goal = _reacher_ik(target, elbow_sign=1.0 if q[1] >= 0 else -1.0)
        error = (goal - q + np.pi) % (2 * np.pi) - np.pi
        return self._finish(self.kp * error - self.kd * velocity)


def _reacher_ik(target: np.ndarray, elbow_sign: float) -> np.ndarray:
    l1, l2 = REACHER_LINKS
    cos2 = np.clip((target @ target - l1**2 - l2**2) / (2 * l1 * l2), -1.0, 1.0)
    q2 = elbow_sign * np.arccos(cos2)
    q1 = np.arctan2(target[1], target[0]) - np.arctan2(l2 * np.sin(q2), l1 + l2 * np.cos(q2))
    return np.array([q1, q2])
