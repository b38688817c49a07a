"""The env role: simulator sessions of every tenant, on the bus (``joynexus run env``).

The simulators are ``envs/`` (pure compute, no Kafka); ``session.py`` runs one
session's episodes; ``worker.py`` is the consumer group that hosts sessions.
"""

from __future__ import annotations

import asyncio
import functools
import signal

from infra.logging import get_logger
from infra.settings import Settings

__all__ = ["run_env_role", "simulator_for"]

log = get_logger("consumers.env")


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


async def run_env_role(settings: Settings, worker_id: str | None = None, step_timeout_s: float = 30.0,
                       group_id: str = "env", tenants: str = r"[^.]+") -> None:
    """Run one env worker until SIGINT/SIGTERM."""
    from consumers.env.worker import EnvWorker

    make = functools.partial(simulator_for, isolation=settings.env_isolation)
    worker = EnvWorker(settings, make, worker_id=worker_id, step_timeout_s=step_timeout_s,
                       group_id=group_id, tenants=tenants)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await worker.start()
    log.info("env worker running", worker=worker.worker_id, bootstrap=settings.bootstrap)
    try:
        await worker.run(stop)
    finally:
        await worker.stop()
