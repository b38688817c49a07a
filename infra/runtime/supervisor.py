"""``joynexus up``: one OS process per role instance on this machine, kept alive and scaled.

Per machine, one supervisor starts ``joynexus run KIND --instance ID`` for every
instance it is asked for (``host.KINDS``: the device host with inference and
backbone-train, then master, rollout, evaluator, optimizer, env, health; counts
from ``scale``), each in its own session with its log in
``JOYNEXUS_HOME/logs/<instance>.log``, and the parent's settings in its
environment. Instance ids are ``<kind>-<n>.<host>``, unique across machines.

It restarts an instance in place (same id, new pid):

* when its process exits, at once seen by ``wait()``;
* when the health role judges it DEAD (heartbeats stopped: killed, crashed,
  SIGSTOPped) or HUNG (no progress while work waits): the supervisor reads the
  ``InstanceVerdict`` on ``nexus.health``, SIGKILLs the process group, and the
  exit path restarts it.

Back-off: the first death after a stable run restarts at once; each further
consecutive quick death (one that ran less than ``stable_after_s``) waits
``restart_backoff_s`` doubled, up to ``restart_backoff_max_s``. Every start
is an ``InstanceRestarted`` event with its cause.

Env workers are elastic: every few seconds the supervisor asks
``scaling.env_target`` how many this machine should run, from what its env
workers report, starts new ones at once and retires one (SIGTERM: its sessions
are handed back through a rebalance and resume elsewhere at their first
uncommitted episode) when the target stayed lower for ``env_scale_down_after_s``.

CPU affinity (``settings.cpu_affinity``, ``up --cpus device=0,rest=1``): every child pins
itself to its kind's CPUs at start (``affinity.py``), restarts included; the supervisor only
checks the plan names known kinds and CPUs of this machine.

``stop`` (Ctrl-C, SIGTERM) sends SIGTERM to every process group and SIGKILL
to what is still there after ``stop_grace_s``; a supervisor killed outright
takes its children with it (each asks for SIGTERM when its parent dies:
``host.die_with_parent``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from infra.errors import JoynexusError
from infra.healthbook import HealthView
from infra.logging import get_logger
from infra.runtime.affinity import REST, cpus_for
from infra.runtime.host import KINDS, ensure_shared_topics
from infra.runtime.scaling import env_target
from infra.settings import Settings
from infra.topics import shared_topic
from producers.producer import EventProducer
from schemas import events as ev

__all__ = ["DEFAULT_KINDS", "METERING", "SUPERVISED_KINDS", "Instance", "ProcessSupervisor", "parse_cpus",
           "parse_scale", "run_up"]

log = get_logger("infra.runtime.supervisor")

#: The metering role is a faust app with a worker of its own (``joynexus metering``): supervised
#: like the others (restarted when it exits), but it sends no heartbeats, so no verdict covers it.
METERING = "metering"
SUPERVISED_KINDS = (*KINDS, METERING)
#: What ``joynexus up`` runs on one machine by default.
DEFAULT_KINDS = ("device", "master", "env", "optimizer", "rollout", "evaluator", "health", METERING)
_SCALE_EVERY_S = 2.0


@dataclass
class Instance:
    kind: str
    index: int
    instance_id: str
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    started_at: float = 0.0
    quick_deaths: int = 0
    kill_cause: str | None = None  # set when we killed it, so its exit is explained
    retiring: bool = False  # scaled down: its exit is expected

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None


def parse_scale(text: str) -> dict[str, int]:
    """``env=3,optimizer=2`` -> {"env": 3, "optimizer": 2}."""
    scale: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, count = part.partition("=")
        if kind not in SUPERVISED_KINDS or not count.isdigit():
            raise JoynexusError(f"bad --scale entry {part!r}: want KIND=N, KIND one of "
                                f"{', '.join(SUPERVISED_KINDS)}")
        scale[kind] = int(count)
    return scale


def _cpu_list(text: str) -> list[int]:
    """``1``, ``1-3``, ``0+2`` -> CPU ids (``,`` already separates the entries of ``--cpus``)."""
    cpus: list[int] = []
    for part in text.split("+"):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not (hi.isdigit() and int(hi) >= int(lo))):
            raise ValueError(part)
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def parse_cpus(text: str, here: bool = True) -> dict[str, list[int]]:
    """``device=0,rest=1-3`` -> {"device": [0], "rest": [1, 2, 3]} (``settings.cpu_affinity``).
    ``here=False``: a plan for another machine (a model's), not checked against this one's CPUs."""
    affinity: dict[str, list[int]] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, cpus = part.partition("=")
        try:
            affinity[kind.strip()] = _cpu_list(cpus.strip())
        except ValueError:
            raise JoynexusError(f"bad --cpus entry {part!r}: want KIND=CPUS, CPUS like 1, 1-3 or 0+2"
                                ) from None
    _check_affinity(affinity, here)
    return affinity


def _check_affinity(affinity: dict[str, list[int]], here: bool = True) -> None:
    """Refuses a plan that names an unknown kind or a CPU this machine does not have (a child
    would otherwise fail at start and be restarted in a loop)."""
    # also here, not only in Settings: settings.model_copy(update=...) skips its validators
    unknown = [k for k in affinity if k not in (*SUPERVISED_KINDS, REST) or not affinity[k]]
    if unknown:
        raise JoynexusError(f"cpu affinity for unknown kind(s) or without CPUs: {unknown}; kinds: "
                            f"{', '.join(SUPERVISED_KINDS)}, or {REST} for the others")
    cpus = os.cpu_count() or 1
    missing = sorted({c for ids in affinity.values() for c in ids if c >= cpus})
    if missing and here:
        raise JoynexusError(f"cpu affinity names CPU(s) {missing}; this machine has 0-{cpus - 1}")


def _exit_cause(code: int) -> str:
    if code < 0:
        return f"exited: killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


class ProcessSupervisor:
    def __init__(self, settings: Settings, kinds: Sequence[str] = DEFAULT_KINDS,
                 scale: Mapping[str, int] | None = None, *, autoscale: bool = True):
        unknown = [k for k in kinds if k not in SUPERVISED_KINDS]
        if unknown:
            raise JoynexusError(f"unknown process kind(s) {unknown}; kinds: {', '.join(SUPERVISED_KINDS)}")
        _check_affinity(settings.cpu_affinity)
        self.settings = settings
        self.kinds = tuple(kinds)
        self.scale = dict(scale or {})
        self.autoscale = autoscale and "env" in self.kinds
        self.host = socket.gethostname()
        self.log_dir = settings.home / "logs"
        self.instances: list[Instance] = []
        self.view = HealthView(settings, lookback_s=5.0, name="supervisor", on_event=self._on_event)
        self.producer = EventProducer(settings, client_id=f"supervisor-{self.host}")
        self.stopping = False
        self._tasks: set[asyncio.Task] = set()
        self._env = {**os.environ, **settings.as_env()}
        self._low_since: float | None = None

    # ------------------------------------------------------------------ life cycle
    def count(self, kind: str) -> int:
        return self.scale.get(kind, max(self.settings.env_min, 1) if kind == "env" else 1)

    async def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        await ensure_shared_topics(self.settings)
        await self.producer.start()
        await self.view.start()
        for kind in self.kinds:
            for _ in range(self.count(kind)):
                await self._spawn(self._new_instance(kind), "start")
        if self.autoscale:
            self._task(self._scale_loop(), "env-autoscale")
        log.info("supervisor running", host=self.host, instances=[i.instance_id for i in self.instances],
                 logs=str(self.log_dir),
                 cpus={k: cpus_for(self.settings.cpu_affinity, k) for k in self.kinds}
                 if self.settings.cpu_affinity else None)

    async def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM to every process, SIGKILL to what is left after ``grace_s`` (default
        ``stop_grace_s``; a user who pressed Ctrl-C on the demo gets a shorter one)."""
        self.stopping = True
        for task in list(self._tasks):
            if task.get_name() == "env-autoscale":
                task.cancel()
        live = [i for i in self.instances if i.alive]
        for inst in live:
            self._signal(inst, signal.SIGTERM)
        deadline = time.monotonic() + (self.settings.stop_grace_s if grace_s is None else grace_s)
        for inst in live:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(inst.process.wait(), max(0.1, deadline - time.monotonic()))
            if inst.alive:
                log.warning("instance ignored SIGTERM; killing", instance=inst.instance_id, pid=inst.pid)
                self._signal(inst, signal.SIGKILL)
                await inst.process.wait()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.view.stop()
        await self.producer.stop()

    async def __aenter__(self) -> ProcessSupervisor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def of_kind(self, kind: str) -> list[Instance]:
        return [i for i in self.instances if i.kind == kind and not i.retiring]

    async def wait_healthy(self, timeout_s: float = 600.0) -> None:
        """Until every instance heartbeats HEALTHY from its current process (metering, a faust
        worker, sends no heartbeats), e.g. before a benchmark submits its first job."""
        deadline = time.monotonic() + timeout_s
        while True:
            beating = {(s.instance_id, s.pid) for s in self.view.book.instances.values()
                       if s.status == "HEALTHY"}
            if all((i.instance_id, i.pid) in beating for i in self.instances if i.kind != METERING):
                return
            if time.monotonic() > deadline:
                raise JoynexusError(f"the service did not come up in {timeout_s:.0f} s; see {self.log_dir}")
            await asyncio.sleep(0.5)

    # ------------------------------------------------------------------ processes
    def _task(self, coro, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _new_instance(self, kind: str) -> Instance:
        used = {i.index for i in self.instances if i.kind == kind}
        index = next(n for n in range(len(used) + 1) if n not in used)
        inst = Instance(kind, index, f"{kind}-{index}.{self.host}")
        self.instances.append(inst)
        return inst

    def _signal(self, inst: Instance, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(inst.pid, sig)  # the whole group: isolated simulators are its children

    async def _spawn(self, inst: Instance, cause: str, backoff_s: float = 0.0,
                     old_pid: int | None = None) -> None:
        cmd = [sys.executable, "-m", "infra", "run", inst.kind, "--instance", inst.instance_id,
               "--restarts", str(inst.restarts), "--parent-pid", str(os.getpid())]
        if inst.kind == METERING:
            cmd = [sys.executable, "-m", "infra", "metering", "--parent-pid", str(os.getpid())]
        with open(self.log_dir / f"{inst.instance_id}.log", "ab") as out:
            inst.process = await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
                env=self._env, start_new_session=True)
        inst.started_at = time.monotonic()
        log.info("instance started", instance=inst.instance_id, pid=inst.pid, cause=cause,
                 restarts=inst.restarts, backoff_s=round(backoff_s, 2))
        await self._record(inst, cause, backoff_s, old_pid)
        self._task(self._watch(inst, inst.process), f"watch-{inst.instance_id}")

    async def _record(self, inst: Instance, cause: str, backoff_s: float, old_pid: int | None) -> None:
        event = ev.InstanceRestarted(
            envelope=ev.Envelope(producer_id=f"supervisor/{self.host}"), role=inst.kind,
            instance_id=inst.instance_id, host=self.host, new_pid=inst.pid, cause=cause,
            restarts=inst.restarts, backoff_s=backoff_s, old_pid=old_pid)
        try:
            await self.producer.send(shared_topic(self.settings, "health"), event,
                                     key=f"{inst.kind}/{inst.instance_id}")
        except Exception as exc:  # the restart happened; only its record is missing
            log.warning("restart event not published", error_class=type(exc).__name__)

    async def _watch(self, inst: Instance, process: asyncio.subprocess.Process) -> None:
        code = await process.wait()
        if self.stopping or inst.retiring:
            log.info("instance stopped", instance=inst.instance_id, pid=process.pid, code=code)
            if inst.retiring:
                self.instances.remove(inst)
            return
        cause = inst.kill_cause or _exit_cause(code)
        inst.kill_cause = None
        uptime = time.monotonic() - inst.started_at
        inst.quick_deaths = 0 if uptime >= self.settings.stable_after_s else inst.quick_deaths + 1
        # the first death after a stable run restarts at once; a crash loop backs off exponentially
        base, ceiling = self.settings.restart_backoff_s, self.settings.restart_backoff_max_s
        backoff = 0.0 if inst.quick_deaths <= 1 else min(ceiling, base * 2 ** (inst.quick_deaths - 2))
        log.warning("instance died; restarting in place", instance=inst.instance_id, pid=process.pid,
                    cause=cause, uptime_s=round(uptime, 1), backoff_s=backoff)
        await asyncio.sleep(backoff)
        if self.stopping:
            return
        inst.restarts += 1
        await self._spawn(inst, cause, backoff, old_pid=process.pid)

    async def _kill_if_lingering(self, inst: Instance) -> None:
        """A retired instance that ignores SIGTERM for ``stop_grace_s`` is killed: its sessions
        must not stay with a worker that no longer counts."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(inst.process.wait(), self.settings.stop_grace_s)
        if inst.alive:
            log.warning("retired instance ignored SIGTERM; killing", instance=inst.instance_id, pid=inst.pid)
            self._signal(inst, signal.SIGKILL)

    def _on_event(self, event: ev.Event) -> None:
        """A verdict about one of our live processes: kill it; ``_watch`` restarts it."""
        if not isinstance(event, ev.InstanceVerdict) or event.host != self.host or self.stopping:
            return
        for inst in self.instances:
            if inst.instance_id == event.instance_id and inst.pid == event.pid and inst.alive:
                inst.kill_cause = f"{event.verdict} ({event.role}): {event.reason}"
                log.error("killing a judged instance", instance=inst.instance_id, pid=inst.pid,
                          verdict=event.verdict, role=event.role, reason=event.reason)
                self._signal(inst, signal.SIGKILL)

    # ------------------------------------------------------------------ elastic env workers
    async def _scale_loop(self) -> None:
        while not self.stopping:
            await asyncio.sleep(_SCALE_EVERY_S)
            await self.scale_env()

    async def scale_env(self, target: int | None = None) -> int:
        """One scaling step (``target`` given: go there now, as a test or operator would)."""
        workers = self.of_kind("env")
        reports = [s for s in self.view.book.of_role("env", self.settings.health_timeout_s)
                   if s.host == self.host and any(s.instance_id == w.instance_id for w in workers)]
        sessions = sum(int(s.details.get("sessions", "0")) for s in reports)
        lag = sum(max(s.lag, 0) for s in reports)
        forced = target is not None
        if target is None:
            target = env_target(len(workers), sessions, lag, per_worker=self.settings.env_sessions_per_worker,
                                lo=max(self.settings.env_min, 1), hi=max(self.settings.env_max, 1))
        if target > len(workers):
            self._low_since = None
            for _ in range(target - len(workers)):
                log.info("scaling env workers up", workers=len(workers), target=target, sessions=sessions,
                         lag=lag)
                await self._spawn(self._new_instance("env"),
                                  f"scaled up: {sessions} sessions, lag {lag}, {len(workers)} -> {target}")
        elif target < len(workers):
            now = time.monotonic()
            self._low_since = self._low_since or now
            if forced or now - self._low_since >= self.settings.env_scale_down_after_s:
                self._low_since = None
                for inst in sorted(workers, key=lambda i: i.index)[target:]:
                    log.info("scaling env workers down", workers=len(workers), target=target,
                             sessions=sessions, lag=lag, retiring=inst.instance_id)
                    inst.retiring = True
                    self._signal(inst, signal.SIGTERM)
                    self._task(self._kill_if_lingering(inst), f"retire-{inst.instance_id}")
        else:
            self._low_since = None
        return target


async def run_up(settings: Settings, kinds: Sequence[str] = DEFAULT_KINDS,
                 scale: Mapping[str, int] | None = None, autoscale: bool = True) -> None:
    """Supervise this machine's processes until SIGINT/SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with ProcessSupervisor(settings, kinds, scale, autoscale=autoscale):
        await stop.wait()
