"""Follow topics from their beginning without a consumer group: the way a role builds a read model.

A ``TopicFollower`` reads every partition of the topics that match a pattern
(new tenants' topics are picked up within ``pattern_refresh_ms``, at once by
``caught_up``), from offset 0, committed
records only, and hands each decoded event to ``apply`` (not one whose envelope names another
tenant than its topic: that is skipped and logged as a security event). It commits nothing:
a restart folds the log again, which is what makes the read model a pure
function of the log. ``caught_up`` waits until everything that existed when
it was called has been applied (read-your-writes for callers that just
published).

``settle_s`` (0: off) is for read models nobody waits on record by record: after applying a
batch, the follower lets records gather that long before it reads again, so a busy topic costs
at most one fetch cycle (request naming every assigned partition, response, decode) per
``settle_s`` instead of one per record or two. A record that arrives during a quiet spell is
applied at once; one that arrives while the follower settles is applied within two
``settle_s``; a caller in ``caught_up`` cuts the settling short, so read-your-writes waits for
no settling.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord, TopicPartition

from infra.connection import client_options
from infra.deleted_topic_lines import remember_listed
from infra.errors import SchemaError, TenantMismatch
from infra.every_topic import track_every_topic
from infra.logging import get_logger
from infra.longpoll import fetch_apart
from infra.settings import Settings
from infra.topics import check_tenant
from schemas.codec import Codec
from schemas.events import Event

__all__ = ["TopicFollower", "from_beginning"]

log = get_logger("infra.follow")

Apply = Callable[[Event, ConsumerRecord], None]
Seek = Callable[[AIOKafkaConsumer, list[TopicPartition]], Awaitable[None]]


async def from_beginning(consumer: AIOKafkaConsumer, partitions: list[TopicPartition]) -> None:
    """A ``seek`` for a follower of one whole topic."""
    await consumer.seek_to_beginning(*partitions)


class TopicFollower:
    def __init__(self, settings: Settings, pattern: str, apply: Apply, *, name: str,
                 codec: Codec | None = None, seek: Seek | None = None, settle_s: float = 0.0):
        """``seek``: instead of the whole topics of ``pattern``, read the ONE topic named
        ``pattern`` from where ``seek(consumer, partitions)`` puts each partition. ``settle_s``:
        see the module's docstring."""
        if settle_s < 0:
            raise ValueError("settle_s must be >= 0")
        self.settings = settings
        self.settle_s = settle_s
        self.pattern = pattern
        self.seek = seek
        self.apply = apply
        self.name = name
        self.codec = codec or Codec.for_settings(settings)
        self.consumer = track_every_topic(fetch_apart(AIOKafkaConsumer(
            **client_options(settings), client_id=f"{settings.client_id}-{name}",
            group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
            isolation_level="read_committed",
            # a pattern's refresh lists every topic; one assigned topic needs no refresh to be seen
            metadata_max_age_ms=settings.pattern_refresh_ms if seek is None else 300_000,
            fetch_max_wait_ms=settings.fetch_max_wait_ms)))
        remember_listed(self.consumer._client)
        self.applied = 0
        self.reads = 0  # polls that brought records: fetch cycles, what settle_s bounds
        self._task: asyncio.Task | None = None
        self._progress = asyncio.Condition()
        self._waiters = 0
        self._hurry = asyncio.Event()  # set while a caller waits in caught_up

    async def start(self) -> None:
        await self.consumer.start()
        try:
            if self.seek is None:
                self.consumer.subscribe(pattern=self.pattern)
            else:
                from infra.topics import TopicAdmin

                async with TopicAdmin(self.settings) as admin:  # TopicError if it does not exist
                    count = await admin.partitions(self.pattern)
                partitions = [TopicPartition(self.pattern, p) for p in range(count)]
                self.consumer.assign(partitions)
                await self.seek(self.consumer, partitions)
        except BaseException:
            await self.consumer.stop()
            raise
        self._task = asyncio.create_task(self._run(), name=f"follow-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.consumer.stop()

    async def __aenter__(self) -> TopicFollower:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _run(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=100)
            for records in batches.values():
                for record in records:
                    self._apply(record)
            async with self._progress:
                self._progress.notify_all()
            if batches:
                self.reads += 1
                if self.settle_s and not self._hurry.is_set():
                    # aiokafka fetches again only once everything fetched was read (infra/longpoll.py):
                    # not reading for a while is what lets the next fetch bring more at once
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._hurry.wait(), self.settle_s)

    def _apply(self, record: ConsumerRecord) -> None:
        try:
            event = self.codec.decode(record.value)
        except SchemaError as exc:
            # A read model skips what it cannot read; the role that consumes the topic dead-letters it.
            log.warning("undecodable record skipped", follower=self.name, topic=record.topic,
                        partition=record.partition, offset=record.offset, error=str(exc)[:200])
            return
        try:
            check_tenant(record.topic, event.tenant_id)
        except TenantMismatch:  # a read model folds a record under its topic's tenant or not at all
            return
        try:
            self.apply(event, record)
        except Exception as exc:  # one bad event must not stop the read model
            log.error("fold failed; event skipped", follower=self.name, topic=record.topic,
                      partition=record.partition, offset=record.offset,
                      error_class=type(exc).__name__, error=str(exc)[:300])
        self.applied += 1

    async def caught_up(self, topics: list[str], timeout_s: float = 30.0) -> None:
        """Wait until the follower has read ``topics`` up to their current ends."""
        self._waiters += 1
        self._hurry.set()
        try:
            await asyncio.wait_for(self._catch_up(topics), timeout_s)
        except TimeoutError:
            raise TimeoutError(f"{self.name} did not catch up with {topics} in {timeout_s}s") from None
        finally:
            self._waiters -= 1
            if not self._waiters:
                self._hurry.clear()

    async def _catch_up(self, topics: list[str]) -> None:
        if any(self.consumer.partitions_for_topic(t) is None for t in topics):
            # a new tenant's topic: see it (all its partitions) now, not at the next pattern refresh
            await self.consumer._client.force_metadata_update()
        ends = await self.consumer.end_offsets(
            [TopicPartition(t, p) for t in topics for p in (self.consumer.partitions_for_topic(t) or {0})])

        async def reached() -> bool:
            assigned = self.consumer.assignment()
            for tp, end in ends.items():
                if end == 0:
                    continue
                if tp not in assigned or await self.consumer.position(tp) < end:
                    return False
            return True

        while not await reached():
            if {tp for tp, end in ends.items() if end} - self.consumer.assignment():
                await self.consumer._client.force_metadata_update()  # not matched yet: ask again
            with contextlib.suppress(TimeoutError):  # re-check at least every second
                async with self._progress:
                    await asyncio.wait_for(self._progress.wait(), 1.0)
