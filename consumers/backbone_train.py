"""The backbone-train role: many tenants' gradient jobs, one backbone forward per compatible group.

Consumer group ``backbone-train`` on every tenant's gradient-jobs topic. Each
poll takes up to ``train_max_batch_jobs`` jobs, at least one of every tenant that has one
waiting (``consumers/bus/fair.py``), splits them
into rows, groups the rows by bucket (same camera count and padded length),
runs ONE forward per bucket on the device gate's training queue (inference
goes first), and puts each job's rows back together as that tenant's
FeatureBatch: features plus the targets its loss needs, passed through. Rows
whose features are in the process's feature cache (forwarded for an earlier
job, or by inference when it acted on that observation) are not forwarded
again: a cached row holds the bits a forward would compute. Partitions none of whose jobs
needs a forward commit before the poll's forward runs, so such a job never waits for another
tenant's.

A PPO iteration comes as ONE job: its rows once (images by reference above
``tensor_inline_max_bytes``) and every epoch's minibatches as row indices; it
becomes one FeatureBatch per minibatch, in order (batch id ``<batch_id>/mb<j>``,
sequence ``sequence + j``, the targets cut to the minibatch's rows), byte for
byte what one job per minibatch would have given, so the optimizer cannot tell.
Each row is decoded, hashed and looked up once per iteration instead of once
per epoch, and the bus carries each image once (one job per minibatch, as
until 2026-12-02, carried it ``ppo_epochs`` times).

Commits: one forward spans partitions, but each input partition commits its
own outputs (feature batches, usage, dead letters) and its offset in its OWN
transaction, with the transactional id ``backbone-train-<topic>-<partition>``
(as the TransformWorker does). So several instances share the work, a
partition can move between them, and whoever takes a partition over starts a
producer with that id, which fences the previous owner: a paused instance that
wakes after its partitions moved cannot publish. A crash between two
partitions' commits re-runs the uncommitted ones; features are a deterministic
function of the job, so the re-run publishes the same bytes.

Usage: each forward's device-seconds are split between tenants by their
share of its rows, published as ``UsageRecorded`` on ``nexus.usage`` with an
id made of the input partition and offsets (a re-run cannot count twice).
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
from aiokafka import ConsumerRebalanceListener
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord, TopicPartition

from backbone.feature import VLAFeature
from backbone.feature_cache import for_request
from backbone.grouped import forward_grouped_on
from backbone.inputs import Prepared
from consumers.bus.dlq import publish_dead_letter
from consumers.bus.fair import getmany_fair
from consumers.bus.loop import make_consumer
from consumers.bus.protocols import Workload
from consumers.bus.transform import PartitionProducers
from consumers.convert import feature_tensors, gradient_job_requests, minibatch_rows, minibatch_targets
from consumers.service import Service
from infra.errors import JoynexusError, TenantMismatch
from infra.logging import get_logger
from infra.topics import check_tenant, shared_topic, tenant_stream_pattern, tenant_topic
from producers.producer import EventProducer
from schemas import events as ev
from schemas.codec import Codec

__all__ = ["BackboneTrainRole"]

log = get_logger("consumers.backbone_train")
GROUP = "backbone-train"


@dataclass
class _Job:
    """A gradient job's rows: each either found in the feature cache (its feature set, nothing
    prepared) or prepared for the forward."""

    record: ConsumerRecord
    event: ev.GradientJob  # every tensor inline
    minibatches: list[np.ndarray]  # row indices, one array per feature batch to publish
    keys: list[str]  # in the feature cache
    prepared: list[Prepared | None]
    features: list[VLAFeature | None]

    @property
    def cached(self) -> bool:
        """Every row's feature came from the cache: the job needs no forward."""
        return all(f is not None for f in self.features)


class _Listener(ConsumerRebalanceListener):
    def __init__(self, role: BackboneTrainRole):
        self.role = role

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.role.producers.revoked |= set(revoked)  # closed between polls

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.role.producers.revoked -= set(assigned)


class BackboneTrainRole:
    def __init__(self, service: Service, instance: str = "0"):
        self.service = service
        settings = self.settings = service.settings
        self.instance = instance
        self.codec = Codec.for_settings(service.settings)
        self.consumer = make_consumer(
            settings, GROUP, pattern=tenant_stream_pattern(settings, "gradient-jobs"),
            listener=_Listener(self),
        )
        self.producers = PartitionProducers(settings, self.codec, GROUP, f"{GROUP}-{instance}")
        self.groups = 0
        self.rows_by_tenant: Counter[str] = Counter()  # forwarded: a tenant's rows the cache did not hold
        self.rows_requested = 0
        self.hits = 0  # this role's: inference shares the cache
        self.jobs = 0
        # features by content: PPO epochs and SFT dataset epochs send the same inputs again, and RL
        # sends what inference already computed when acting (the process's one cache, Service.features)
        self.cache = service.features
        self.committed = 0
        self.aborted = 0
        self.polls = 0

    def workload(self) -> Workload:
        # a poll's forwards run in chunks between inference's (backbone.gate): each chunk is progress,
        # or a long poll behind busy inference would look HUNG before its jobs finish
        return Workload((self.consumer,), done=self.jobs + self.service.gate.forwards["train"],
                        details={"forwards": self.groups, "mean_group_rows": round(self.mean_group_rows, 2),
                                 "rows_forwarded": self.rows, "rows_requested": self.rows_requested,
                                 "cache_hits": self.hits, "commits": self.committed,
                                 "aborts": self.aborted})

    @property
    def rows(self) -> int:
        """Rows forwarded, every tenant's."""
        return sum(self.rows_by_tenant.values())

    @property
    def mean_group_rows(self) -> float:
        return self.rows / self.groups if self.groups else 0.0

    async def start(self) -> None:
        await self.consumer.start()

    async def stop(self) -> None:
        await self.consumer.stop()
        await self.producers.close_all()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.producers.close_revoked()
            # every tenant with jobs waiting gets a share of each poll: a sync RL tenant's one
            # job an iteration must not wait behind an SFT tenant's hundreds (bus/fair.py)
            self.polls += 1
            batches = await getmany_fair(self.consumer, self.settings.train_max_batch_jobs, 200, self.polls)
            if batches:
                await self._poll(batches)

    async def _poll(self, batches: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        """Decode every partition's jobs; commit first the partitions none of whose jobs needs a
        forward, then run the forwards for the others' jobs at once and commit those, each
        partition in its own transaction. A sync RL tenant's iteration, every row cached when
        inference acted, would otherwise wait for the forward of an SFT tenant's jobs polled with
        it, on the training queue that yields to inference, while its simulators idle; features
        do not depend on that order (a cached row holds the bits a forward would compute)."""
        decoded = {tp: [await self._decode(r) for r in records] for tp, records in batches.items()}
        tenants = len({job.event.tenant_id for items in decoded.values() for job in items
                       if isinstance(job, _Job)})
        cached = {tp for tp, items in decoded.items()
                  if all(not isinstance(job, _Job) or job.cached for job in items)}
        for part in ([tp for tp in batches if tp in cached], [tp for tp in batches if tp not in cached]):
            jobs = [job for tp in part for job in decoded[tp] if isinstance(job, _Job)]
            usage = await self._forward(jobs) if jobs else {}
            for tp in part:
                await self._commit_partition(tp, batches[tp], decoded[tp], usage, tenants)

    async def _commit_partition(self, tp: TopicPartition, records: list[ConsumerRecord],
                                items: list[_Job | Exception], usage: dict[str, float], tenants: int) -> None:
        try:
            producer = await self.producers.get(tp)  # fences whoever held this partition before
            async with producer.transaction():
                for record, item in zip(records, items, strict=True):
                    if isinstance(item, _Job):
                        await self._publish(producer, item, tenants)
                    elif item is not None:
                        stage = "security" if isinstance(item, TenantMismatch) else "process"
                        await publish_dead_letter(producer, self.settings.dlq_topic, record, item,
                                                  stage=stage, attempts=1, group_id=GROUP,
                                                  in_transaction=True)
                await self._publish_usage(producer, tp, records, items, usage)
                await producer.send_offsets_to_transaction({tp: records[-1].offset + 1}, GROUP)
        except KafkaError as exc:
            self.aborted += 1
            log.warning("transaction aborted; rewinding", topic=tp.topic, partition=tp.partition,
                        error_class=type(exc).__name__, error=str(exc)[:300])
            await self.producers.close(tp)
            await self._rewind(tp)
            return
        self.committed += 1

    async def _rewind(self, tp: TopicPartition) -> None:
        if tp not in self.consumer.assignment():
            return  # moved to another instance: it starts from the committed offset
        try:
            committed = await self.consumer.committed(tp)
        except KafkaError as exc:
            log.warning("cannot read committed offset; the next rebalance rewinds", error=str(exc)[:200])
            return
        if committed is None:
            await self.consumer.seek_to_beginning(tp)
        else:
            self.consumer.seek(tp, committed)

    async def _decode(self, record: ConsumerRecord) -> _Job | Exception | None:
        """The record as a job ready for the forward; None to skip it (its job is stopped); the
        error when it cannot be processed (it goes to the DLQ in its partition's transaction)."""
        try:
            event = self.codec.decode(record.value)
            if not isinstance(event, ev.GradientJob):
                raise JoynexusError(f"expected a GradientJob, got {type(event).__name__}")
            check_tenant(record.topic, event.tenant_id)  # TenantMismatch: a forged envelope
            if self.service.book.stopped(event.tenant_id, event.job_id):
                log.info("gradient job of a stopped job skipped", tenant=event.tenant_id, job=event.job_id,
                         batch=event.batch_id)
                return None
            event = await asyncio.to_thread(self._resolved, event)  # a blob read + sha256: off the loop
            # each row's cached feature, or else its prepared input: a hit is never prepared
            # (preparing costs several times the forward's CPU on a CPU device host); the cache is
            # read here, on the loop, where inference writes it
            requests = gradient_job_requests(event)
            minibatches = minibatch_rows(event, len(requests))
            keys = [self.cache.key(r) for r in requests]
            features = [self.cache.get(k, r) for k, r in zip(keys, requests, strict=True)]
            prepare = self.service.backbone.prepare
            prepared = await asyncio.to_thread(
                lambda: [prepare(r) if f is None else None for r, f in zip(requests, features, strict=True)])
        except (JoynexusError, ValueError) as exc:
            log.error("gradient job dead-lettered", topic=record.topic, offset=record.offset,
                      error_class=type(exc).__name__, error=str(exc)[:300])
            return exc
        self.hits += sum(f is not None for f in features)
        return _Job(record, event, minibatches, keys, prepared, features)

    def _resolved(self, job: ev.GradientJob) -> ev.GradientJob:
        """``job`` with its tensors' bytes inline (an iteration's images travel by reference)."""
        resolve = self.service.tensors.resolve
        return job.model_copy(update={
            "images": resolve(job.images) if job.images is not None else None,
            "proprio": resolve(job.proprio) if job.proprio is not None else None,
            "targets": {name: resolve(t) for name, t in job.targets.items()},
        })

    async def _forward(self, jobs: list[_Job]) -> dict[str, float]:
        """One forward per bucket over every job's rows that are not cached (each distinct input once);
        returns device-seconds per tenant (a cached row costs nothing)."""
        requested = sum(len(job.keys) for job in jobs)
        rows = [(job, i) for job in jobs for i in range(len(job.keys)) if job.features[i] is None]
        first: dict[str, int] = {}
        for r, (job, i) in enumerate(rows):
            first.setdefault(job.keys[i], r)
        todo = list(first.values())
        computed, forwards = await forward_grouped_on(
            self.service.gate, "train", self.service.backbone, [rows[r][0].prepared[rows[r][1]] for r in todo]
        )
        by_key = {}
        for r, feature in zip(todo, computed, strict=True):
            job, i = rows[r]
            self.cache.put(job.keys[i], feature)
            by_key[job.keys[i]] = feature
        for job, i in rows:  # a row of this poll's forward, or a repeat of one
            job.features[i] = for_request(by_key[job.keys[i]], job.prepared[i])
        usage: dict[str, float] = defaultdict(float)
        for forward in forwards:
            for r in forward.rows:
                usage[rows[todo[r]][0].event.tenant_id] += forward.busy_s / len(forward.rows)
        self.groups += len(forwards)
        self.rows_by_tenant.update(rows[r][0].event.tenant_id for r in todo)
        self.rows_requested += requested
        self.jobs += len(jobs)
        return usage

    async def _publish(self, producer: EventProducer, job: _Job, tenants: int) -> None:
        """One FeatureBatch per minibatch of the job; publish and final go with the last."""
        event = job.event
        topic = tenant_topic(self.settings, event.tenant_id, "features")
        whole = not event.minibatches  # the job is one minibatch: its targets pass through untouched
        for j, rows in enumerate(job.minibatches):
            last = j == len(job.minibatches) - 1
            feature = VLAFeature.cat([job.features[i] for i in rows])
            batch = ev.FeatureBatch(
                envelope=ev.Envelope(
                    tenant_id=event.tenant_id, producer_id=f"{GROUP}/{self.instance}",
                    correlation_id=event.job_id,
                ),
                job_id=event.job_id,
                batch_id=event.batch_id if whole else f"{event.batch_id}/mb{j}",
                sequence=event.sequence + j,
                policy_version=event.policy_version,
                backbone_id=self.service.backbone.backbone_id,
                features={
                    k: self.service.tensors.offload(t)
                    for k, t in feature_tensors(feature, event.needs_sequence).items()
                },
                targets=event.targets if whole else minibatch_targets(event.targets, rows),
                group_size=tenants,
                source_offset=job.record.offset,
                publish=event.publish and last,
                final=event.final and last,
                metrics=event.metrics,
            )
            await producer.enqueue(topic, batch, key=event.tenant_id)

    async def _publish_usage(self, producer: EventProducer, tp: TopicPartition,
                             records: list[ConsumerRecord], items: list, usage: dict[str, float]) -> None:
        """This partition's tenants' share of the poll's forwards (a gradient-jobs partition is one
        tenant's, so this is that tenant's device time for these records)."""
        now = datetime.now(UTC)
        tenants = sorted({item.event.tenant_id for item in items if isinstance(item, _Job)})
        for tenant in tenants:
            await producer.enqueue(
                shared_topic(self.settings, "usage"),
                ev.UsageRecorded(
                    envelope=ev.Envelope(tenant_id=tenant, producer_id=f"{GROUP}/{self.instance}"),
                    usage_id=f"{GROUP}/{tp.topic}/{tp.partition}/{records[0].offset}-{records[-1].offset}",
                    role=GROUP,
                    resource="backbone",
                    device=str(self.service.backbone.device),
                    seconds=usage.get(tenant, 0.0),
                    window_start=now,
                    window_end=now,
                    group_size=len(usage),
                ),
                key=tenant,
            )
