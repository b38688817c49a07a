"""Transactions, explicitly: zombie fencing (aiokafka's transaction requests are v0,
so fencing rests on one transactional id per input partition), and dead letters
inside the consume-transform-produce transaction."""

from __future__ import annotations

import contextlib

import pytest
from aiokafka.errors import KafkaError

from consumers.bus.protocols import Output, RecordContext
from consumers.bus.transform import TransformWorker
from infra.settings import Settings
from infra.topics import TopicAdmin
from producers.producer import EventProducer
from schemas.events import Envelope, Event, Heartbeat, RoleStatus
from tests.helpers import dead_letters_from, read_topic, running, wait_for

pytestmark = pytest.mark.broker


def hb(seq: int) -> Heartbeat:
    return Heartbeat(envelope=Envelope(), role="r", instance_id="i", host="h", pid=1,
                     status=RoleStatus.HEALTHY, sequence=seq)


async def test_a_zombie_producer_is_fenced(settings: Settings, unique: str) -> None:
    topic, tid = f"test.fence.{unique}", f"worker-{unique}-in-0"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_topic(topic, 1)
    zombie = EventProducer(settings, transactional_id=tid)
    successor = EventProducer(settings, transactional_id=tid)
    await zombie.start()
    try:
        async with zombie.transaction():
            await zombie.enqueue(topic, hb(1))
        with pytest.raises(KafkaError) as fenced:
            async with zombie.transaction():
                await zombie.enqueue(topic, hb(2))
                await successor.start()  # same id: bumps the epoch, fencing the zombie
        assert fenced.type.__name__ == "ProducerFenced"
        async with successor.transaction():
            await successor.enqueue(topic, hb(3))
    finally:
        await successor.stop()
        with contextlib.suppress(KafkaError):  # a fenced producer may complain on close
            await zombie.stop()
    committed = [r.event.sequence for r in await read_topic(settings, topic)]
    assert committed == [1, 3]  # the zombie's open transaction never became visible


async def test_transform_dead_letters_inside_the_transaction(settings: Settings, unique: str) -> None:
    source, sink, group = f"test.tx-in.{unique}", f"test.tx-out.{unique}", f"tx-{unique}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_shared()
        await admin.ensure_topic(source, 1)
        await admin.ensure_topic(sink, 1)
    async with EventProducer(settings) as producer:
        await producer.send(source, hb(0))
        await producer.send_raw(source, b"garbage")
        await producer.send(source, hb(13))  # the transform rejects this one
        await producer.send(source, hb(2))

    def transform(event: Event, ctx: RecordContext) -> list[Output]:
        if event.sequence == 13:
            raise ValueError("unlucky")
        return [Output(sink, event.model_copy(update={"role": "out"}))]

    worker = TransformWorker(settings, group_id=group, topics=[source], transform=transform,
                             role="test")
    async def all_committed() -> bool:
        dead = await dead_letters_from(settings, source)
        return len(await read_topic(settings, sink)) == 2 and len(dead) == 2

    async with running(worker):
        await wait_for(all_committed, what="outputs and dead letters to commit")
    outputs = await read_topic(settings, sink)
    assert [(r.event.sequence, r.event.role) for r in outputs] == [(0, "out"), (2, "out")]
    dead = await dead_letters_from(settings, source)
    stages = sorted((dict(d.headers)["dlq.stage"], dict(d.headers)["dlq.error.class"]) for d in dead)
    assert stages == [(b"decode", b"DecodeError"), (b"process", b"ValueError")]

