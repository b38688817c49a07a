"""Simulators behind one interface (``base.Simulator``): pure compute, no Kafka. The env role
(``consumers/env``) hosts them as sessions on the bus; the dataset generator records their experts.

``make_simulator(env_id, obs_mode=..., image_size=..., max_episode_steps=..., cameras=...)``
returns a ready simulator wrapped in ``GuardedSimulator`` (the contract: checked
actions and observations, episode limit, errors as ``SimulatorError``);
``make_expert(env_id)`` its scripted expert. Families:

* builtin (pure numpy, milliseconds): ``joynexus/Reach-v0``, ``joynexus/Push-v0``
* test: ``joynexus/Faulty-v0`` (injects raise / hang / NaN / process exit; see ``faulty``)
* gymnasium: ``Pendulum-v1``, ``Reacher-v5``, ``Pusher-v5`` (MuJoCo renders through ``MUJOCO_GL``)
* maniskill: ``PushCube-v1``, ``PickCube-v1``, ``StackCube-v1``, ``PullCube-v1``,
  ``LiftPegUpright-v1`` (PhysX CPU; SAPIEN needs a Vulkan device: ``vulkan_available()``)

``IsolatedSimulator`` runs any of them in a child process, so a crash or a hang
costs only that process; ``open_simulator(env_id, isolation="auto")`` picks it for ManiSkill.
"""

from envs.base import (
    OBS_MODES,
    Expert,
    InvalidAction,
    SimObs,
    SimSpec,
    SimStep,
    Simulator,
    SimulatorError,
)
from envs.guard import GuardedSimulator
from envs.isolated import IsolatedSimulator
from envs.registry import ENVS, env_ids, family_of, make_expert, make_simulator, open_simulator
from envs.vulkan import vulkan_available, vulkan_status

__all__ = [
    "ENVS",
    "OBS_MODES",
    "Expert",
    "GuardedSimulator",
    "InvalidAction",
    "IsolatedSimulator",
    "SimObs",
    "SimSpec",
    "SimStep",
    "Simulator",
    "SimulatorError",
    "env_ids",
    "family_of",
    "make_expert",
    "make_simulator",
    "open_simulator",
    "vulkan_available",
    "vulkan_status",
]
