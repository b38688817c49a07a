"""The env role: simulator sessions of every tenant, on the bus (``joynexus run env``).

The simulators are ``envs/`` (pure compute, no Kafka); ``session.py`` runs one
session's episodes; ``worker.py`` is the consumer group that hosts sessions.
"""

from __future__ import annotations

__all__ = ["simulator_for"]


def simulator_for(spec, isolation: str = "thread"):
    """Build the simulator an EnvSessionRequested asks for.

    ``isolation="process"`` (setting ``env_isolation``) runs it in a child process, so a
    segfault or a hang in native code costs that process only; ``"thread"`` runs it in
    this process (faster; a hung native call can only be abandoned, not stopped).
    """
    from envs import make_simulator
    from envs.isolated import IsolatedSimulator

    kwargs = dict(obs_mode=spec.obs_mode, image_size=spec.image_size, cameras=spec.cameras,
                  max_episode_steps=spec.max_episode_steps)
    if isolation == "process":
        return IsolatedSimulator(spec.env_id, **kwargs)
    return make_simulator(spec.env_id, **kwargs)
