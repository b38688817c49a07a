"""``getmany_fair`` on the real broker: a partition with one record waiting is served in the next
poll even when another partition has two hundred buffered before it, and over the polls every record
of every partition comes exactly once, in its partition's order."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.structs import TopicPartition

from consumers.bus.fair import getmany_fair
from consumers.bus.loop import make_consumer
from infra.settings import Settings
from infra.topics import TopicAdmin
from producers.producer import EventProducer

pytestmark = pytest.mark.broker


async def test_each_partition_with_records_gets_a_share_of_a_poll(settings: Settings, unique: str) -> None:
    topic = f"test.fair.{unique}"
    busy, urgent = TopicPartition(topic, 0), TopicPartition(topic, 1)
    async with TopicAdmin(settings) as admin:
        await admin.ensure_topic(topic, 2)
    consumer = make_consumer(settings, f"fair-{unique}", topics=[topic])
    await consumer.start()
    try:
        async with EventProducer(settings) as producer:
            for i in range(200):  # the busy tenant's backlog...
                await producer.send_raw(topic, f"busy-{i}".encode(), partition=0)
            # ...fetched and buffered before the other partition has anything
            polls = [await consumer.getmany(busy, timeout_ms=10_000, max_records=1)]
            assert polls[0] and busy in polls[0]
            await producer.send_raw(topic, b"urgent", partition=1)
        while sum(len(r) for poll in polls for r in poll.values()) < 201:
            await asyncio.sleep(0.2)  # a role works between its polls; the fetcher fetches meanwhile
            poll = await getmany_fair(consumer, 16, timeout_ms=10_000, turn=len(polls))
            assert poll, "the records did not come back"
            assert sum(map(len, poll.values())) <= 16
            polls.append(poll)
        with pytest.raises(ValueError, match="limit"):
            await getmany_fair(consumer, 0, timeout_ms=0)
    finally:
        await consumer.stop()
    # plain getmany(max_records=16) served the buffered backlog first: the urgent record came
    # after all 200 (checked 2026-12-07); shared, it comes as soon as it is fetched
    before = sum(len(p.get(busy, [])) for p in polls[:next(i for i, p in enumerate(polls) if urgent in p)])
    assert before < 100, [{tp.partition: len(r) for tp, r in p.items()} for p in polls]
    values = {tp: [r.value for p in polls for r in p.get(tp, [])] for tp in (busy, urgent)}
    assert values[busy] == [f"busy-{i}".encode() for i in range(200)]
    assert values[urgent] == [b"urgent"]
