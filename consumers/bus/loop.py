"""The shared consume loop: at-least-once processing with manual commits and a DLQ.

For every record: decode (a record that does not decode goes to the DLQ at
once, and so does one whose envelope names another tenant than its topic: a
security event), call the handler with up to ``settings.max_attempts`` attempts
(then the DLQ), and after each partition's batch commit the next offset. The DLQ publish
is acknowledged before the commit, so a record is never lost: at worst, after
a crash, it is handled again (handlers are idempotent).

Heartbeats: aiokafka heartbeats on the event loop, so a handler that hogs the
loop starves them (aiokafka #848). Plain-function handlers therefore run in a
worker thread (``asyncio.to_thread``); coroutine handlers must not block.
``max_poll_interval_ms`` then only needs to cover one batch of slow handlers.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord, TopicPartition

from consumers.bus.dlq import publish_dead_letter
from consumers.bus.protocols import Handler, RecordContext
from infra.connection import client_options
from infra.deleted_topic_lines import remember_listed
from infra.errors import ProcessingError, SchemaError, TenantMismatch
from infra.every_topic import track_every_topic
from infra.logging import get_logger
from infra.longpoll import fetch_apart
from infra.settings import Settings
from infra.topics import check_tenant, parse_topic
from producers.producer import EventProducer
from schemas.codec import Codec
from schemas.events import Event

__all__ = ["COMMIT_TIMEOUT_S", "ConsumeLoop", "StartAt", "commit_within", "context_of", "invoke_with_retries",
           "make_consumer"]

log = get_logger("consumers.bus.loop")

COMMIT_TIMEOUT_S = 5.0


async def commit_within(consumer: AIOKafkaConsumer, offsets: dict[TopicPartition, int]) -> None:
    """``consumer.commit(offsets)``, given up after ``COMMIT_TIMEOUT_S`` (raises TimeoutError).

    aiokafka retries a retriable commit error forever, and a partition whose topic was deleted
    (``tenant delete``) answers UNKNOWN_TOPIC_OR_PARTITION until the next rebalance takes it away:
    a role awaiting that commit stopped for good (the inference role answered nothing more,
    2026-12-03). Every caller treats a failed commit as "read again later", which costs nothing."""
    await asyncio.wait_for(consumer.commit(offsets), COMMIT_TIMEOUT_S)


@dataclass(frozen=True)
class StartAt:
    """Where a loop starts reading a partition the first time it gets it (replay).

    Without one, a group resumes from its committed offsets (earliest if none).
    """

    offset: int | None = None
    time: datetime | None = None


def make_consumer(
    settings: Settings, group_id: str | None, *, topics: Sequence[str] = (),
    pattern: str | None = None, listener: ConsumerRebalanceListener | None = None,
    isolation_level: str = "read_committed", assignors: tuple | None = None,
) -> AIOKafkaConsumer:
    extra = {"partition_assignment_strategy": assignors} if assignors else {}
    consumer = AIOKafkaConsumer(
        **client_options(settings),
        client_id=settings.client_id,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level=isolation_level,
        max_poll_records=settings.max_poll_records,
        fetch_max_wait_ms=settings.fetch_max_wait_ms,
        max_poll_interval_ms=settings.max_poll_interval_ms,
        session_timeout_ms=settings.session_timeout_ms,
        heartbeat_interval_ms=settings.heartbeat_interval_ms,
        request_timeout_ms=settings.request_timeout_ms,
        metadata_max_age_ms=settings.pattern_refresh_ms if pattern else 300_000,  # see new tenants soon
        **extra,
    )
    track_every_topic(fetch_apart(consumer))
    remember_listed(consumer._client)
    if pattern:
        consumer.subscribe(pattern=pattern, listener=listener)
    elif topics:
        consumer.subscribe(list(topics), listener=listener)
    return consumer


def tenant_of_topic(topic: str) -> str | None:
    name = parse_topic(topic)
    return name.tenant if name else None


def context_of(record: ConsumerRecord, group_id: str | None) -> RecordContext:
    return RecordContext(
        topic=record.topic, partition=record.partition, offset=record.offset,
        timestamp_ms=record.timestamp, key=record.key,
        headers=tuple(record.headers or ()), group_id=group_id,
    )


def bind_record(role: str, record: ConsumerRecord, tenant: str | None = None):
    """Bind role/tenant/topic/partition/offset to every log line of this record."""
    return structlog.contextvars.bound_contextvars(
        role=role, tenant=tenant or tenant_of_topic(record.topic),
        topic=record.topic, partition=record.partition, offset=record.offset,
    )


async def invoke_with_retries(
    fn: Callable[..., Any], event: Event, ctx: RecordContext, attempts: int, backoff_s: float,
) -> Any:
    """Call a handler or transform; raise ProcessingError after the last failed attempt."""
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    )
    last: BaseException | None = None
    for attempt in range(1, attempts + 1):
        actx = replace(ctx, attempt=attempt)
        try:
            if is_async:
                return await fn(event, actx)
            return await asyncio.to_thread(fn, event, actx)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            last = exc
            log.warning("handler failed", attempt=attempt, of=attempts,
                        error_class=type(exc).__name__, error=str(exc)[:500])
            if attempt < attempts:
                await asyncio.sleep(backoff_s * attempt)
    raise ProcessingError(f"failed {attempts} times: {type(last).__name__}: {last}") from last


class _Listener(ConsumerRebalanceListener):
    def __init__(self, loop: ConsumeLoop):
        self._loop = loop

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        # Offsets are committed after every batch, so nothing is pending here.
        if revoked:
            log.info("partitions revoked", group=self._loop.group_id,
                     partitions=sorted(f"{tp.topic}:{tp.partition}" for tp in revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._loop.assignments += 1
        if assigned:
            log.info("partitions assigned", group=self._loop.group_id,
                     partitions=sorted(f"{tp.topic}:{tp.partition}" for tp in assigned))
        await self._loop._apply_start(assigned)


class ConsumeLoop:
    """Consume topics (a list or a pattern) as one consumer group and call a handler."""

    def __init__(
        self, settings: Settings, *, group_id: str, handler: Handler, role: str,
        topics: Sequence[str] = (), pattern: str | None = None, codec: Codec | None = None,
        start_at: StartAt | None = None, dlq_producer: EventProducer | None = None,
    ):
        if bool(topics) == bool(pattern):
            raise ValueError("give either topics or a pattern")
        self.settings = settings
        self.group_id = group_id
        self.handler = handler
        self.role = role
        self.codec = codec or Codec.for_settings(settings)
        self.start_at = start_at
        self._started: set[TopicPartition] = set()
        self._pending: dict[TopicPartition, int] = {}
        self._own_producer = dlq_producer is None
        self.producer = dlq_producer or EventProducer(settings, self.codec,
                                                      client_id=f"{role}-dlq")
        self.consumer = make_consumer(settings, group_id, topics=topics, pattern=pattern,
                                      listener=_Listener(self))
        self.processed = 0
        self.dead_lettered = 0
        self.assignments = 0  # rebalances this member went through (1 = no rebalance)

    async def _apply_start(self, assigned: set[TopicPartition]) -> None:
        fresh = [tp for tp in assigned if tp not in self._started]
        self._started |= set(fresh)
        if not self.start_at or not fresh:
            return
        if self.start_at.offset is not None:
            for tp in fresh:
                self.consumer.seek(tp, self.start_at.offset)
        elif self.start_at.time is not None:
            ms = int(self.start_at.time.timestamp() * 1000)
            found = await self.consumer.offsets_for_times({tp: ms for tp in fresh})
            ends = await self.consumer.end_offsets(fresh)
            for tp in fresh:
                self.consumer.seek(tp, found[tp].offset if found[tp] else ends[tp])

    async def start(self) -> None:
        if self._own_producer:
            await self.producer.start()
        await self.consumer.start()

    async def stop(self) -> None:
        await self.consumer.stop()
        if self._own_producer:
            await self.producer.stop()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Consume until ``stop`` is set (or forever). Call ``start`` first."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            await self._commit_pending()
            batches = await self.consumer.getmany(timeout_ms=200)
            for tp, records in batches.items():
                for record in records:
                    await self._process(record)
                self._pending[tp] = records[-1].offset + 1
            await self._commit_pending()
        await self._commit_pending()

    async def _commit_pending(self) -> None:
        """Commit processed offsets; on a broker hiccup keep them and try again later.

        The records are already handled, so a failed commit only means they may
        be handled again after a rebalance (at least once), never lost.
        """
        owned = self.consumer.assignment()
        offsets = {tp: off for tp, off in self._pending.items() if tp in owned}
        if not offsets:
            self._pending.clear()
            return
        try:
            await commit_within(self.consumer, offsets)
        except (KafkaError, TimeoutError) as exc:
            log.warning("commit failed; will retry", error_class=type(exc).__name__,
                        error=str(exc)[:300])
            await asyncio.sleep(self.settings.retry_backoff_s)
            return
        self._pending.clear()

    async def _process(self, record: ConsumerRecord) -> None:
        ctx = context_of(record, self.group_id)
        with bind_record(self.role, record):
            try:
                event = self.codec.decode(record.value)
            except SchemaError as exc:
                await self._dead_letter(record, exc, "decode", 1)
                return
            try:
                check_tenant(record.topic, event.tenant_id)
            except TenantMismatch as exc:
                await self._dead_letter(record, exc, "security", 1)
                return
            with structlog.contextvars.bound_contextvars(tenant=event.tenant_id or
                                                         tenant_of_topic(record.topic)):
                try:
                    await invoke_with_retries(self.handler, event, ctx,
                                              self.settings.max_attempts,
                                              self.settings.retry_backoff_s)
                except ProcessingError as exc:
                    await self._dead_letter(record, exc.__cause__ or exc, "process",
                                            self.settings.max_attempts)
                    return
        self.processed += 1

    async def _dead_letter(self, record: ConsumerRecord, exc: BaseException, stage: str,
                           attempts: int) -> None:
        # The partition cannot move past this record until its dead letter is
        # acknowledged: keep trying through broker outages rather than drop it.
        while True:
            try:
                await publish_dead_letter(self.producer, self.settings.dlq_topic, record, exc,
                                          stage=stage, attempts=attempts, group_id=self.group_id)
                break
            except KafkaError as send_error:
                log.warning("dead-letter publish failed; retrying",
                            error_class=type(send_error).__name__)
                await asyncio.sleep(max(self.settings.retry_backoff_s, 1.0))
        self.dead_lettered += 1
        log.error("record dead-lettered", stage=stage, error_class=type(exc).__name__,
                  error=str(exc)[:500])
