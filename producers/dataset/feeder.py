"""The dataset feeder: a dataset's SFT minibatches as GradientJobs in one tenant's training queue.

Batches follow ``layout_batches`` (a seeded shuffle per epoch, a pure function
of seed and epoch), so batch k of epoch e is always the same samples. The log
is the feeder's position: on start it finds the last GradientJob of its job in
the tenant's gradient-jobs topic (one partition, read_committed) and goes on
with the next batch. Batches are published in transactions under the
transactional id ``feeder-<tenant>-<job>``; starting a feeder fences and
aborts whatever an earlier, killed instance left open, so after a kill no
batch is skipped and none is repeated.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from infra.connection import client_options
from infra.logging import get_logger
from infra.settings import Settings
from infra.tenant_id import validate_tenant_id
from infra.topics import tenant_topic
from producers.dataset.format import Dataset, layout_batches
from producers.producer import EventProducer
from schemas import events as ev
from schemas.codec import Codec
from schemas.tensors import from_numpy

__all__ = ["DatasetFeeder", "FeedPlan", "last_sequence"]

log = get_logger("producers.dataset.feeder")


@dataclass(frozen=True)
class FeedPlan:
    tenant: str
    job_id: str
    batch_size: int
    epochs: int
    seed: int = 0
    chunk_len: int = 1
    policy_version: int = 0
    batches_per_commit: int = 4
    publish_every: int = 0  # the optimizer publishes a version every this many steps (0: at the end)
    needs_sequence: bool = False  # the tenant's modules read the backbone's token states
    max_batches: int | None = None  # stop early (a job's limits.max_steps)
    state_in_proprio: bool = False  # the recorded state joins proprio (DatasetSpec.state_in_proprio)


async def last_sequence(settings: Settings, topic: str, job_id: str, codec: Codec | None = None,
                        window: int = 256) -> int | None:
    """The sequence of the last committed GradientJob of ``job_id`` (None: none yet)."""
    codec = codec or Codec.for_settings(settings)
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(**client_options(settings), group_id=None,
                                enable_auto_commit=False, isolation_level="read_committed")
    await consumer.start()
    try:
        consumer.assign([tp])
        begin = (await consumer.beginning_offsets([tp]))[tp]
        stop = (await consumer.end_offsets([tp]))[tp]
        while stop > begin:  # scan backwards, a window at a time
            start = max(begin, stop - window)
            consumer.seek(tp, start)
            found = None
            while await consumer.position(tp) < stop:
                for record in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                    if record.offset >= stop:
                        break
                    event = codec.decode(record.value)
                    if isinstance(event, ev.GradientJob) and event.job_id == job_id:
                        found = event.sequence
            if found is not None:
                return found
            stop = start
        return None
    finally:
        await consumer.stop()


class DatasetFeeder:
    def __init__(self, settings: Settings, dataset: Dataset, plan: FeedPlan, codec: Codec | None = None):
        validate_tenant_id(plan.tenant)
        self.settings = settings
        self.dataset = dataset
        self.plan = plan
        self.codec = codec or Codec.for_settings(settings)
        self.topic = tenant_topic(settings, plan.tenant, "gradient-jobs")
        self.per_epoch = len(layout_batches(dataset, plan.batch_size, plan.seed, 0))
        self.published = 0
        self.log = log.bind(tenant=plan.tenant, job=plan.job_id)

    @property
    def total(self) -> int:
        total = self.per_epoch * self.plan.epochs
        return total if self.plan.max_batches is None else min(total, self.plan.max_batches)

    def gradient_job(self, sequence: int) -> ev.GradientJob:
        """The GradientJob at a position of the feed: a pure function of the plan."""
        epoch, batch = divmod(sequence, self.per_epoch)
        indices = layout_batches(self.dataset, self.plan.batch_size, self.plan.seed, epoch)[batch]
        mb = self.dataset.minibatch(indices, self.plan.chunk_len)
        final, every = sequence == self.total - 1, self.plan.publish_every
        targets = {"actions": from_numpy(mb.actions.astype(np.float32)),
                   "action_mask": from_numpy(mb.action_mask)}
        return ev.GradientJob(
            envelope=ev.Envelope(tenant_id=self.plan.tenant, producer_id="dataset-feeder",
                                 correlation_id=self.plan.job_id),
            job_id=self.plan.job_id, batch_id=f"{self.plan.job_id}/e{epoch}/b{batch}", sequence=sequence,
            policy_version=self.plan.policy_version, instructions=tuple(mb.instructions),
            images=from_numpy(mb.images) if mb.images is not None else None,
            proprio=from_numpy(mb.head_proprio(self.plan.state_in_proprio)), targets=targets,
            publish=final or (every > 0 and (sequence + 1) % every == 0), final=final,
            needs_sequence=self.plan.needs_sequence, metrics={"epoch": float(epoch)})

    async def run(self, stop: asyncio.Event | None = None) -> int:
        """Publish from the first batch not yet in the log to the end; returns how many."""
        stop = stop or asyncio.Event()
        producer = EventProducer(self.settings, self.codec,
                                 transactional_id=f"feeder-{self.plan.tenant}-{self.plan.job_id}",
                                 client_id=f"feeder-{self.plan.tenant}")
        await producer.start()  # fences a killed predecessor before we look at the log
        try:
            last = await last_sequence(self.settings, self.topic, self.plan.job_id, self.codec)
            sequence = 0 if last is None else last + 1
            self.log.info("feeding", from_sequence=sequence, total=self.total, per_epoch=self.per_epoch)
            while sequence < self.total and not stop.is_set():
                end = min(sequence + self.plan.batches_per_commit, self.total)
                jobs = await asyncio.to_thread(lambda s=sequence, e=end: [self.gradient_job(i)
                                                                           for i in range(s, e)])
                async with producer.transaction():
                    for job in jobs:
                        await producer.enqueue(self.topic, job, key=self.plan.tenant)
                self.published += len(jobs)
                sequence = end
            return self.published
        finally:
            await producer.stop()
