"""Scripted end-effector experts for the ManiSkill tasks (controller ``pd_ee_delta_pos``).

mplib motion planning (ManiSkill's own demo generator) segfaults under
numpy >= 2, so these are waypoint scripts in end-effector space that read
ground truth through ``sim.privileged()``: move the TCP to a sequence of
points with a proportional step, open or close the gripper. Each phase ends
when the TCP is within ``tolerance`` of its point (or after ``patience``
steps). The action's first three numbers are the TCP displacement in units
of 0.1 m (the controller's scale), the fourth the gripper (1 open, -1 closed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs.base import SimObs, Simulator

__all__ = ["PickCubeExpert", "PullCubeExpert", "PushCubeExpert", "StackCubeExpert"]

OPEN, CLOSED = 1.0, -1.0
STEP_M = 0.1  # metres of TCP displacement per unit of action (pd_ee_delta_pos bounds)
CUBE_HALF = 0.02


@dataclass(frozen=True)
class Waypoint:
    point: np.ndarray  # where the TCP should go (m, world frame)
    gripper: float
    tolerance: float = 0.01
    patience: int = 15  # steps before moving on anyway
    gain: float = 1.0


def _move(tcp: np.ndarray, target: np.ndarray, gripper: float, gain: float = 1.0) -> np.ndarray:
    delta = gain * (target - tcp) / STEP_M
    largest = float(np.abs(delta).max())
    if largest > 1.0:
        delta = delta / largest
    return np.append(delta, gripper).astype(np.float32)


class _WaypointExpert:
    """Plans waypoints from the first observation's ground truth, re-planning when the plan says so."""

    def __init__(self, noise: float = 0.0):
        self.noise = noise
        self.rng = np.random.default_rng(0)
        self.phase = 0
        self.phase_steps = 0

    def reset(self, seed: int) -> None:
        self.rng = np.random.default_rng([seed, 0x5EED])
        self.phase, self.phase_steps = 0, 0

    def plan(self, truth: dict[str, np.ndarray]) -> list[Waypoint]:
        raise NotImplementedError

    def act(self, obs: SimObs, sim: Simulator) -> np.ndarray:
        truth = sim.privileged()  # type: ignore[attr-defined]
        waypoints = self.plan(truth)
        tcp = truth["tcp"]
        while self.phase < len(waypoints) - 1:
            wp = waypoints[self.phase]
            if np.linalg.norm(wp.point - tcp) > wp.tolerance and self.phase_steps < wp.patience:
                break
            self.phase, self.phase_steps = self.phase + 1, 0
        wp = waypoints[self.phase]
        self.phase_steps += 1
        action = _move(tcp, wp.point, wp.gripper, wp.gain)
        if self.noise:
            action[:3] += self.rng.normal(0.0, self.noise, size=3)
        return np.clip(action, -1.0, 1.0)


class PushCubeExpert(_WaypointExpert):
    """Behind the cube (-x side), down to table height, push along +x until the cube sits on the goal."""

    def plan(self, truth: dict[str, np.ndarray]) -> list[Waypoint]:
        cube, goal = truth["cube"], truth["goal"]
        behind = cube + np.array([-CUBE_HALF - 0.03, 0.0, 0.0])
        low = np.array([behind[0], behind[1], CUBE_HALF])
        through = np.array([goal[0] - CUBE_HALF - 0.005, goal[1], CUBE_HALF])
        return [Waypoint(behind + np.array([0, 0, 0.05]), CLOSED, 0.015),
                Waypoint(low, CLOSED, 0.01),
                Waypoint(through, CLOSED, 0.005, patience=40)]


class PullCubeExpert(_WaypointExpert):
    """Beyond the cube (+x side), down, pull back along -x to the goal (which lies towards the robot)."""

    def plan(self, truth: dict[str, np.ndarray]) -> list[Waypoint]:
        cube, goal = truth["cube"], truth["goal"]
        beyond = cube + np.array([CUBE_HALF + 0.03, 0.0, 0.0])
        low = np.array([beyond[0], beyond[1], CUBE_HALF])
        through = np.array([goal[0] + CUBE_HALF + 0.005, goal[1], CUBE_HALF])
        return [Waypoint(beyond + np.array([0, 0, 0.05]), CLOSED, 0.015),
                Waypoint(low, CLOSED, 0.01),
                Waypoint(through, CLOSED, 0.005, patience=40)]


class PickCubeExpert(_WaypointExpert):
    """Above the cube, down with the gripper open, close, lift and carry to the goal, hold still there."""

    def plan(self, truth: dict[str, np.ndarray]) -> list[Waypoint]:
        cube, goal = truth["cube"], truth["goal"]
        if self.phase <= 2:  # where the cube was when the gripper closed on it
            self._grip = cube.copy()
        grip = self._grip
        return [Waypoint(cube + np.array([0.0, 0.0, 0.06]), OPEN, 0.01),
                Waypoint(cube, OPEN, 0.006),
                Waypoint(grip, CLOSED, 1e-9, patience=5),
                Waypoint(grip + np.array([0.0, 0.0, 0.05]), CLOSED, 0.02),
                Waypoint(goal, CLOSED, 0.003, patience=60, gain=0.8)]


class StackCubeExpert(_WaypointExpert):
    """Pick the red cube, carry it above the green one, lower it onto it, open, back off upwards."""

    def plan(self, truth: dict[str, np.ndarray]) -> list[Waypoint]:
        cube, base = truth["cube"], truth["base"]
        if self.phase <= 2:  # where the cube was when the gripper closed on it
            self._grip = cube.copy()
        grip = self._grip
        top = base + np.array([0.0, 0.0, 2 * CUBE_HALF + 0.002])
        return [Waypoint(cube + np.array([0.0, 0.0, 0.06]), OPEN, 0.01),
                Waypoint(cube, OPEN, 0.006),
                Waypoint(grip, CLOSED, 1e-9, patience=5),
                Waypoint(grip + np.array([0.0, 0.0, 0.08]), CLOSED, 0.02),
                Waypoint(top + np.array([0.0, 0.0, 0.04]), CLOSED, 0.01),
                Waypoint(top, CLOSED, 0.005, patience=20),
                Waypoint(top, OPEN, 1e-9, patience=4),
                Waypoint(top + np.array([0.0, 0.0, 0.08]), OPEN, 0.01, patience=40)]
