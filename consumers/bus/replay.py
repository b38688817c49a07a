"""Read a window of a topic without joining or moving any consumer group.

Windows: offsets are ``[from_offset, to_offset)`` per partition; times are
``[from_time, to_time)`` on record timestamps, located with Kafka's time index
(as ``kafka-consumer-groups --to-datetime`` does) and then filtered exactly.
The end of each partition is fixed when the replay starts, so a replay of a
live topic ends. Undecodable records are yielded with their error, not raised.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import for_code
from aiokafka.structs import TopicPartition

from infra.connection import client_options
from infra.errors import SchemaError, TopicError
from infra.settings import Settings
from schemas.codec import Codec
from schemas.events import Event

__all__ = ["ReplayedRecord", "replay"]


@dataclass(frozen=True)
class ReplayedRecord:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    value: bytes | None
    event: Event | None
    error: str | None  # why the value did not decode


def _ms(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


async def _partitions(settings: Settings, topic: str) -> list[int]:
    admin = AIOKafkaAdminClient(**client_options(settings),
                                request_timeout_ms=settings.request_timeout_ms)
    await admin.start()
    try:
        (meta,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    if meta["error_code"]:
        raise TopicError(f"topic {topic!r}: {for_code(meta['error_code']).__name__}")
    return sorted(p["partition"] for p in meta["partitions"])


async def _bounds(
    consumer: AIOKafkaConsumer, tps: list[TopicPartition], from_offset: int | None,
    from_ms: int | None, to_offset: int | None, to_ms: int | None,
) -> dict[TopicPartition, tuple[int, int]]:
    begin = await consumer.beginning_offsets(tps)
    end = await consumer.end_offsets(tps)  # last stable offset under read_committed
    starts = {tp: begin[tp] for tp in tps}
    stops = dict(end)
    if from_offset is not None:
        starts = {tp: min(max(from_offset, begin[tp]), end[tp]) for tp in tps}
    elif from_ms is not None:
        found = await consumer.offsets_for_times({tp: from_ms for tp in tps})
        starts = {tp: found[tp].offset if found[tp] else end[tp] for tp in tps}
    if to_offset is not None:
        stops = {tp: min(to_offset, end[tp]) for tp in tps}
    elif to_ms is not None:
        found = await consumer.offsets_for_times({tp: to_ms for tp in tps})
        stops = {tp: found[tp].offset if found[tp] else end[tp] for tp in tps}
    return {tp: (starts[tp], stops[tp]) for tp in tps}


async def replay(
    settings: Settings, topic: str, *, partitions: Sequence[int] | None = None,
    from_offset: int | None = None, from_time: datetime | None = None,
    to_offset: int | None = None, to_time: datetime | None = None, limit: int | None = None,
    codec: Codec | None = None, read_uncommitted: bool = False,
) -> AsyncIterator[ReplayedRecord]:
    """Yield the records of a window, partition by partition, in offset order."""
    codec = codec or Codec.for_settings(settings)
    from_ms, to_ms = _ms(from_time), _ms(to_time)
    consumer = AIOKafkaConsumer(
        **client_options(settings), client_id=f"{settings.client_id}-replay",
        group_id=None, enable_auto_commit=False,  # no group: nothing joined, nothing moved
        isolation_level="read_uncommitted" if read_uncommitted else "read_committed",
        request_timeout_ms=settings.request_timeout_ms,
    )
    await consumer.start()
    try:
        all_partitions = await _partitions(settings, topic)
        chosen = all_partitions if partitions is None else sorted(partitions)
        if missing := set(chosen) - set(all_partitions):
            raise TopicError(f"{topic} has no partition(s) {sorted(missing)}")
        tps = [TopicPartition(topic, p) for p in chosen]
        consumer.assign(tps)
        bounds = await _bounds(consumer, tps, from_offset, from_ms, to_offset, to_ms)
        emitted = 0
        for tp in tps:
            start, stop = bounds[tp]
            if start >= stop:
                continue
            consumer.assign([tp])
            consumer.seek(tp, start)
            done = False
            while not done:
                batch = await consumer.getmany(tp, timeout_ms=1000)
                records = batch.get(tp, [])
                if not records and await consumer.position(tp) >= stop:
                    break
                for rec in records:
                    if rec.offset >= stop:
                        done = True
                        break
                    if (from_ms is not None and rec.timestamp < from_ms) or (
                        to_ms is not None and rec.timestamp >= to_ms
                    ):
                        continue
                    try:
                        event, error = codec.decode(rec.value), None
                    except SchemaError as exc:
                        event, error = None, f"{type(exc).__name__}: {exc}"
                    yield ReplayedRecord(rec.topic, rec.partition, rec.offset, rec.timestamp,
                                         rec.key, tuple(rec.headers or ()), rec.value,
                                         event, error)
                    emitted += 1
                    if limit is not None and emitted >= limit:
                        return
                    if rec.offset + 1 >= stop:
                        done = True
                        break
    finally:
        await consumer.stop()
