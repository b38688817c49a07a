"""One process and the roles it hosts: what ``joynexus run KIND --instance ID`` runs.

A process kind names the roles that share one process (``KINDS``): the device
host runs inference and backbone-train over ONE resident backbone and its
device gate (the paper's two queues on one device); every other role runs
alone in its own process. ``joynexus up`` (``supervisor.py``) starts one
process per instance and restarts it when it dies or is judged dead or hung.

Inside a process, ``RoleHost`` starts the roles, runs each in its own task,
sends one heartbeat per role every ``heartbeat_s`` (partitions, lag, work
held, last progress: from the role's ``workload()``), and rebuilds a role
whose run loop raised, after a back-off. Roles keep no state outside the log
(committed offsets, topics, the policy store), so a rebuilt role, or a
restarted process, resumes where the log says.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import os
import signal
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import structlog

from consumers.bus.protocols import Role
from infra.errors import JoynexusError
from infra.logging import get_logger
from infra.runtime import gc_policy
from infra.settings import Settings
from producers.heartbeat import HealthSample, Heartbeater
from producers.producer import EventProducer

__all__ = ["KINDS", "ROLES", "SERVICE_ROLES", "RoleHost", "build_role", "die_with_parent", "run_instance"]

log = get_logger("infra.runtime.host")

#: The roles of the service (what a test or the in-process mode hosts together).
SERVICE_ROLES = ("master", "env", "inference", "backbone-train", "optimizer", "rollout", "evaluator")
ROLES = (*SERVICE_ROLES, "health")
#: Process kinds and the roles each hosts. A role's own name is a kind too (``run inference``).
KINDS: Mapping[str, tuple[str, ...]] = {
    "device": ("inference", "backbone-train"),
    **{role: (role,) for role in ROLES},
}
_NEEDS_BACKBONE = {"inference", "backbone-train", "evaluator"}
_NEEDS_SERVICE = {"master", "inference", "backbone-train", "optimizer", "rollout", "evaluator"}


def build_role(name: str, settings: Settings, service: Any, instance: str, **env_options: Any) -> Role:
    """A new role object (imported on use: a process imports only what it hosts)."""
    if name == "master":
        from consumers.master.role import Master
        return Master(service, instance)
    if name == "inference":
        from consumers.inference import InferenceRole
        return InferenceRole(service, instance)
    if name == "backbone-train":
        from consumers.backbone_train import BackboneTrainRole
        return BackboneTrainRole(service, instance)
    if name == "optimizer":
        from consumers.optimizer import OptimizerHost
        return OptimizerHost(service)
    if name == "rollout":
        from consumers.rollout import RolloutRole
        return RolloutRole(service, instance)
    if name == "evaluator":
        from consumers.evaluator import EvaluatorRole
        return EvaluatorRole(service, instance)
    if name == "health":
        from consumers.health import HealthRole
        return HealthRole(settings, instance)
    if name == "env":
        from consumers.env import simulator_for
        from consumers.env.worker import EnvWorker

        make = functools.partial(simulator_for, isolation=settings.env_isolation)
        return EnvWorker(settings, make, worker_id=instance, **env_options)
    raise JoynexusError(f"unknown role {name!r}; roles: {', '.join(ROLES)}")


class _Sampler:
    """Turns a role's ``workload()`` into a heartbeat sample: partitions and lag from its
    consumers, and the time its ``done`` count last moved (its progress). A sample takes at most
    ``budget_s``: partitions not positioned by then are listed without their lag."""

    def __init__(self, role: Role, gc_clock: gc_policy.GcClock | None = None, budget_s: float = 1.0):
        self.role = role
        self.gc_clock = gc_clock
        self.budget_s = budget_s
        self.done: int | None = None
        self.progress_at: datetime | None = None

    async def __call__(self) -> HealthSample:
        work = self.role.workload()
        if work.done != self.done:
            if self.done is not None:
                self.progress_at = datetime.now(UTC)
            self.done = work.done
        partitions, lag, known = [], 0, False
        # One deadline for the whole sample, not one per partition: after a rebalance every partition
        # may wait to be positioned, and many such waits overran the heartbeat's own timeout (measured:
        # 2 env-worker samples lost per benchmark run).
        clock = asyncio.get_running_loop().time
        deadline = clock() + self.budget_s
        for consumer in work.consumers:
            for tp in tuple(consumer.assignment()):
                left = min(0.5, deadline - clock())
                try:
                    position = await asyncio.wait_for(consumer.position(tp), left) if left > 0 else None
                except Exception:  # not positioned yet (joining, rewinding): count what is known
                    position = None
                # A rebalance during an await of this loop (a tenant's topics created or deleted)
                # may have revoked tp: no longer this role's work, and aiokafka asserts on it.
                if tp not in consumer.assignment():
                    continue
                partitions.append(f"{tp.topic}:{tp.partition}")
                if position is None:
                    continue
                end = consumer.last_stable_offset(tp)
                end = consumer.highwater(tp) if end is None else end
                if end is not None:
                    # A transaction's commit marker occupies the offset after its last record, and the
                    # position can rest just before it: one offset past the position is not work
                    # (measured: an idle backbone-train showed lag 1 per partition and was judged HUNG).
                    lag, known = lag + max(0, end - position - 1), True
        details = dict(work.details)
        if self.gc_clock is not None:
            details["gc_s"] = round(self.gc_clock.seconds, 3)
        return HealthSample(tuple(sorted(partitions)), lag if known or not partitions else -1,
                            work.waiting, self.progress_at, details)


class RoleHost:
    """Roles of one process: started together, each run in its own task and heartbeating; a role
    whose run loop raises is stopped and rebuilt in place after ``restart_backoff_s``."""

    def __init__(self, settings: Settings, names: tuple[str, ...] = SERVICE_ROLES, *, service: Any = None,
                 instance: str = "0", restarts: int = 0, roles: Mapping[str, Role] | None = None,
                 env_options: Mapping[str, Any] | None = None, gc_clock: gc_policy.GcClock | None = None):
        """``gc_clock``: this process's collector time, put in every heartbeat's details (``gc_s``)."""
        unknown = [n for n in names if n not in ROLES]
        if unknown:
            raise JoynexusError(f"unknown role(s) {unknown}; roles: {', '.join(ROLES)}")
        self.settings = settings
        self.service = service
        self.names = tuple(roles) if roles else names
        self.instance = instance
        self.process_restarts = restarts
        self.env_options = dict(env_options or {})
        self.gc_clock = gc_clock
        self.roles: dict[str, Role] = dict(roles or {})
        self.restarts: dict[str, int] = {n: 0 for n in self.names}
        self.producer = EventProducer(settings, client_id=f"health-{instance}")
        self.stop_event = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    def _build(self, name: str) -> Role:
        return build_role(name, self.settings, self.service, self.instance, **self.env_options)

    async def start(self) -> None:
        await self.producer.start()
        for name in self.names:
            role = self.roles.get(name) or self._build(name)
            await role.start()
            self.roles[name] = role
            self._tasks.append(asyncio.create_task(self._run(name), name=f"role-{name}"))
        log.info("roles started", roles=list(self.names), instance=self.instance)

    async def _run(self, name: str) -> None:
        beat = asyncio.create_task(self._beat(name), name=f"heartbeat-{name}")
        try:
            while not self.stop_event.is_set():
                role = self.roles[name]
                try:
                    await role.run(self.stop_event)
                    return
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self.restarts[name] += 1
                    log.exception("role crashed; restarting in place", role=name,
                                  restarts=self.restarts[name], error_class=type(exc).__name__)
                try:
                    await role.stop()
                except Exception as exc:  # a crashed role may not stop cleanly
                    log.warning("stopping the crashed role failed", role=name, error=str(exc)[:200])
                await asyncio.sleep(self.settings.restart_backoff_s)
                if not self.stop_event.is_set():
                    self.roles[name] = self._build(name)
                    await self.roles[name].start()
        finally:
            await beat

    async def _beat(self, name: str) -> None:
        sample = _Sampler(self.roles[name], self.gc_clock, budget_s=self.settings.heartbeat_s / 2)

        async def current() -> HealthSample:
            sample.role = self.roles[name]  # a rebuilt role keeps the same heartbeat stream
            return await sample()

        await Heartbeater(self.settings, self.producer, name, self.instance, sample=current,
                          restarts=self.process_restarts).run(self.stop_event)

    async def stop(self) -> None:
        self.stop_event.set()
        # a role stuck in an await does not see the event: cancel what has not returned in time
        late = set()
        if self._tasks:
            _, late = await asyncio.wait(self._tasks, timeout=self.settings.stop_grace_s / 2)
        for task in late:
            log.warning("role did not stop in time; cancelling it", task=task.get_name())
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for name, role in reversed(list(self.roles.items())):
            try:
                await role.stop()
            except Exception as exc:
                log.warning("role did not stop cleanly", role=name, error=str(exc)[:200])
        await self.producer.stop()

    async def __aenter__(self) -> RoleHost:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def ensure_shared_topics(settings: Settings) -> None:
    """Every process creates the shared topics it may produce to (idempotent, safe when many
    processes start at once), waiting for the broker while it is still coming up."""
    from infra.topics import TopicAdmin

    deadline = time.monotonic() + settings.broker_start_timeout_s
    while True:
        try:
            async with TopicAdmin(settings) as admin:
                await admin.ensure_shared()
            return
        except Exception as exc:
            if time.monotonic() > deadline:
                raise JoynexusError(f"cannot reach the broker at {settings.bootstrap}: {exc}") from exc
            log.warning("broker not ready; retrying", error_class=type(exc).__name__)
            await asyncio.sleep(1.0)


def die_with_parent(parent_pid: int) -> None:
    """SIGTERM this process when its supervisor dies, however it dies (Linux PR_SET_PDEATHSIG), so a
    killed supervisor leaves no orphaned role processes; exit now if it is already gone."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        raise SystemExit(f"the supervisor (pid {parent_pid}) is gone")


async def run_instance(settings: Settings, kind: str, instance: str, restarts: int = 0,
                       env_options: Mapping[str, Any] | None = None, parent_pid: int | None = None) -> None:
    """Run one process kind until SIGINT/SIGTERM (or its supervisor's death, given ``parent_pid``)."""
    if parent_pid is not None:
        die_with_parent(parent_pid)
    if kind not in KINDS:
        raise JoynexusError(f"unknown process kind {kind!r}; kinds: {', '.join(KINDS)}")
    names = KINDS[kind]
    structlog.contextvars.bind_contextvars(process=kind, instance=instance)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await ensure_shared_topics(settings)
    service = None
    if set(names) & _NEEDS_SERVICE:
        from consumers.service import Service  # torch and transformers: only where needed

        service = await Service.open(settings, load=bool(set(names) & _NEEDS_BACKBONE))
    host = RoleHost(settings, names, service=service, instance=instance, restarts=restarts,
                    env_options=env_options, gc_clock=gc_policy.GcClock().start())
    try:
        await host.start()
        gc_policy.tune()
        log.info("instance running", kind=kind, instance=instance, restarts=restarts)
        await stop.wait()
    finally:
        await host.stop()
        if service is not None:
            await service.close()
