"""Consume-transform-produce, exactly once: outputs and input offsets in ONE transaction.

aiokafka's transaction requests are protocol v0: ``send_offsets_to_transaction``
carries only the group id, not the group generation (no KIP-447 fencing). So,
as faust does, there is one transactional producer per input partition, with
the transactional id ``{group}-{topic}-{partition}``. Whoever owns a partition
after a rebalance or a restart starts a producer with the same id, which
fences the previous owner: its pending transaction can no longer commit.

Per partition batch: begin; decode each record (undecodable ones go to the
DLQ inside the transaction); transform (retried, then dead-lettered); enqueue
the outputs; add the next input offset; commit. On any error: abort, and seek
the partition back to its committed offset, so the batch is done again.
Outputs are read with ``isolation_level="read_committed"``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka import ConsumerRebalanceListener
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord, TopicPartition

from consumers.bus.dlq import publish_dead_letter
from consumers.bus.loop import bind_record, context_of, invoke_with_retries, make_consumer
from consumers.bus.protocols import Output, RecordContext, Transform
from infra.errors import ProcessingError, SchemaError, TenantMismatch
from infra.logging import get_logger
from infra.settings import Settings
from infra.topics import check_tenant
from producers.producer import EventProducer
from schemas.codec import Codec

__all__ = ["PartitionProducers", "TransformWorker", "transactional_id"]

log = get_logger("consumers.bus.transform")


def transactional_id(group_id: str, tp: TopicPartition) -> str:
    return f"{group_id}-{tp.topic}-{tp.partition}"


class PartitionProducers:
    """One transactional producer per input partition, ``{group}-{topic}-{partition}``: starting
    one fences whoever held the partition before. Closed when the partition is revoked (between
    batches, never under one) or when a transaction on it failed (a fenced producer is not reused).
    """

    def __init__(self, settings: Settings, codec: Codec, group_id: str, client_prefix: str):
        self.settings, self.codec = settings, codec
        self.group_id, self.client_prefix = group_id, client_prefix
        self._producers: dict[TopicPartition, EventProducer] = {}
        self.revoked: set[TopicPartition] = set()

    async def get(self, tp: TopicPartition) -> EventProducer:
        if tp not in self._producers:
            producer = EventProducer(self.settings, self.codec,
                                     transactional_id=transactional_id(self.group_id, tp),
                                     client_id=f"{self.client_prefix}-{tp.topic}-{tp.partition}")
            await producer.start()
            self._producers[tp] = producer
        return self._producers[tp]

    async def close(self, tp: TopicPartition) -> None:
        producer = self._producers.pop(tp, None)
        if producer is not None:
            try:
                await producer.stop()
            except KafkaError as exc:  # a fenced producer may complain on close
                log.warning("closing producer failed", error=str(exc)[:200])

    async def close_revoked(self) -> None:
        for tp in [tp for tp in self._producers if tp in self.revoked]:
            await self.close(tp)

    async def close_all(self) -> None:
        for tp in list(self._producers):
            await self.close(tp)


class _Listener(ConsumerRebalanceListener):
    def __init__(self, worker: TransformWorker):
        self._worker = worker

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self._worker.producers.revoked |= set(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._worker.producers.revoked -= set(assigned)
        log.info("partitions assigned", group=self._worker.group_id,
                 partitions=sorted(f"{tp.topic}:{tp.partition}" for tp in assigned))


class TransformWorker:
    """Runs a ``Transform`` over topics with exactly-once output."""

    def __init__(
        self, settings: Settings, *, group_id: str, transform: Transform, role: str,
        topics: Sequence[str] = (), pattern: str | None = None, codec: Codec | None = None,
    ):
        self.settings = settings
        self.group_id = group_id
        self.transform = transform
        self.role = role
        self.codec = codec or Codec.for_settings(settings)
        self.consumer = make_consumer(settings, group_id, topics=topics, pattern=pattern,
                                      listener=_Listener(self))
        self.producers = PartitionProducers(settings, self.codec, group_id, role)
        self._to_rewind: set[TopicPartition] = set()
        self.committed_batches = 0
        self.aborted_batches = 0

    async def start(self) -> None:
        await self.consumer.start()

    async def stop(self) -> None:
        await self.producers.close_all()
        await self.consumer.stop()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        while not stop.is_set():
            await self.producers.close_revoked()
            await self._rewind_pending()
            batches = await self.consumer.getmany(timeout_ms=200)
            for tp, records in batches.items():
                if tp not in self._to_rewind:
                    await self._run_batch(tp, records)

    async def _run_batch(self, tp: TopicPartition, records: list[ConsumerRecord]) -> None:
        producer = await self.producers.get(tp)
        try:
            async with producer.transaction():
                for record in records:
                    await self._process(producer, record)
                await producer.send_offsets_to_transaction({tp: records[-1].offset + 1},
                                                           self.group_id)
        except (KafkaError, ProcessingError) as exc:
            self.aborted_batches += 1
            log.warning("transaction aborted; rewinding", topic=tp.topic, partition=tp.partition,
                        error_class=type(exc).__name__, error=str(exc)[:300])
            await self.producers.close(tp)
            await self._rewind(tp)
            return
        self.committed_batches += 1

    async def _process(self, producer: EventProducer, record: ConsumerRecord) -> None:
        ctx: RecordContext = context_of(record, self.group_id)
        with bind_record(self.role, record):
            try:
                event = self.codec.decode(record.value)
            except SchemaError as exc:
                await self._dead_letter(producer, record, exc, "decode", 1)
                return
            try:
                check_tenant(record.topic, event.tenant_id)
            except TenantMismatch as exc:  # the topic decides the tenant; a forged body is refused
                await self._dead_letter(producer, record, exc, "security", 1)
                return
            try:
                outputs: Sequence[Output] = await invoke_with_retries(
                    self.transform, event, ctx, self.settings.max_attempts,
                    self.settings.retry_backoff_s)
            except ProcessingError as exc:
                await self._dead_letter(producer, record, exc.__cause__ or exc, "process",
                                        self.settings.max_attempts)
                return
            for out in outputs:
                await producer.enqueue(out.topic, out.event, out.key)

    async def _dead_letter(self, producer: EventProducer, record: ConsumerRecord,
                           exc: BaseException, stage: str, attempts: int) -> None:
        await publish_dead_letter(producer, self.settings.dlq_topic, record, exc, stage=stage,
                                  attempts=attempts, group_id=self.group_id, in_transaction=True)
        log.error("record dead-lettered", stage=stage, error_class=type(exc).__name__,
                  error=str(exc)[:500])

    async def _rewind(self, tp: TopicPartition) -> None:
        """Go back to the committed offset; while the broker cannot say where that is,
        the partition stays paused so nothing is read from a wrong position."""
        self._to_rewind.add(tp)
        self.consumer.pause(tp)
        await self._rewind_pending()

    async def _rewind_pending(self) -> None:
        for tp in list(self._to_rewind):
            if tp not in self.consumer.assignment():
                self._to_rewind.discard(tp)  # the next owner starts from the committed offset
                continue
            try:
                committed = await self.consumer.committed(tp)
            except KafkaError as exc:
                log.warning("cannot read committed offset yet", topic=tp.topic,
                            partition=tp.partition, error_class=type(exc).__name__)
                await asyncio.sleep(self.settings.retry_backoff_s)
                continue
            if committed is None:
                await self.consumer.seek_to_beginning(tp)
            else:
                self.consumer.seek(tp, committed)
            self._to_rewind.discard(tp)
            self.consumer.resume(tp)
