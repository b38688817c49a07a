"""The master role: tenants' job requests in, compiled work and the job lifecycle out.

It consumes every tenant's ``jobs`` topic as the consumer group ``master``,
exactly once (``TransformWorker``: its outputs and the input offset commit in
one transaction). A ``JobSubmitted`` is validated (a bad spec gets
``JobRejected`` with one FieldError per bad field and nothing else happens),
then compiled: the tenant's topics and registry entry, its initial policy
version (fresh modules from the spec's seed, or an existing version), its
env sessions (RL, eval) and the ``JobAccepted`` that carries what the other
roles need. A ``JobCancelled`` from the tenant is confirmed on the status
topic and closes the job's open sessions; every role stops spending work on
a job once the job book shows it stopped.

Work outside the transaction is idempotent: topic creation, the initial
checkpoint (found again by its ``init:<job>`` marker), and the reconcile loop
that runs dataset feeders for accepted SFT jobs (a feeder resumes from the
log) and enforces wall-time limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from consumers.bus.protocols import Output, RecordContext, Workload
from consumers.bus.transform import TransformWorker
from consumers.master import plan
from consumers.service import Service
from infra.errors import JoynexusError
from infra.logging import get_logger
from infra.topics import TopicAdmin, parse_topic, shared_topic, tenant_stream_pattern, tenant_topic
from producers.dataset.feeder import DatasetFeeder
from producers.producer import EventProducer
from schemas import events as ev
from schemas.jobspec import JobSpec, JobSpecInvalid
from schemas.jobstate import JobState
from tenants.slot import TenantSlot

__all__ = ["Master"]

log = get_logger("consumers.master")
GROUP = "master"


class Master:
    def __init__(self, service: Service, instance: str = "0"):
        self.service = service
        self.settings = service.settings
        self.producer_id = f"master/{instance}"
        self.worker = TransformWorker(
            self.settings,
            group_id=GROUP,
            pattern=tenant_stream_pattern(self.settings, "jobs"),
            transform=self.transform,
            role="master",
        )
        self.producer = EventProducer(self.settings, client_id="master-reconcile")
        self.feeders: dict[tuple[str, str], asyncio.Task] = {}
        self.fed: set[tuple[str, str]] = set()  # feeds this process ran to the end
        self._accepted: set[tuple[str, str]] = set()  # seen by this process before the book shows it

    def workload(self) -> Workload:
        return Workload((self.worker.consumer,), done=self.worker.committed_batches,
                        details={"aborted": self.worker.aborted_batches})

    async def start(self) -> None:
        async with TopicAdmin(self.settings) as admin:
            await admin.ensure_shared()
        await self.producer.start()
        await self.worker.start()

    async def stop(self) -> None:
        for task in self.feeders.values():
            task.cancel()
        await asyncio.gather(*self.feeders.values(), return_exceptions=True)
        await self.worker.stop()
        await self.producer.stop()

    async def run(self, stop: asyncio.Event) -> None:
        reconcile = asyncio.create_task(self._reconcile_loop(stop), name="master-reconcile")
        try:
            await self.worker.run(stop)
        finally:  # a crash of this role must not stop the other roles of the process
            reconcile.cancel()
            await asyncio.gather(reconcile, return_exceptions=True)

    # ------------------------------------------------------------------ events
    def _envelope(self, tenant: str, job_id: str) -> ev.Envelope:
        return ev.Envelope(tenant_id=tenant, producer_id=self.producer_id, correlation_id=job_id)

    def _status(self, tenant: str, event: ev.Event) -> Output:
        return Output(tenant_topic(self.settings, tenant, "status"), event, tenant)

    async def transform(self, event: ev.Event, ctx: RecordContext) -> list[Output]:
        tenant = parse_topic(ctx.topic).tenant
        if isinstance(event, ev.JobSubmitted):
            return await self._submitted(tenant, event)
        if isinstance(event, ev.JobCancelled):
            return await self._cancelled(tenant, event)
        log.warning("not a job request; ignored", event_type=type(event).__name__)
        return []

    def _reject(self, tenant: str, job_id: str, errors: list[tuple[str, str]]) -> list[Output]:
        reason = "; ".join(f"{loc}: {msg}" for loc, msg in errors)
        log.warning("job rejected", tenant=tenant, job=job_id, reason=reason[:500])
        return [
            self._status(
                tenant,
                ev.JobRejected(
                    envelope=self._envelope(tenant, job_id),
                    job_id=job_id,
                    reason=reason[:2000],
                    errors=tuple(ev.FieldError(loc=loc, message=msg[:1000]) for loc, msg in errors),
                ),
            )
        ]

    async def _submitted(self, tenant: str, event: ev.JobSubmitted) -> list[Output]:
        try:
            spec = JobSpec.parse(event.spec_json)
        except JobSpecInvalid as exc:
            return self._reject(tenant, event.job_id, exc.errors)
        mismatch = [
            (loc, msg)
            for loc, ok, msg in (
                (
                    "tenant",
                    spec.tenant == tenant,
                    f"spec names tenant {spec.tenant!r} on tenant {tenant!r}'s topic",
                ),
                (
                    "job_id",
                    spec.job_id == event.job_id,
                    f"spec job_id {spec.job_id!r} != event {event.job_id!r}",
                ),
                (
                    "kind",
                    spec.kind.upper() == event.kind.value,
                    f"spec kind {spec.kind} != event {event.kind}",
                ),
            )
            if not ok
        ]
        if mismatch:
            return self._reject(tenant, event.job_id, mismatch)
        await self.service.book.sync(tenant)
        known = self.service.book.get(tenant, spec.job_id)
        if (tenant, spec.job_id) in self._accepted or (known and known.phase != "submitted"):
            log.info("job already handled; duplicate submission ignored", tenant=tenant, job=spec.job_id)
            return []
        try:
            outputs = await self._compile(spec)
        except plan.CompileError as exc:
            return self._reject(tenant, spec.job_id, [(exc.loc, str(exc))])
        self._accepted.add((tenant, spec.job_id))
        return outputs

    def _busy_with(self, spec: JobSpec) -> str | None:
        if spec.kind == "eval":
            return None  # evaluations only read the store
        for state in self.service.book.of_tenant(spec.tenant):
            if (
                state.job_id != spec.job_id
                and state.kind in ("SFT", "RL")
                and not state.terminal
                and state.phase == "accepted"
            ):
                return state.job_id
        return None

    async def _compile(self, spec: JobSpec) -> list[Output]:
        service, tenant = self.service, spec.tenant
        wanted = spec.backbone
        if wanted is not None and wanted not in (self.settings.backbone, service.info.backbone_id):
            raise plan.CompileError(
                "backbone",
                f"this service runs backbone {service.info.backbone_id} "
                f"(preset {self.settings.backbone}), not {wanted}",
            )
        busy = self._busy_with(spec)
        if busy:
            raise plan.CompileError(
                "tenant",
                f"tenant {tenant} already trains job {busy}; its policy has one lineage: cancel it or wait",
            )
        async with TopicAdmin(self.settings) as admin:
            topics = await admin.ensure_tenant(tenant)
        outputs = [
            Output(
                shared_topic(self.settings, "tenants"),
                ev.TenantRegistered(
                    envelope=self._envelope(tenant, spec.job_id), active=True, topics=tuple(topics)
                ),
                tenant,
            )
        ]
        if spec.kind == "eval":
            sessions, resources = await self._eval_plan(spec)
        else:
            config_outputs, sessions, resources = await self._train_plan(spec)
            outputs += config_outputs
        resources |= {
            "backbone_id": service.info.backbone_id,
            "sessions": ",".join(s.session_id for s in sessions),
        }
        outputs.append(
            self._status(
                tenant,
                ev.JobAccepted(
                    envelope=self._envelope(tenant, spec.job_id),
                    job_id=spec.job_id,
                    kind=ev.JobKind(spec.kind.upper()),
                    resources=resources,
                ),
            )
        )
        outputs += [
            Output(tenant_topic(self.settings, tenant, "sessions"), s, s.session_id) for s in sessions
        ]
        log.info("job accepted", tenant=tenant, job=spec.job_id, kind=spec.kind, **resources)
        return outputs

    async def _eval_plan(self, spec: JobSpec) -> tuple[list[ev.EnvSessionRequested], dict[str, str]]:
        """An evaluation's sessions (none for a held-out dataset: the evaluator scores it itself)."""
        store, tenant = self.service.store, spec.tenant
        version = spec.eval.policy_version or store.latest_version(tenant)
        if version is None or version not in store.versions(tenant):
            raise plan.CompileError(
                "eval.policy_version", f"tenant {tenant} has no policy version {version or '(none yet)'}"
            )
        self._check_lineage(tenant, version, "eval.policy_version")
        if spec.env is not None:
            await asyncio.to_thread(plan.env_dims, spec)  # the env must start, before we accept
            sessions = [plan.eval_session(spec, version, self.producer_id)]
        else:
            await asyncio.to_thread(plan.dataset_dims, spec, self.settings)
            sessions = []
        return sessions, {"policy_version": str(version)}

    async def _train_plan(self, spec: JobSpec) -> tuple[list[Output], list[ev.EnvSessionRequested],
                                                        dict[str, str]]:
        """A training job's initial policy (its config outputs) and first sessions (none for SFT)."""
        version, config_outputs, resources = await self._initial_policy(spec)
        if spec.kind == "rl" and spec.rl.mode == "sync":
            sessions = plan.iteration_sessions(spec, 0, version, self.producer_id)
        elif spec.kind == "rl":
            sessions = plan.async_sessions(spec, self.producer_id)
        else:
            sessions = []
        return config_outputs, sessions, resources

    def _check_lineage(self, tenant: str, version: int, loc: str) -> None:
        """A policy runs only on the backbone its modules were trained against: its features are
        another model's otherwise (and of another width, a RuntimeError on every observation)."""
        meta = self.service.store.meta(tenant, version)
        here = self.service.info  # the master describes the backbone, it does not load it
        if meta.backbone_id is not None and meta.backbone_id != here.backbone_id:
            raise plan.CompileError(
                loc, f"version {version} of tenant {tenant} was trained against backbone "
                f"{meta.backbone_id}; this service runs {here.backbone_id}")
        trained_width = meta.config.get("hidden_size")
        if meta.backbone_id is None and trained_width != here.hidden_size:  # written before lineage
            raise plan.CompileError(
                loc, f"version {version} of tenant {tenant} expects {trained_width}-wide features; "
                f"this service's backbone {here.backbone_id} gives {here.hidden_size}")

    async def _initial_policy(self, spec: JobSpec) -> tuple[int, list[Output], dict[str, str]]:
        """The version training starts from: an existing one, or fresh modules saved as a new one."""
        service, tenant = self.service, spec.tenant
        if spec.kind == "rl":
            dims = await asyncio.to_thread(plan.env_dims, spec)
        else:
            dims, dataset = await asyncio.to_thread(plan.dataset_dims, spec, self.settings)
        config = plan.tenant_config(spec, service.info.hidden_size, dims)
        resources = {"action_dim": str(dims.action_dim), "proprio_dim": str(dims.proprio_dim)}
        if spec.kind == "sft":
            resources["total_steps"] = str(plan.sft_steps(spec, dataset))
        if spec.init_version is not None:
            if spec.init_version not in service.store.versions(tenant):
                raise plan.CompileError("init_version", f"tenant {tenant} has no version {spec.init_version}")
            self._check_lineage(tenant, spec.init_version, "init_version")
            old = service.store.load(tenant, spec.init_version).state.config
            if (old.hidden_size, old.head.kind, old.head.action_dim, old.head.proprio_dim) != (
                config.hidden_size,
                config.head.kind,
                config.head.action_dim,
                config.head.proprio_dim,
            ):
                raise plan.CompileError(
                    "init_version",
                    f"version {spec.init_version} has modules that do not fit this job's backbone/env",
                )
            return spec.init_version, [], resources | {"start_version": str(spec.init_version)}
        marker = f"init:{spec.job_id}"
        existing = [m for m in service.store.list(tenant) if marker in m.source_offsets]
        if existing:  # a replay after a crash: the checkpoint was written, its publish was not
            checkpoint = service.store.load(tenant, existing[-1].version)
        else:
            slot = TenantSlot(config)
            slot.version = service.store.latest_version(tenant) or 0
            checkpoint = await asyncio.to_thread(service.store.save, slot, source_offsets={marker: 0},
                                                 backbone_id=service.info.backbone_id)
        ref = checkpoint.ref
        published = ev.PolicyVersionPublished(
            envelope=self._envelope(tenant, spec.job_id),
            job_id=spec.job_id,
            version=checkpoint.meta.version,
            parent_version=checkpoint.meta.parent_version,
            step=0,
            checkpoint=ev.BlobRef(uri=ref.uri, sha256=ref.sha256, size_bytes=ref.size_bytes),
            source_offsets={},
            metrics={},
        )
        version = checkpoint.meta.version
        return (
            version,
            [Output(tenant_topic(self.settings, tenant, "policy-versions"), published, tenant)],
            resources | {"start_version": str(version)},
        )

    async def _cancelled(self, tenant: str, event: ev.JobCancelled) -> list[Output]:
        if event.envelope.producer_id.startswith("master"):
            return []
        await self.service.book.sync(tenant)
        state = self.service.book.get(tenant, event.job_id)
        if state is None or state.terminal:
            log.info("cancel of an unknown or finished job ignored", tenant=tenant, job=event.job_id)
            return []
        log.info("job cancelled", tenant=tenant, job=event.job_id, by=event.requested_by)
        return [
            self._status(
                tenant,
                ev.JobCancelled(
                    envelope=self._envelope(tenant, event.job_id),
                    job_id=event.job_id,
                    requested_by=event.requested_by,
                    reason=event.reason,
                ),
            ),
            *self._close_sessions(state, "cancelled"),
        ]

    def _close_sessions(self, state: JobState, reason: str) -> list[Output]:
        return [
            Output(
                tenant_topic(self.settings, state.tenant, "sessions"),
                ev.EnvSessionClosed(
                    envelope=self._envelope(state.tenant, state.job_id),
                    session_id=sid,
                    job_id=state.job_id,
                    reason=reason,
                ),
                sid,
            )
            for sid in state.open_sessions
        ]

    # ------------------------------------------------------------------ reconcile
    async def _reconcile_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._reconcile()
            except Exception as exc:  # the next round tries again
                log.error("reconcile failed", error_class=type(exc).__name__, error=str(exc)[:300])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    async def _reconcile(self) -> None:
        for key, state in list(self.service.book.jobs.items()):
            task = self.feeders.get(key)
            if task is not None and (task.done() or self.service.book.stopped(*key)):
                task.cancel()
                del self.feeders[key]
            if state.terminal or state.phase != "accepted":
                continue
            spec = state.spec
            limit = spec.limits.max_wall_time_s
            if limit and state.submitted_at and time.time() - state.submitted_at.timestamp() > limit:
                await self._fail(state, "WallTimeExceeded", f"ran longer than limits.max_wall_time_s={limit}")
                continue
            idle = key not in self.feeders and key not in self.fed
            if spec.kind == "sft" and idle and not state.cancel_requested:
                self.feeders[key] = asyncio.create_task(self._feed(spec, state), name=f"feed-{spec.job_id}")

    async def _feed(self, spec: JobSpec, state: JobState) -> None:
        try:
            _, dataset = await asyncio.to_thread(plan.dataset_dims, spec, self.settings)
            version = int(state.resources.get("start_version", "0"))
            feeder = DatasetFeeder(
                self.settings, dataset, plan.feed_plan(spec, version, spec.modules.chunk_len)
            )
            sent = await feeder.run()
            self.fed.add((spec.tenant, spec.job_id))
            log.info(
                "dataset feed complete", tenant=spec.tenant, job=spec.job_id, batches=sent, total=feeder.total
            )
        except asyncio.CancelledError:
            raise
        except (JoynexusError, OSError) as exc:
            await self._fail(state, type(exc).__name__, f"dataset feed failed: {exc}")

    async def _fail(self, state: JobState, error_class: str, reason: str) -> None:
        log.error("job failed", tenant=state.tenant, job=state.job_id, error_class=error_class, reason=reason)
        outs: list[Any] = [
            self._status(
                state.tenant,
                ev.JobFailed(
                    envelope=self._envelope(state.tenant, state.job_id),
                    job_id=state.job_id,
                    error_class=error_class,
                    reason=reason[:2000],
                    stage="master",
                ),
            ),
            *self._close_sessions(state, "failed"),
        ]
        for out in outs:
            await self.producer.send(out.topic, out.event, key=out.key)
        state.phase = "failed"  # until the book reads it back: do not fail it twice
