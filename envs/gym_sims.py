"""Gymnasium adapters: classic control (``Pendulum-v1``) and MuJoCo (``Reacher-v5``, ``Pusher-v5``).

Each task maps gym's flat observation to proprio (the robot's own joint
state) and state (gym's whole vector), adds a fixed English instruction, and
defines success (gym has none; thresholds below). Images come from gym's own
renderer: MuJoCo renders at the requested size through ``MUJOCO_GL`` (``egl``
by default here; ``osmesa`` works too, both need Mesa: see the README) with
shadows and reflections off (Pusher at 64 px on llvmpipe: 40 ms -> 8 ms per
frame, mean pixel difference 0.08/255); the Pendulum's pygame drawing is made
at the requested size (gym's ``screen_dim``) instead of 500 px. Reacher is
seen from straight above, Pusher from above the table: gym's default cameras
leave the arm and target a few pixels wide at 64 px.

An OpenGL context is bound to the thread that made it: with EGL a render from
another thread silently returns a black image (measured). The env role may
call a simulator from any worker thread, so every call into a gym env runs on
one thread the adapter owns.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from envs.base import SimObs, SimSpec, SimStep
from envs.options import SimOptions
from infra.errors import ConfigError

__all__ = ["GYM_TASKS", "GymSim", "GymTask"]

os.environ.setdefault("MUJOCO_GL", "egl")  # read when mujoco is first imported
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")


@dataclass(frozen=True)
class GymTask:
    instruction: str
    proprio: Callable[[np.ndarray], np.ndarray]  # gym obs -> proprio
    success: Callable[[np.ndarray], bool]  # gym obs -> success
    mujoco: bool  # renders through MuJoCo at the requested size (else: gym's pygame drawing)
    camera: dict[str, Any] | None = None  # MuJoCo default_camera_config: what a 64 px image must show


def _pendulum_upright(obs: np.ndarray) -> bool:
    cos, sin, velocity = obs
    return bool(abs(np.arctan2(sin, cos)) < 0.1 and abs(velocity) < 0.5)


GYM_TASKS: dict[str, GymTask] = {
    # obs: cos(theta), sin(theta), theta_dot; success: within 0.1 rad of upright, slower than 0.5 rad/s
    "Pendulum-v1": GymTask("swing the pendulum up and balance it upright", lambda o: o,
                           _pendulum_upright, mujoco=False),
    # obs: cos q (2), sin q (2), target xy, q_dot (2), fingertip - target xy; success: within 2 cm
    "Reacher-v5": GymTask("move the fingertip to the target",
                          lambda o: np.concatenate([o[0:4], o[6:8]]),
                          lambda o: bool(np.linalg.norm(o[8:10]) < 0.02), mujoco=True,
                          camera={"trackbodyid": 0, "distance": 0.8, "elevation": -90.0, "azimuth": 90.0}),
    # obs: q (7), q_dot (7), tip xyz, object xyz, goal xyz; success: object within 5 cm of the goal (xy)
    "Pusher-v5": GymTask("push the object to the goal", lambda o: o[0:17],
                         lambda o: bool(np.linalg.norm(o[17:19] - o[20:22]) < 0.05), mujoco=True,
                         camera={"trackbodyid": -1, "distance": 2.0, "elevation": -75.0, "azimuth": 90.0,
                                 "lookat": np.array([0.2, -0.25, -0.3])}),
}


class GymSim:
    """One gymnasium env behind the ``Simulator`` protocol; ``cameras`` must be 1."""

    def __init__(self, env_id: str, options: SimOptions):
        if env_id not in GYM_TASKS:
            raise ConfigError(f"no gymnasium adapter for {env_id!r}; known: {sorted(GYM_TASKS)}")
        if options.cameras != 1:
            raise ConfigError(f"{env_id} has one camera, got cameras={options.cameras}")
        self.task, self.options = GYM_TASKS[env_id], options
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"sim-{env_id}")
        self.env = self._call(self._make, env_id)
        probe, _ = self._call(self.env.reset, seed=0)
        self.spec = SimSpec(
            env_id=env_id,
            action_dim=int(self.env.action_space.shape[0]),
            proprio_dim=len(self.task.proprio(probe)),
            state_dim=len(probe) if options.state else 0,
            max_episode_steps=self._limit,
            image_size=options.image_size if options.rgb else None,
            cameras=1 if options.rgb else 0,
            action_low=float(self.env.action_space.low.min()),
            action_high=float(self.env.action_space.high.max()),
        )

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._thread.submit(fn, *args, **kwargs).result()

    def _make(self, env_id: str) -> Any:
        import gymnasium as gym

        self._limit = self.options.max_episode_steps or gym.spec(env_id).max_episode_steps
        kwargs: dict[str, Any] = {"max_episode_steps": self._limit}
        if self.options.rgb:
            kwargs["render_mode"] = "rgb_array"
            if self.task.mujoco:
                kwargs.update(width=self.options.image_size, height=self.options.image_size,
                              default_camera_config=self.task.camera)
        env = gym.make(env_id, **kwargs)
        if self.options.rgb and self.task.mujoco:
            import mujoco

            viewer = env.unwrapped.mujoco_renderer._get_viewer("rgb_array")  # made here, on our thread
            viewer.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
            viewer.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        elif self.options.rgb:
            env.unwrapped.screen_dim = self.options.image_size
        return env

    def _obs(self, raw: np.ndarray) -> SimObs:
        raw = np.asarray(raw, dtype=np.float32)
        image = self._render() if self.options.rgb else None
        return SimObs(self.task.instruction, self.task.proprio(raw).astype(np.float32), image,
                      raw.copy() if self.options.state else None)

    def _render(self) -> np.ndarray:
        frame = np.asarray(self.env.render(), dtype=np.uint8)
        size = self.options.image_size
        if frame.shape[:2] != (size, size):
            from PIL import Image

            frame = np.asarray(Image.fromarray(frame).resize((size, size), Image.Resampling.BILINEAR))
        return np.ascontiguousarray(frame[None])

    def reset(self, seed: int) -> SimObs:
        return self._call(self._reset, seed)

    def _reset(self, seed: int) -> SimObs:
        raw, _ = self.env.reset(seed=seed)
        return self._obs(raw)

    def step(self, action: np.ndarray) -> SimStep:
        return self._call(self._step, action)

    def _step(self, action: np.ndarray) -> SimStep:
        raw, reward, terminated, truncated, _ = self.env.step(action)
        obs = self._obs(raw)
        return SimStep(obs, float(reward), bool(terminated), bool(truncated), self.task.success(raw))

    def privileged(self) -> dict[str, np.ndarray]:
        return {"obs": np.asarray(self._call(lambda: self.env.unwrapped._get_obs()), dtype=np.float64)}

    def close(self) -> None:
        try:
            self._call(self.env.close)
        finally:
            self._thread.shutdown(wait=True)
