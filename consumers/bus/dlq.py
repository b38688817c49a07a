"""The dead-letter topic ``nexus.dlq``: records that could not be decoded or processed.

A dead letter keeps the original key, value (bytes as they were) and headers,
and adds ``dlq.*`` headers (the original timestamp among them): source topic, partition and offset,
consumer group, stage (``decode`` or ``process``), error class and message,
attempts, and when it was dead-lettered. ``joynexus replay nexus.dlq`` shows them.
"""

from __future__ import annotations

import time

from aiokafka.structs import ConsumerRecord

from producers.producer import EventProducer

__all__ = ["DLQ_HEADER_PREFIX", "dead_letter_headers", "publish_dead_letter"]

DLQ_HEADER_PREFIX = "dlq."
_MAX_MESSAGE = 4000


def dead_letter_headers(
    record: ConsumerRecord, error: BaseException, *, stage: str, attempts: int, group_id: str | None
) -> list[tuple[str, bytes]]:
    original = [(k, v) for k, v in (record.headers or ()) if not k.startswith(DLQ_HEADER_PREFIX)]
    extra = {
        "source.topic": record.topic,
        "source.partition": str(record.partition),
        "source.offset": str(record.offset),
        "source.timestamp": str(record.timestamp),
        "group": group_id or "",
        "stage": stage,
        "error.class": type(error).__name__,
        "error.message": str(error)[:_MAX_MESSAGE],
        "attempts": str(attempts),
        "dead_lettered_at": str(int(time.time() * 1000)),
    }
    return original + [(DLQ_HEADER_PREFIX + k, v.encode()) for k, v in extra.items()]


async def publish_dead_letter(
    producer: EventProducer, topic: str, record: ConsumerRecord, error: BaseException, *,
    stage: str, attempts: int, group_id: str | None, in_transaction: bool = False,
) -> None:
    """Publish a dead letter; outside a transaction, return only once it is acknowledged.

    The dead letter is stamped now, not with the source record's time: retention
    counts from the record timestamp, and a letter about a month-old record would
    otherwise be deleted by the DLQ's 30-day retention as soon as it landed.
    """
    headers = dead_letter_headers(record, error, stage=stage, attempts=attempts, group_id=group_id)
    args = (topic, record.value, record.key, headers)
    if in_transaction:
        await producer.enqueue_raw(*args)
    else:
        await producer.send_raw(*args)
