"""Optimizer workers: one consumer group per tenant (``optimizer.<tenant>``), many in one process.

A tenant's worker reads its features topic (one partition, so its steps are
totally ordered) and applies each FeatureBatch to the tenant's slot: loss,
backward, AdamW step, nothing shared with any other tenant. When a batch asks
for it (``publish``: the end of an RL iteration, every ``publish_every`` SFT
steps, the job's last step) it writes a checkpoint to the policy store and
publishes ``PolicyVersionPublished`` (and progress, and completion) in ONE
transaction with the input offset.

So the committed offset is always the offset right after a published
version: the slot is a fold of the features topic, and the checkpoint is its
snapshot. A restarted worker loads the newest checkpoint of the job whose
``features`` offset is not past the committed one and replays from there,
without the backbone. A checkpoint written just before a crash (its
transaction never committed) is past the committed offset and ignored; the
replay writes the same version again with the same bytes, which the store
accepts as a no-op. Batches whose sequence is not beyond the last one applied
are duplicates (a rollout re-emission) and are skipped.

A non-finite loss or gradient fails that tenant's job alone: ``JobFailed``,
the slot is dropped; other tenants' workers never notice.

Metering: each published version carries, in its transaction, a ``UsageRecorded`` of the steps
since the previous one (their compute seconds and count), with the version as its id.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from datetime import UTC, datetime

from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord, TopicPartition

from consumers.bus.loop import bind_record, commit_within, make_consumer
from consumers.bus.protocols import Workload
from consumers.convert import targets_of, to_feature
from consumers.service import Service
from infra.errors import JoynexusError, TenantMismatch
from infra.follow import TopicFollower, from_beginning
from infra.logging import get_logger
from infra.topics import check_tenant, shared_topic, tenant_topic
from producers.producer import EventProducer
from schemas import events as ev
from schemas.codec import Codec
from schemas.jobspec import JobSpec
from tenants.errors import NonFiniteLoss, TenantError
from tenants.slot import TenantSlot

__all__ = ["OptimizerHost", "TenantOptimizer"]

log = get_logger("consumers.optimizer")
TRAINING_KINDS = (ev.JobKind.RL.value, ev.JobKind.SFT.value)  # jobs whose feature batches come here


class _JobRun:
    """The slot of the job a worker is stepping, and what it has seen since the last publish."""

    def __init__(
        self,
        spec: JobSpec,
        slot: TenantSlot,
        start_step: int,
        last_sequence: int,
        total_steps: int | None = None,
    ):
        self.spec = spec
        self.total_steps = total_steps
        self.slot = slot
        self.start_step = start_step
        self.last_sequence = last_sequence
        self.sums: dict[str, float] = defaultdict(float)
        self.count = 0
        self.step_s = 0.0  # compute time of the steps since the last publish (metering)
        self.count_since_usage = 0
        self.window_start = datetime.now(UTC)

    @property
    def steps(self) -> int:
        return self.slot.step - self.start_step

    def add(self, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.sums[name] += value
        self.count += 1
        self.count_since_usage += 1

    def means(self) -> dict[str, float]:
        out = {name: total / self.count for name, total in self.sums.items()} if self.count else {}
        self.sums.clear()
        self.count = 0
        return out


class TenantOptimizer:
    def __init__(self, service: Service, tenant: str):
        self.service = service
        self.settings = service.settings
        self.tenant = tenant
        self.group = f"optimizer.{tenant}"
        self.topic = tenant_topic(self.settings, tenant, "features")
        self.tp = TopicPartition(self.topic, 0)
        self.codec = Codec.for_settings(service.settings)
        self.consumer = make_consumer(self.settings, self.group, topics=[self.topic])
        self.producer = EventProducer(
            self.settings, self.codec, transactional_id=f"optimizer-{tenant}", client_id=f"optimizer-{tenant}"
        )
        self.run_: _JobRun | None = None
        self.log = log.bind(tenant=tenant)
        self.applied = 0  # feature batches trained on: the worker's progress

    async def start(self) -> None:
        await self.producer.start()  # fences a predecessor that is still around
        await self.consumer.start()

    async def stop(self) -> None:
        await self.consumer.stop()
        await self.producer.stop()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            batches = await self.consumer.getmany(timeout_ms=200)
            for record in batches.get(self.tp, []):
                with bind_record(self.group, record, self.tenant):
                    await self._record(record)

    # ------------------------------------------------------------------ one feature batch
    async def _record(self, record: ConsumerRecord) -> None:
        try:
            batch = self.codec.decode(record.value)
        except JoynexusError as exc:
            self.log.error("undecodable feature batch skipped", offset=record.offset, error=str(exc)[:200])
            return
        if not isinstance(batch, ev.FeatureBatch):
            return
        try:
            check_tenant(record.topic, batch.tenant_id)
        except TenantMismatch:  # a security event, logged; the batch is not ours to apply
            await self._commit_outside(record)
            return
        if self.service.book.stopped(self.tenant, batch.job_id):
            if self.run_ and self.run_.spec.job_id == batch.job_id:
                self.log.info("job stopped; slot released", job=batch.job_id)
                self.run_ = None
            await self._commit_outside(record)
            return
        try:
            run = await self._job(batch.job_id)
        except JoynexusError as exc:
            self.log.error("feature batch skipped", job=batch.job_id, error=str(exc)[:300])
            await self._commit_outside(record)
            return
        if batch.sequence <= run.last_sequence:
            return  # already applied: a re-emitted minibatch
        began = time.perf_counter()
        try:
            metrics = await asyncio.to_thread(
                run.slot.train_step,
                to_feature({k: self.service.tensors.resolve(t) for k, t in batch.features.items()}),
                targets_of(batch.targets),
            )
        except (NonFiniteLoss, TenantError, JoynexusError, ValueError) as exc:
            await self._fail(record, batch, exc)
            return
        run.step_s += time.perf_counter() - began
        run.last_sequence = batch.sequence
        run.add(metrics)
        self.applied += 1
        limit = run.spec.limits.max_steps
        final = batch.final or (limit is not None and run.steps >= limit)
        if batch.publish or final:
            await self._publish(record, batch, run, final)

    async def _job(self, job_id: str) -> _JobRun:
        if self.run_ is not None and self.run_.spec.job_id == job_id:
            return self.run_
        await self.service.book.sync(self.tenant)
        state = self.service.book.get(self.tenant, job_id)
        if state is None or "start_version" not in state.resources:
            raise JoynexusError(f"feature batch for job {job_id}, which was never accepted")
        spec = state.spec
        start_version = int(state.resources["start_version"])
        start = self.service.store.load(self.tenant, start_version).meta
        committed = await self.consumer.committed(self.tp) or 0
        marker = f"job:{job_id}"
        ours = [
            m
            for m in self.service.store.list(self.tenant)
            if marker in m.source_offsets and m.source_offsets.get("features", 1 << 62) <= committed
        ]
        version = ours[-1].version if ours else start_version
        slot = await asyncio.to_thread(
            lambda: self.service.store.restore(self.tenant, version).mount(self.service.info.device)
        )
        last_sequence = ours[-1].source_offsets["sequence"] if ours else -1
        self.log.info(
            "slot loaded", job=job_id, version=version, committed_offset=committed, resumed=bool(ours)
        )
        total = state.resources.get("total_steps")
        self.run_ = _JobRun(spec, slot, start.step, last_sequence, int(total) if total else None)
        return self.run_

    def _envelope(self, job_id: str) -> ev.Envelope:
        return ev.Envelope(
            tenant_id=self.tenant, producer_id=f"optimizer/{self.tenant}", correlation_id=job_id
        )

    async def _publish(
        self, record: ConsumerRecord, batch: ev.FeatureBatch, run: _JobRun, final: bool
    ) -> None:
        means = run.means()
        source = {"features": record.offset + 1, f"job:{batch.job_id}": 1, "sequence": batch.sequence}
        checkpoint = await asyncio.to_thread(
            self.service.store.save, run.slot, source_offsets=source, metrics=means
        )
        ref = checkpoint.ref
        metrics = {**batch.metrics, **{f"train_{k}": v for k, v in means.items()}, "steps": float(run.steps)}
        rl = run.spec.kind == "rl"
        step = int(batch.metrics.get("iteration", 0)) + 1 if rl else run.steps
        total = run.spec.rl.iterations if rl else run.total_steps
        events: list[tuple[str, ev.Event]] = [
            (
                "policy-versions",
                ev.PolicyVersionPublished(
                    envelope=self._envelope(batch.job_id),
                    job_id=batch.job_id,
                    version=checkpoint.meta.version,
                    parent_version=checkpoint.meta.parent_version,
                    step=run.slot.step,
                    checkpoint=ev.BlobRef(uri=ref.uri, sha256=ref.sha256, size_bytes=ref.size_bytes),
                    source_offsets={self.topic + ":0": record.offset + 1},
                    metrics=metrics,
                ),
            ),
            (
                "status",
                ev.JobProgress(
                    envelope=self._envelope(batch.job_id),
                    job_id=batch.job_id,
                    step=step,
                    total_steps=total,
                    policy_version=checkpoint.meta.version,
                    metrics=metrics,
                ),
            ),
        ]
        events.append(("usage", self._usage(batch.job_id, checkpoint.meta.version, run)))
        if final:
            events.append(
                (
                    "status",
                    ev.JobCompleted(
                        envelope=self._envelope(batch.job_id),
                        job_id=batch.job_id,
                        final_policy_version=checkpoint.meta.version,
                        metrics=metrics,
                    ),
                )
            )
        await self._commit_with(record, events)
        self.log.info(
            "policy version published",
            job=batch.job_id,
            version=checkpoint.meta.version,
            steps=run.steps,
            final=final,
            **{k: round(v, 5) for k, v in means.items()},
        )
        if final:
            self.run_ = None

    async def _fail(self, record: ConsumerRecord, batch: ev.FeatureBatch, exc: Exception) -> None:
        self.log.error(
            "tenant step failed; job stopped",
            job=batch.job_id,
            error_class=type(exc).__name__,
            error=str(exc)[:300],
        )
        await self._commit_with(
            record,
            [
                (
                    "status",
                    ev.JobFailed(
                        envelope=self._envelope(batch.job_id),
                        job_id=batch.job_id,
                        error_class=type(exc).__name__,
                        reason=str(exc)[:2000],
                        stage="optimizer",
                    ),
                )
            ],
        )
        self.run_ = None

    def _usage(self, job_id: str, version: int, run: _JobRun) -> ev.UsageRecorded:
        """The steps since the last version, in the same transaction as the version: its id is the
        version's, so a replayed publish is the same usage (metering counts each id once)."""
        now = datetime.now(UTC)
        usage = ev.UsageRecorded(
            envelope=self._envelope(job_id), usage_id=f"optimizer/{self.tenant}/{job_id}/v{version}",
            role="optimizer", resource="optimizer.step", device=str(self.service.info.device),
            seconds=run.step_s, window_start=run.window_start, window_end=now, group_size=1,
            steps=run.count_since_usage)
        run.step_s, run.window_start, run.count_since_usage = 0.0, now, 0
        return usage

    async def _commit_with(self, record: ConsumerRecord, events: list[tuple[str, ev.Event]]) -> None:
        while True:
            try:
                async with self.producer.transaction():
                    for stream, event in events:
                        topic = (shared_topic(self.settings, "usage") if stream == "usage"
                                 else tenant_topic(self.settings, self.tenant, stream))
                        await self.producer.enqueue(topic, event, key=self.tenant)
                    await self.producer.send_offsets_to_transaction({self.tp: record.offset + 1}, self.group)
                return
            except KafkaError as exc:  # the step is done; only its publication must get through
                self.log.warning("publish transaction failed; retrying", error_class=type(exc).__name__)
                await asyncio.sleep(self.settings.retry_backoff_s)

    async def _commit_outside(self, record: ConsumerRecord) -> None:
        try:
            await commit_within(self.consumer, {self.tp: record.offset + 1})
        except (KafkaError, TimeoutError) as exc:
            self.log.warning("commit failed", error_class=type(exc).__name__)


class OptimizerHost:
    """Runs a ``TenantOptimizer`` for every registered tenant with a training job under way;
    restarts one that crashes and stops one whose tenant has nothing left to train.

    An idle worker is not free: its consumer group heartbeats and long-polls the broker, and with
    one per tenant ever registered, a service's later jobs paid for every earlier tenant (the same
    optimizer steps took up to 40% more CPU by the last run of a benchmark of 28 tenants, 2026-12-01).
    A stopped worker loses nothing: the next one resumes from its group's committed offset.
    """

    def __init__(self, service: Service):
        self.service = service
        self.tenants: set[str] = set()
        # one topic, assigned: a pattern would fetch every topic's metadata every refresh
        self.follower = TopicFollower(service.settings, shared_topic(service.settings, "tenants"),
                                      self._on_tenant, name="optimizer-tenants", seek=from_beginning)
        self.workers: dict[str, asyncio.Task] = {}
        self.live: dict[str, TenantOptimizer] = {}

    def _on_tenant(self, event: ev.Event, record: ConsumerRecord) -> None:
        if isinstance(event, ev.TenantRegistered) and event.tenant_id:
            (self.tenants.add if event.active else self.tenants.discard)(event.tenant_id)

    def workload(self) -> Workload:
        live = list(self.live.values())
        return Workload(tuple(w.consumer for w in live), done=sum(w.applied for w in live),
                        details={"tenants": len(live)})

    async def start(self) -> None:
        await self.follower.start()

    async def stop(self) -> None:
        for task in self.workers.values():
            task.cancel()
        await asyncio.gather(*self.workers.values(), return_exceptions=True)
        await self.follower.stop()

    def training(self) -> set[str]:
        """Registered tenants with an accepted RL or SFT job that has not ended."""
        return {tenant for (tenant, _), state in self.service.book.jobs.items()
                if tenant in self.tenants and state.kind in TRAINING_KINDS and state.phase == "accepted"}

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            training = self.training()
            for tenant, task in list(self.workers.items()):
                if tenant in training:
                    continue
                if task.done():
                    del self.workers[tenant]
                elif not task.cancelling():  # once: a second cancel would cut its consumer's goodbye
                    log.info("optimizer worker stopped; its tenant has nothing to train", tenant=tenant)
                    task.cancel()
            for tenant in sorted(training):
                task = self.workers.get(tenant)
                if task is None or task.done():
                    if task is not None and not task.cancelled() and task.exception():
                        log.error(
                            "optimizer worker crashed; restarting",
                            tenant=tenant,
                            error=repr(task.exception())[:300],
                        )
                    self.workers[tenant] = asyncio.create_task(
                        self._worker(tenant, stop), name=f"optimizer-{tenant}"
                    )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)

    async def _worker(self, tenant: str, stop: asyncio.Event) -> None:
        worker = TenantOptimizer(self.service, tenant)
        self.live[tenant] = worker
        await worker.start()
        try:
            await worker.run(stop)
        finally:
            await worker.stop()
            if self.live.get(tenant) is worker:
                del self.live[tenant]
