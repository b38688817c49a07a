"""A role's heartbeat sample while its consumer's partitions move, against the real broker."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from consumers.bus.protocols import Workload
from infra.connection import client_options
from infra.runtime.host import _Sampler
from infra.settings import Settings
from infra.topics import TopicAdmin

pytestmark = pytest.mark.broker


class _RevokedWhileSampled(AIOKafkaConsumer):
    """A real consumer that loses every partition but the one asked about during its first
    ``position()``: the timing of a tenant's topics deleted while a heartbeat samples (a rebalance
    lands during the sampler's await), made deterministic."""

    moved = False

    async def position(self, tp: TopicPartition) -> int:
        offset = await super().position(tp)
        if not self.moved:
            self.moved = True
            self.assign([tp])
        return offset


class _NeverPositioned(AIOKafkaConsumer):
    """A real consumer none of whose partitions gets a position, as right after a rebalance while
    the group rewinds: each ``position()`` waits until cancelled."""

    async def position(self, tp: TopicPartition) -> int:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_sample_keeps_one_deadline_however_many_partitions_wait(settings: Settings,
                                                                        unique: str) -> None:
    topic = f"test.sample.{unique}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_topic(topic, 8)
    consumer = _NeverPositioned(**client_options(settings), enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(8)])

        class Reading:
            def workload(self) -> Workload:
                return Workload(consumers=(consumer,))

        # 0.5 s per waiting partition would be 4 s; the heartbeat gives its sample 2 s (interval) and
        # the sample itself asks for 0.6 s, so this only passes with a deadline for the whole sample.
        sample = await asyncio.wait_for(_Sampler(Reading(), budget_s=0.6)(), 2.0)
        assert sample.partitions == tuple(f"{topic}:{p}" for p in range(8))
        assert sample.lag == -1  # nothing positioned: lag unknown, not zero
    finally:
        await consumer.stop()


async def test_a_partition_revoked_during_the_sample_is_left_out(settings: Settings, unique: str) -> None:
    topic = f"test.sample.{unique}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_topic(topic, 2)
    consumer = _RevokedWhileSampled(**client_options(settings), enable_auto_commit=False,
                                    auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])

        class Reading:
            def workload(self) -> Workload:
                return Workload(consumers=(consumer,))

        sample = await _Sampler(Reading())()  # aiokafka asserted on the revoked one: no sample at all
        (kept,) = consumer.assignment()
        assert sample.partitions == (f"{topic}:{kept.partition}",)
        # the new assignment has fetched nothing yet, so its end is unknown, as after a real rebalance
        assert sample.lag == -1
    finally:
        await consumer.stop()
