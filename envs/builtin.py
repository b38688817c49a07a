"""The built-in 2D tasks, pure numpy: ``joynexus/Reach-v0`` and ``joynexus/Push-v0``.

They exist so unit tests and the demo get a real image + instruction +
proprio task that a tiny model learns in minutes on a CPU. The scene is the
square [-1, 1]^2 seen from above: a white disc (the agent, moved by a 2D
velocity action), coloured target discs and, in Push, a purple block the agent
pushes. The instruction names the target's colour ("reach the blue target");
with ``distractors`` > 0 other colours are in the scene too, so the goal is
known only from the image AND the instruction.

Rewards pay progress and success, never presence: a step earns the distance it
closed (in full-speed steps, so a step straight at the aim earns about 1) minus
``STEP_COST``, and reaching the goal earns ``SUCCESS_BONUS`` and ends the
episode. Hovering next to the target costs, so the best return is to reach it,
fast: with a
dense "closeness" reward, hovering short of success paid more than ending the
episode, and PPO learnt to hover (measured: success stayed near 0).

Camera 0 sees the whole scene; camera 1 (``cameras=2``) is an agent-centred
"wrist" view at twice the zoom, black beyond the walls. Everything random in
an episode comes from ``numpy.random.default_rng(seed)`` at reset; steps are
deterministic, so an episode is a pure function of its seed and actions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs.base import SimObs, SimSpec, SimStep
from envs.canvas import Canvas, View
from envs.options import SimOptions
from infra.errors import ConfigError

__all__ = ["AGENT_RADIUS", "BLOCK_RADIUS", "COLORS", "SPEED", "PlanarOptions", "PushSim", "ReachSim"]

COLORS = {"red": (230, 50, 50), "green": (40, 200, 70), "blue": (60, 110, 245), "yellow": (235, 215, 40)}
AGENT_COLOR, BLOCK_COLOR = (245, 245, 245), (170, 80, 230)
BACKGROUND, OUTSIDE = (45, 45, 45), (0, 0, 0)
AGENT_RADIUS = 0.07
BLOCK_RADIUS = 0.08  # the block is drawn as a square of this half size, collides as a disc
TARGET_RADIUS = 0.12
SPEED = 0.1  # world units per step at |action| = 1 on an axis
SUBSTEPS = 2  # contact resolution per step (a step moves less than the contact distance)
WALL = 1.0 - AGENT_RADIUS
BLOCK_WALL = 1.0 - BLOCK_RADIUS
REACH_TOLERANCE = 0.1  # agent centre within this of the target centre
PUSH_TOLERANCE = 0.1  # block centre within this of the target centre
DEFAULT_MAX_STEPS = 50
PROGRESS_GAIN = 1.0 / SPEED  # reward per world unit of distance closed: about 1 per full-speed step
SUCCESS_BONUS = 5.0  # on the step that succeeds
# paid every step: stopping short of the goal costs, so a policy that hovers near it (PPO's mean action
# shrinks there while sampling noise still succeeds) is pushed in (measured: deterministic success
# 0.50 -> 0.83 after 30 iterations with the cost and this bonus, against bonus 2 without)
STEP_COST = 0.2
MAX_CAMERAS = 2


@dataclass(frozen=True)
class PlanarOptions:
    distractors: int = 1  # targets of other colours in the scene, 0-3

    def __post_init__(self) -> None:
        if not 0 <= self.distractors <= len(COLORS) - 1:
            raise ConfigError(f"distractors must be in [0, {len(COLORS) - 1}], got {self.distractors}")


def _sample_far(rng: np.random.Generator, low: float, high: float, others: list[np.ndarray],
                min_dist: float) -> np.ndarray:
    """A point in [low, high]^2 at least ``min_dist`` from every point of ``others`` (rejection sampling)."""
    for _ in range(1000):
        p = rng.uniform(low, high, size=2)
        if all(np.linalg.norm(p - o) >= min_dist for o in others):
            return p
    raise RuntimeError(f"could not place a point {min_dist} away from {len(others)} others")


class _PlanarSim:
    """What Reach and Push share: options, agent motion, rendering, observations."""

    task = ""
    base_state_dim = 0

    def __init__(self, env_id: str, options: SimOptions, task_options: PlanarOptions):
        if options.cameras > MAX_CAMERAS:
            raise ConfigError(f"{env_id} has at most {MAX_CAMERAS} cameras (top view, wrist view), "
                              f"got cameras={options.cameras}")
        self.options, self.task_options = options, task_options
        self.spec = SimSpec(
            env_id=env_id, action_dim=2, proprio_dim=4,
            state_dim=self.base_state_dim + 2 * task_options.distractors if options.state else 0,
            max_episode_steps=options.max_episode_steps or DEFAULT_MAX_STEPS,
            image_size=options.image_size if options.rgb else None,
            cameras=options.cameras if options.rgb else 0,
        )
        self.agent = np.zeros(2)
        self.velocity = np.zeros(2)
        self._dist = self._gap = 0.0  # distances at the last step: the reward pays their decrease
        self.targets = np.zeros((1 + task_options.distractors, 2))  # row 0 is the goal
        self.colors: list[str] = []

    def _place_targets(self, rng: np.random.Generator, low: float, high: float, first: np.ndarray,
                       min_dist: float) -> None:
        self.colors = [list(COLORS)[i] for i in rng.permutation(len(COLORS))[: len(self.targets)]]
        self.targets[0] = first
        for i in range(1, len(self.targets)):
            self.targets[i] = _sample_far(rng, low, high, list(self.targets[:i]), min_dist)

    @property
    def goal(self) -> np.ndarray:
        return self.targets[0]

    def _move_agent(self, action: np.ndarray) -> None:
        start = self.agent.copy()
        delta = np.clip(action.astype(np.float64), -1.0, 1.0) * SPEED / SUBSTEPS
        for _ in range(SUBSTEPS):
            self.agent = np.clip(self.agent + delta, -WALL, WALL)
            self._contacts()
        self.velocity = self.agent - start

    def _contacts(self) -> None:
        """Push handles the block here; Reach has nothing to collide with."""

    def _draw_scene(self, canvas: Canvas) -> None:
        for target, color in zip(self.targets, self.colors, strict=True):
            canvas.disc(target, TARGET_RADIUS, COLORS[color])

    def _render(self) -> np.ndarray:
        size = self.options.image_size
        views = [Canvas(size, View((0.0, 0.0), 1.0), BACKGROUND)]
        if self.options.cameras > 1:
            views.append(Canvas(size, View((float(self.agent[0]), float(self.agent[1])), 0.5),
                                BACKGROUND, outside=OUTSIDE))
        for canvas in views:
            self._draw_scene(canvas)
            canvas.disc(self.agent, AGENT_RADIUS, AGENT_COLOR)
        return np.stack([c.image for c in views])

    def _state(self) -> np.ndarray:
        raise NotImplementedError

    def _obs(self) -> SimObs:
        proprio = np.concatenate([self.agent, self.velocity]).astype(np.float32)
        return SimObs(
            instruction=self.instruction(),
            proprio=proprio,
            image=self._render() if self.options.rgb else None,
            state=self._state().astype(np.float32) if self.options.state else None,
        )

    def instruction(self) -> str:
        raise NotImplementedError

    def close(self) -> None:
        pass


class ReachSim(_PlanarSim):
    """Move the agent onto the target of the named colour.

    Reward: ``PROGRESS_GAIN * (d_before - d_after) - STEP_COST`` for the agent-goal distance ``d``,
    plus ``SUCCESS_BONUS`` when the agent's centre gets within ``REACH_TOLERANCE`` (which ends the episode).
    """

    base_state_dim = 6  # agent xy, velocity xy, goal xy; then distractor xy pairs

    def instruction(self) -> str:
        return f"reach the {self.colors[0]} target"

    def reset(self, seed: int) -> SimObs:
        rng = np.random.default_rng(seed)
        first = rng.uniform(-0.8, 0.8, size=2)
        self._place_targets(rng, -0.8, 0.8, first, min_dist=0.45)
        self.agent = _sample_far(rng, -0.85, 0.85, [first], 0.5)
        self.velocity = np.zeros(2)
        self._dist = float(np.linalg.norm(self.agent - self.goal))
        return self._obs()

    def step(self, action: np.ndarray) -> SimStep:
        self._move_agent(action)
        dist = float(np.linalg.norm(self.agent - self.goal))
        success = dist < REACH_TOLERANCE
        reward = PROGRESS_GAIN * (self._dist - dist) + SUCCESS_BONUS * float(success) - STEP_COST
        self._dist = dist
        return SimStep(self._obs(), float(reward), terminated=success, truncated=False, success=success)

    def _state(self) -> np.ndarray:
        return np.concatenate([self.agent, self.velocity, self.targets.ravel()])

    def privileged(self) -> dict[str, np.ndarray]:
        return {"agent": self.agent.copy(), "velocity": self.velocity.copy(), "goal": self.goal.copy(),
                "targets": self.targets.copy()}


class PushSim(_PlanarSim):
    """Push the block onto the target of the named colour.

    Reward: ``PROGRESS_GAIN * (0.5 (gap_before - gap_after) + (d_before - d_after)) - STEP_COST`` for
    the agent-block gap and the block-goal distance ``d``, plus ``SUCCESS_BONUS`` when the block's centre
    gets within ``PUSH_TOLERANCE`` of the goal (which ends the episode).
    """

    base_state_dim = 8  # agent xy, velocity xy, block xy, goal xy; then distractor xy pairs

    def __init__(self, env_id: str, options: SimOptions, task_options: PlanarOptions):
        super().__init__(env_id, options, task_options)
        self.block = np.zeros(2)

    def instruction(self) -> str:
        return f"push the block to the {self.colors[0]} target"

    def reset(self, seed: int) -> SimObs:
        rng = np.random.default_rng(seed)
        self.block = rng.uniform(-0.55, 0.55, size=2)
        goal = self.block
        while not 0.35 <= np.linalg.norm(goal - self.block) <= 0.9:
            goal = rng.uniform(-0.75, 0.75, size=2)
        self._place_targets(rng, -0.8, 0.8, goal, min_dist=0.45)
        self.agent = _sample_far(rng, -0.85, 0.85, [self.block], 0.3)
        self.velocity = np.zeros(2)
        self._dist, self._gap = self._distances()
        return self._obs()

    def _distances(self) -> tuple[float, float]:
        """(block-goal distance, agent-block gap between their rims)."""
        dist = float(np.linalg.norm(self.block - self.goal))
        gap = max(0.0, float(np.linalg.norm(self.agent - self.block)) - AGENT_RADIUS - BLOCK_RADIUS)
        return dist, gap

    def _contacts(self) -> None:
        reach = AGENT_RADIUS + BLOCK_RADIUS
        offset = self.block - self.agent
        dist = float(np.linalg.norm(offset))
        if dist >= reach:
            return
        normal = offset / dist if dist > 1e-9 else np.array([1.0, 0.0])
        self.block = np.clip(self.agent + normal * reach, -BLOCK_WALL, BLOCK_WALL)
        offset = self.block - self.agent
        dist = float(np.linalg.norm(offset))
        if dist < reach - 1e-9:  # the block is against a wall: the agent stops at it
            self.agent = self.block - (offset / dist if dist > 1e-9 else normal) * reach

    def step(self, action: np.ndarray) -> SimStep:
        self._move_agent(action)
        dist, gap = self._distances()
        success = dist < PUSH_TOLERANCE
        progress = 0.5 * (self._gap - gap) + (self._dist - dist)
        reward = PROGRESS_GAIN * progress + SUCCESS_BONUS * float(success) - STEP_COST
        self._dist, self._gap = dist, gap
        return SimStep(self._obs(), float(reward), terminated=success, truncated=False, success=success)

    def _draw_scene(self, canvas: Canvas) -> None:
        super()._draw_scene(canvas)
        canvas.square(self.block, BLOCK_RADIUS, BLOCK_COLOR)

    def _state(self) -> np.ndarray:
        return np.concatenate([self.agent, self.velocity, self.block, self.targets.ravel()])

    def privileged(self) -> dict[str, np.ndarray]:
        return {"agent": self.agent.copy(), "velocity": self.velocity.copy(), "block": self.block.copy(),
                "goal": self.goal.copy(), "targets": self.targets.copy()}
