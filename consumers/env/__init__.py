"""The env role: simulator sessions of every tenant, on the bus (``joynexus run env``).

The simulators are ``envs/`` (pure compute, no Kafka); ``session.py`` runs one
session's episodes; ``worker.py`` is the consumer group that hosts sessions.
"""

from __future__ import annotations

__all__ = ["simulator_for"]


def simulator_for(spec, isolation: str = "auto"):
    """Build the simulator an EnvSessionRequested asks for, isolated as ``env_isolation`` says
    (``envs.open_simulator``: auto puts ManiSkill in a child process, the rest in this one)."""
    from envs import open_simulator

    return open_simulator(spec.env_id, isolation, obs_mode=spec.obs_mode, image_size=spec.image_size,
                          cameras=spec.cameras, max_episode_steps=spec.max_episode_steps)
