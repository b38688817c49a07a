"""Does this machine have a Vulkan device SAPIEN can use? Asked for real, in a child process.

SAPIEN needs Vulkan for every ManiSkill env (state observations included), and
a missing or too old driver fails in ways that are hard to recover from inside
a process (an exception at best, a crash or a hang at worst). So the check
creates and steps a tiny ManiSkill env in a subprocess with a timeout, once
per process; tests skip on ``False`` and print the reason.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["VulkanStatus", "vulkan_available", "vulkan_status"]

_PROBE = """
import gymnasium as gym
import mani_skill.envs
env = gym.make("PushCube-v1", num_envs=1, sim_backend="physx_cpu", render_backend="cpu", obs_mode="rgb",
               sensor_configs={"width": 16, "height": 16})
obs, _ = env.reset(seed=0)
env.step(env.action_space.sample())
env.close()
print("vulkan-ok")
"""


@dataclass(frozen=True)
class VulkanStatus:
    available: bool
    reason: str  # why not (the child's last lines of output), or what answered


@functools.cache
def vulkan_status(timeout_s: float = 180.0) -> VulkanStatus:
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return VulkanStatus(False, f"creating a ManiSkill env took more than {timeout_s:.0f} s")
    except OSError as exc:
        return VulkanStatus(False, f"could not start the probe: {exc}")
    if done.returncode == 0 and "vulkan-ok" in done.stdout:
        return VulkanStatus(True, "SAPIEN created, rendered and stepped a ManiSkill env")
    tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
    return VulkanStatus(False, f"no usable Vulkan device for SAPIEN (exit {done.returncode}): {tail}")


def vulkan_available() -> bool:
    return vulkan_status().available
