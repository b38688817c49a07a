"""Small helpers shared by the broker tests."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from consumers.bus.replay import ReplayedRecord, replay
from infra.settings import Settings


async def read_topic(settings: Settings, topic: str, **window) -> list[ReplayedRecord]:
    return [r async for r in replay(settings, topic, **window)]


async def wait_for(predicate: Callable[[], bool | Awaitable[bool]], timeout_s: float = 60.0,
                   what: str = "condition") -> None:
    """Poll until true; generous bounds, never a timing assertion."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def running(worker) -> AsyncIterator[None]:
    """Start a ConsumeLoop/TransformWorker, run it in a task, stop it on exit."""
    await worker.start()
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        yield
    finally:
        stop.set()
        try:
            await asyncio.wait_for(task, 30)
        finally:
            await worker.stop()


async def dead_letters_from(settings: Settings, source_topic: str) -> list[ReplayedRecord]:
    """The DLQ is shared and partitioned: pick the dead letters of one source topic."""
    return [r for r in await read_topic(settings, settings.dlq_topic)
            if dict(r.headers).get("dlq.source.topic") == source_topic.encode()]


async def end_offset(settings: Settings, topic: str, partition: int = 0) -> int:
    """The partition's end offset (cheap progress probe; counts transaction markers too)."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    from infra.connection import client_options

    tp = TopicPartition(topic, partition)
    consumer = AIOKafkaConsumer(**client_options(settings), group_id=None)
    await consumer.start()
    try:
        return (await consumer.end_offsets([tp]))[tp]
    finally:
        await consumer.stop()


class LogRecords(logging.Handler):
    """Every record logged to the loggers it is added to, as the logging module made it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
