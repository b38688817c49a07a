"""ManiSkill3 adapter: tabletop Panda tasks that need no asset download, on PhysX CPU, one env.

Choices (documented in the README):

* ``sim_backend="physx_cpu"``, ``num_envs=1`` (physx_cpu refuses more), no GPU needed.
  SAPIEN still needs a Vulkan device, also for state observations: on a
  machine without a GPU that is Mesa's lavapipe (``mesa-vulkan-drivers`` 25
  from bookworm-backports; bookworm's 22.3 is too old). ``render_backend="cpu"``
  renders through it without the "CUDA device was not found" warning.
* Controller ``pd_ee_delta_pos`` by default: 4 numbers in [-1, 1], the end
  effector's xyz displacement (x 0.1 m per step at 1.0, 20 control steps/s)
  and the gripper (1 open, -1 closed). The simplest space for scripted experts
  and for small action heads; another ManiSkill control mode can be chosen
  with the ``control_mode`` option.
* Reward ``normalized_dense`` (ManiSkill's shaped reward scaled to [0, 1]),
  success from ManiSkill's ``evaluate()``, termination on success as ManiSkill
  does, episode limit ``REGISTERED_ENVS[id].max_episode_steps`` (50 for all five).
* Images: the task's sensor camera (``base_camera``) at ``image_size``; with
  ``cameras=2`` the robot is ManiSkill's ``panda_wristcam`` (the same arm with
  a camera on the hand) and its ``hand_camera`` is the second image. With one
  camera the robot is always the plain ``panda`` (StackCube defaults to the
  wrist-camera Panda, whose unused second camera tripled its step time).
  Proprio: the arm's qpos (9), qvel (9) and TCP pose (xyz + wxyz quaternion),
  25 numbers, then the goal position (3) for PickCube and PullCube: PickCube's
  goal marker is hidden from the cameras, so, like ManiSkill's own visual
  observations (``extra.goal_pos``), the goal travels as a number. State:
  ManiSkill's flattened ``state`` observation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from envs.base import SimObs, SimSpec, SimStep, SimulatorError
from envs.options import SimOptions
from infra.errors import ConfigError
from infra.logging import get_logger

__all__ = ["MANISKILL_TASKS", "ManiSkillOptions", "ManiSkillSim", "ManiSkillTask"]

log = get_logger("envs.maniskill")

VULKAN_HINT = ("SAPIEN found no Vulkan device: install Mesa's lavapipe from bookworm-backports "
               "(apt-get install -t bookworm-backports mesa-vulkan-drivers libvulkan1), see the README")


@dataclass(frozen=True)
class ManiSkillTask:
    instruction: str
    actors: dict[str, str]  # name in privileged() -> attribute of the ManiSkill env holding the actor
    goal_in_proprio: bool = False  # ManiSkill's visual observations carry extra.goal_pos for this task


MANISKILL_TASKS: dict[str, ManiSkillTask] = {
    "PushCube-v1": ManiSkillTask("push the cube to the goal region", {"cube": "obj", "goal": "goal_region"}),
    "PickCube-v1": ManiSkillTask("pick up the cube and move it to the goal",
                                 {"cube": "cube", "goal": "goal_site"}, goal_in_proprio=True),
    "StackCube-v1": ManiSkillTask("stack the red cube on the green cube",
                                  {"cube": "cubeA", "base": "cubeB"}),
    "PullCube-v1": ManiSkillTask("pull the cube to the goal region", {"cube": "obj", "goal": "goal_region"},
                                 goal_in_proprio=True),
    "LiftPegUpright-v1": ManiSkillTask("lift the peg and stand it upright", {"peg": "peg"}),
}
CAMERAS = ("base_camera", "hand_camera")
ROBOTS = {1: "panda", 2: "panda_wristcam"}


@dataclass(frozen=True)
class ManiSkillOptions:
    control_mode: str = "pd_ee_delta_pos"
    reward_mode: str = "normalized_dense"


def _numpy(value: Any) -> np.ndarray:
    """A ManiSkill batch of one (torch, on CPU) -> numpy without the batch axis."""
    return np.asarray(value.cpu().numpy() if hasattr(value, "cpu") else value)[0]


class ManiSkillSim:
    def __init__(self, env_id: str, options: SimOptions, task_options: ManiSkillOptions):
        if env_id not in MANISKILL_TASKS:
            raise ConfigError(f"no ManiSkill adapter for {env_id!r}; known: {sorted(MANISKILL_TASKS)}")
        if options.cameras not in ROBOTS:
            raise ConfigError(f"{env_id} has at most 2 cameras ({', '.join(CAMERAS)}), "
                              f"got cameras={options.cameras}")
        self.task, self.options = MANISKILL_TASKS[env_id], options
        self.env = self._make(env_id, task_options)
        probe = self.reset(0)
        self.spec = SimSpec(
            env_id=env_id,
            action_dim=int(np.prod(self.env.action_space.shape)),
            proprio_dim=len(probe.proprio),
            state_dim=len(probe.state) if probe.state is not None else 0,
            max_episode_steps=self._limit,
            image_size=options.image_size if options.rgb else None,
            cameras=options.cameras if options.rgb else 0,
            action_low=float(np.min(self.env.action_space.low)),
            action_high=float(np.max(self.env.action_space.high)),
        )

    def _make(self, env_id: str, task_options: ManiSkillOptions) -> Any:
        import gymnasium as gym
        import mani_skill.envs  # noqa: F401  (registers the tasks)
        from mani_skill.utils.registration import REGISTERED_ENVS

        self._limit = self.options.max_episode_steps or REGISTERED_ENVS[env_id].max_episode_steps
        size = self.options.image_size
        try:
            return gym.make(
                env_id, num_envs=1, sim_backend="physx_cpu", render_backend="cpu",
                robot_uids=ROBOTS[self.options.cameras],
                obs_mode=self.options.obs_mode, control_mode=task_options.control_mode,
                reward_mode=task_options.reward_mode, max_episode_steps=self._limit,
                sensor_configs={"width": size, "height": size},
            )
        except RuntimeError as exc:
            if "rendering device" in str(exc) or "Vulkan" in str(exc):
                raise SimulatorError(f"{env_id}: {VULKAN_HINT} ({exc})") from exc
            raise
        except (AssertionError, NotImplementedError) as exc:  # ManiSkill's way to refuse an argument
            raise ConfigError(f"{env_id}: ManiSkill refused {task_options}: {exc}") from exc

    def _obs(self, raw: Any) -> SimObs:
        env = self.env.unwrapped
        joints = env.agent.get_proprioception()
        parts = [_numpy(joints["qpos"]), _numpy(joints["qvel"]), _numpy(env.agent.tcp.pose.raw_pose)]
        if self.task.goal_in_proprio:
            parts.append(_numpy(getattr(env, self.task.actors["goal"]).pose.p))
        proprio = np.concatenate(parts).astype(np.float32)
        image = state = None
        if self.options.rgb:
            sensors = raw["sensor_data"]
            image = np.stack([_numpy(sensors[name]["rgb"]) for name in CAMERAS[: self.options.cameras]])
            image = image.astype(np.uint8)
        if self.options.state:
            state = _numpy(raw["state"] if isinstance(raw, dict) else raw).astype(np.float32)
        return SimObs(self.task.instruction, proprio, image, state)

    def reset(self, seed: int) -> SimObs:
        raw, _ = self.env.reset(seed=seed)
        return self._obs(raw)

    def step(self, action: np.ndarray) -> SimStep:
        raw, reward, terminated, truncated, info = self.env.step(action[None])
        return SimStep(self._obs(raw), float(_numpy(reward)), bool(_numpy(terminated)),
                       bool(_numpy(truncated)), bool(_numpy(info["success"])))

    def privileged(self) -> dict[str, np.ndarray]:
        """TCP and gripper state, and the task's actors' positions and quaternions (wxyz), in metres."""
        env = self.env.unwrapped
        tcp = _numpy(env.agent.tcp.pose.raw_pose)
        out = {"tcp": tcp[:3], "tcp_q": tcp[3:], "gripper": _numpy(env.agent.robot.get_qpos())[-2:]}
        for name, attr in self.task.actors.items():
            pose = _numpy(getattr(env, attr).pose.raw_pose)
            out[name], out[f"{name}_q"] = pose[:3], pose[3:]
        return out

    def close(self) -> None:
        self.env.close()
