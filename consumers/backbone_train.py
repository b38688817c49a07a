"""The backbone-train role: many tenants' gradient jobs, one backbone forward per compatible group.

Consumer group ``backbone-train`` on every tenant's gradient-jobs topic. Each
poll takes up to ``train_max_batch_jobs`` jobs of any tenants, splits them
into rows, groups the rows by bucket (same camera count and padded length),
runs ONE forward per bucket on the device gate's training queue (inference
goes first), and puts each job's rows back together as that tenant's
FeatureBatch: features plus the targets its loss needs, passed through. All
feature batches, the usage records and the input offsets commit in ONE
transaction, so a crash re-runs the poll and no feature batch appears twice.

Usage: each forward's device-seconds are split between tenants by their
share of its rows, published as ``UsageRecorded`` on ``nexus.usage``.

The transactional id is ``backbone-train-<instance>``: one id per instance,
not per input partition, because a group mixes partitions. Two instances
with the same id fence each other; give each instance its own id.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord, TopicPartition

from backbone.feature import VLAFeature
from backbone.grouped import forward_grouped_on
from backbone.inputs import Prepared
from consumers.bus.dlq import publish_dead_letter
from consumers.bus.loop import make_consumer
from consumers.convert import feature_tensors, gradient_job_requests
from consumers.service import Service
from infra.errors import JoynexusError
from infra.logging import get_logger
from infra.topics import shared_topic, tenant_stream_pattern, tenant_topic
from producers.heartbeat import Heartbeater
from producers.producer import EventProducer
from schemas import events as ev
from schemas.codec import Codec

__all__ = ["BackboneTrainRole"]

log = get_logger("consumers.backbone_train")
GROUP = "backbone-train"


@dataclass
class _Job:
    record: ConsumerRecord
    event: ev.GradientJob
    prepared: list[Prepared]
    features: list[VLAFeature | None] = field(default_factory=list)


class BackboneTrainRole:
    def __init__(self, service: Service, instance: str = "0"):
        self.service = service
        settings = self.settings = service.settings
        self.instance = instance
        self.codec = Codec()
        self.consumer = make_consumer(
            settings, GROUP, pattern=tenant_stream_pattern(settings, "gradient-jobs")
        )
        self.producer = EventProducer(
            settings, self.codec, transactional_id=f"{GROUP}-{instance}", client_id=f"{GROUP}-{instance}"
        )
        self.plain = EventProducer(settings, self.codec, client_id=f"{GROUP}-{instance}-health")
        self.heartbeat = Heartbeater(settings, self.plain, GROUP, instance, details=self._health)
        self.groups = 0
        self.rows = 0
        self.jobs = 0

    def _health(self) -> dict[str, str]:
        return {"groups": str(self.groups), "rows": str(self.rows), "jobs": str(self.jobs)}

    @property
    def mean_group_rows(self) -> float:
        return self.rows / self.groups if self.groups else 0.0

    async def start(self) -> None:
        await self.producer.start()
        await self.plain.start()
        await self.consumer.start()

    async def stop(self) -> None:
        await self.consumer.stop()
        await self.plain.stop()
        await self.producer.stop()

    async def run(self, stop: asyncio.Event) -> None:
        beats = asyncio.create_task(self.heartbeat.run(stop), name="backbone-train-heartbeat")
        try:
            while not stop.is_set():
                batches = await self.consumer.getmany(
                    timeout_ms=200, max_records=self.settings.train_max_batch_jobs
                )
                records = [r for rs in batches.values() for r in rs]
                if records:
                    await self._poll(records)
        finally:
            stop.set()
            await beats

    async def _poll(self, records: list[ConsumerRecord]) -> None:
        try:
            async with self.producer.transaction():
                await self._process(records)
                offsets: dict[TopicPartition, int] = {}
                for r in records:
                    tp = TopicPartition(r.topic, r.partition)
                    offsets[tp] = max(offsets.get(tp, 0), r.offset + 1)
                await self.producer.send_offsets_to_transaction(offsets, GROUP)
        except KafkaError as exc:
            log.warning(
                "transaction aborted; rewinding", error_class=type(exc).__name__, error=str(exc)[:300]
            )
            for tp in {TopicPartition(r.topic, r.partition) for r in records}:
                committed = await self.consumer.committed(tp)
                if committed is None:
                    await self.consumer.seek_to_beginning(tp)
                else:
                    self.consumer.seek(tp, committed)

    async def _process(self, records: list[ConsumerRecord]) -> None:
        jobs: list[_Job] = []
        for record in records:
            job = await self._decode(record)
            if job is not None:
                jobs.append(job)
        if not jobs:
            return
        usage = await self._forward(jobs)
        tenants = len({job.event.tenant_id for job in jobs})
        for job in jobs:
            await self._publish(job, tenants)
        await self._publish_usage(usage)

    async def _decode(self, record: ConsumerRecord) -> _Job | None:
        try:
            event = self.codec.decode(record.value)
            if not isinstance(event, ev.GradientJob):
                raise JoynexusError(f"expected a GradientJob, got {type(event).__name__}")
            if self.service.book.stopped(event.tenant_id, event.job_id):
                log.info(
                    "gradient job of a stopped job skipped",
                    tenant=event.tenant_id,
                    job=event.job_id,
                    batch=event.batch_id,
                )
                return None
            requests = gradient_job_requests(event)
            prepared = await asyncio.to_thread(lambda: [self.service.backbone.prepare(r) for r in requests])
        except (JoynexusError, ValueError) as exc:
            await publish_dead_letter(
                self.producer,
                self.settings.dlq_topic,
                record,
                exc,
                stage="process",
                attempts=1,
                group_id=GROUP,
                in_transaction=True,
            )
            log.error(
                "gradient job dead-lettered",
                topic=record.topic,
                offset=record.offset,
                error_class=type(exc).__name__,
                error=str(exc)[:300],
            )
            return None
        return _Job(record, event, prepared, [None] * len(prepared))

    async def _forward(self, jobs: list[_Job]) -> dict[str, float]:
        """One forward per bucket over every job's rows; returns device-seconds per tenant."""
        rows = [(job, i) for job in jobs for i in range(len(job.prepared))]
        features, forwards = await forward_grouped_on(
            self.service.gate, "train", self.service.backbone, [job.prepared[i] for job, i in rows]
        )
        for (job, i), feature in zip(rows, features, strict=True):
            job.features[i] = feature
        usage: dict[str, float] = defaultdict(float)
        for forward in forwards:
            for r in forward.rows:
                usage[rows[r][0].event.tenant_id] += forward.busy_s / len(forward.rows)
        self.groups += len(forwards)
        self.rows += len(rows)
        self.jobs += len(jobs)
        return usage

    async def _publish(self, job: _Job, tenants: int) -> None:
        event = job.event
        feature = VLAFeature.cat(job.features)
        batch = ev.FeatureBatch(
            envelope=ev.Envelope(
                tenant_id=event.tenant_id, producer_id=f"{GROUP}/{self.instance}", correlation_id=event.job_id
            ),
            job_id=event.job_id,
            batch_id=event.batch_id,
            sequence=event.sequence,
            policy_version=event.policy_version,
            backbone_id=self.service.backbone.backbone_id,
            features={
                k: self.service.tensors.offload(t)
                for k, t in feature_tensors(feature, event.needs_sequence).items()
            },
            targets=event.targets,
            group_size=tenants,
            source_offset=job.record.offset,
            publish=event.publish,
            final=event.final,
            metrics=event.metrics,
        )
        await self.producer.enqueue(
            tenant_topic(self.settings, event.tenant_id, "features"), batch, key=event.tenant_id
        )

    async def _publish_usage(self, usage: dict[str, float]) -> None:
        now = datetime.now(UTC)
        for tenant, seconds in sorted(usage.items()):
            await self.producer.enqueue(
                shared_topic(self.settings, "usage"),
                ev.UsageRecorded(
                    envelope=ev.Envelope(tenant_id=tenant, producer_id=f"{GROUP}/{self.instance}"),
                    usage_id=f"{GROUP}/{self.instance}/{now.timestamp():.6f}/{tenant}",
                    role=GROUP,
                    resource="backbone",
                    device=str(self.service.backbone.device),
                    seconds=seconds,
                    window_start=now,
                    window_end=now,
                    group_size=len(usage),
                ),
                key=tenant,
            )
