"""One supervisor, many roles, one process, one log stream (``joynexus up`` / ``joynexus run ROLE``).

Every role shares the process's ``Service`` (the resident backbone, its
device gate, the policy store, the job book). A role whose run loop dies is
logged, stopped and built again in place after a back-off; the others keep
going. Roles are stateless apart from the log (their consumer groups'
committed offsets and their topics), so a rebuilt role resumes where the
log says.
"""

from __future__ import annotations

import asyncio
import functools
import signal
from collections.abc import Callable
from typing import Any

from infra.logging import get_logger
from infra.settings import Settings

__all__ = ["ROLES", "Supervisor", "run_roles"]

log = get_logger("infra.runtime.supervisor")

ROLES = ("master", "env", "inference", "backbone-train", "optimizer", "rollout", "evaluator")


def _factory(name: str) -> Callable[[Any], Any]:
    """The constructor of a role, imported on use (a process runs only what it hosts)."""
    if name == "master":
        from consumers.master.role import Master
        return Master
    if name == "inference":
        from consumers.inference import InferenceRole
        return InferenceRole
    if name == "backbone-train":
        from consumers.backbone_train import BackboneTrainRole
        return BackboneTrainRole
    if name == "optimizer":
        from consumers.optimizer import OptimizerHost
        return OptimizerHost
    if name == "rollout":
        from consumers.rollout import RolloutRole
        return RolloutRole
    if name == "evaluator":
        from consumers.evaluator import EvaluatorRole
        return EvaluatorRole
    if name == "env":
        from consumers.env import simulator_for
        from consumers.env.worker import EnvWorker

        def env(service):
            make = functools.partial(simulator_for, isolation=service.settings.env_isolation)
            return EnvWorker(service.settings, make)
        return env
    raise ValueError(f"unknown role {name!r}; roles: {', '.join(ROLES)}")


class Supervisor:
    def __init__(self, service, names: tuple[str, ...] = ROLES, restart_backoff_s: float = 2.0):
        unknown = [n for n in names if n not in ROLES]
        if unknown:
            raise ValueError(f"unknown role(s) {unknown}; roles: {', '.join(ROLES)}")
        self.service = service
        self.names = names
        self.restart_backoff_s = restart_backoff_s
        self.roles: dict[str, Any] = {}
        self.restarts: dict[str, int] = {n: 0 for n in names}
        self._tasks: dict[str, asyncio.Task] = {}
        self.stop_event = asyncio.Event()

    async def start(self) -> None:
        for name in self.names:
            await self._start(name)
        log.info("roles started", roles=list(self.names), backbone=self.service.backbone.backbone_id)

    async def _start(self, name: str) -> None:
        role = _factory(name)(self.service)
        await role.start()
        self.roles[name] = role
        self._tasks[name] = asyncio.create_task(self._run(name, role), name=f"role-{name}")

    async def _run(self, name: str, role: Any) -> None:
        while True:
            try:
                await role.run(self.stop_event)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.restarts[name] += 1
                log.exception("role crashed; restarting in place", role=name, restarts=self.restarts[name],
                              error_class=type(exc).__name__)
            try:
                await role.stop()
            except Exception as exc:  # a crashed role may not stop cleanly
                log.warning("stopping the crashed role failed", role=name, error=str(exc)[:200])
            await asyncio.sleep(self.restart_backoff_s)
            if self.stop_event.is_set():
                return
            role = _factory(name)(self.service)
            await role.start()
            self.roles[name] = role

    async def stop(self) -> None:
        self.stop_event.set()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        for name, role in reversed(list(self.roles.items())):
            try:
                await role.stop()
            except Exception as exc:
                log.warning("role did not stop cleanly", role=name, error=str(exc)[:200])

    async def __aenter__(self) -> Supervisor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def run_roles(settings: Settings, names: tuple[str, ...] = ROLES) -> None:
    """Run roles in this process until SIGINT/SIGTERM."""
    from consumers.service import Service
    from infra.topics import TopicAdmin

    async with TopicAdmin(settings) as admin:
        await admin.ensure_shared()
    service = await Service.open(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    supervisor = Supervisor(service, names)
    await supervisor.start()
    try:
        await stop.wait()
    finally:
        await supervisor.stop()
        await service.close()
