"""Produce, consume, DLQ and group commits against the real broker."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import ClassVar

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from consumers.bus.episodes import RolloutReader
from consumers.bus.loop import COMMIT_TIMEOUT_S, ConsumeLoop, commit_within, make_consumer
from consumers.bus.protocols import RecordContext
from infra.follow import TopicFollower
from infra.settings import Settings
from infra.topics import TopicAdmin, tenant_topic
from producers.producer import EventProducer
from schemas import events as ev
from schemas.codec import Codec
from schemas.events import EVENT_TYPES, Envelope, Event, Heartbeat, RoleStatus
from schemas.sessions import eval_session_id, is_eval_rollout_key, rl_session_id, rollout_key
from schemas.tensors import from_numpy
from tests.helpers import LogRecords, dead_letters_from, read_topic, running, wait_for
from tests.strategies import filled_event

pytestmark = pytest.mark.broker


def heartbeat(seq: int, tenant: str | None = None) -> Heartbeat:
    return Heartbeat(envelope=Envelope(tenant_id=tenant), role="test", instance_id="i",
                     host="h", pid=1, status=RoleStatus.HEALTHY, sequence=seq)


async def test_every_schema_round_trips_through_the_broker(settings: Settings, unique: str) -> None:
    topic = f"test.roundtrip.{unique}"
    events = [filled_event(cls) for cls in EVENT_TYPES.values()]
    async with TopicAdmin(settings) as admin:
        await admin.ensure_topic(topic, 1)
    async with EventProducer(settings) as producer:
        for event in events:
            await producer.send(topic, event, key=type(event).__name__)
    records = await read_topic(settings, topic)
    assert [r.error for r in records] == [None] * len(events)
    assert [r.event for r in records] == events
    assert [r.key.decode() for r in records] == [type(e).__name__ for e in events]


class _Registry(http.server.BaseHTTPRequestHandler):
    """Confluent's schema-registry REST API, the two endpoints the codec uses, served for real over
    HTTP (the registry is an external service joynexus does not run)."""

    schemas: ClassVar[dict[int, str]] = {}

    def do_POST(self) -> None:  # POST /subjects/<record name>/versions
        schema = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["schema"]
        sid = next((sid for sid, known in self.schemas.items() if known == schema), None)
        if sid is None:
            sid = 100 + len(self.schemas)
            self.schemas[sid] = schema
        self._answer(200, {"id": sid})

    def do_GET(self) -> None:  # GET /schemas/ids/<id>
        sid = int(self.path.rsplit("/", 1)[1])
        if sid in self.schemas:
            self._answer(200, {"schema": self.schemas[sid]})
        else:
            self._answer(404, {"error_code": 40403})

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


async def test_a_configured_schema_registry_frames_what_the_service_writes(settings: Settings,
                                                                          unique: str) -> None:
    """``JOYNEXUS_SCHEMA_REGISTRY_URL`` switches every producer and reader to Confluent framing."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        confluent = settings.model_copy(update={"schema_registry_url": f"http://127.0.0.1:{server.server_port}"})
        topic = f"test.confluent.{unique}"
        events = [filled_event(cls) for cls in EVENT_TYPES.values()]
        async with TopicAdmin(settings) as admin:
            await admin.ensure_topic(topic, 1)
        async with EventProducer(confluent) as producer:
            for event in events:
                await producer.send(topic, event)
        records = await read_topic(confluent, topic)
        assert [r.event for r in records] == events
        assert {r.value[:1] for r in records} == {b"\x00"}  # magic byte 0, then the registry's id
        assert len(_Registry.schemas) == len(events)  # one subject per event type
        # a reader without the registry cannot resolve the ids: every record says why, none is lost
        plain = await read_topic(settings, topic)
        assert len(plain) == len(events) and all("no registry configured" in r.error for r in plain)
    finally:
        server.shutdown()
        server.server_close()


async def test_garbage_goes_to_dlq_and_the_consumer_carries_on(settings: Settings, unique: str) -> None:
    topic, group = f"test.dlq.{unique}", f"g-{unique}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_shared()
        await admin.ensure_topic(topic, 1)
    async with EventProducer(settings) as producer:
        await producer.send(topic, heartbeat(0))
        garbage = await producer.send_raw(topic, b"\x13\x37 not avro", key=b"k1",
                                          headers=[("trace", b"abc")], timestamp_ms=1_700_000_000_000)
        await producer.send(topic, heartbeat(1))
        await producer.send(topic, heartbeat(666))  # the handler always fails on this one
        await producer.send(topic, heartbeat(2))

    seen: list[int] = []

    def handler(event: Event, ctx: RecordContext) -> None:
        assert isinstance(event, Heartbeat)
        if event.sequence == 666:
            raise ValueError("cannot handle 666")
        seen.append(event.sequence)

    loop = ConsumeLoop(settings, group_id=group, topics=[topic], handler=handler, role="test")
    async with running(loop):
        await wait_for(lambda: loop.processed + loop.dead_lettered == 5, what="5 records")
    assert seen == [0, 1, 2]
    assert loop.dead_lettered == 2

    dead = await dead_letters_from(settings, topic)
    assert len(dead) == 2
    by_stage = {dict(d.headers)["dlq.stage"]: d for d in dead}
    decode = by_stage[b"decode"]
    headers = dict(decode.headers)
    assert decode.value == b"\x13\x37 not avro" and decode.key == b"k1"
    assert headers["dlq.source.timestamp"] == b"1700000000000"
    assert decode.timestamp_ms > 1_700_000_000_000  # stamped now: retention must not eat it at once
    assert headers["trace"] == b"abc"
    assert headers["dlq.source.topic"] == topic.encode()
    assert headers["dlq.source.partition"] == b"0"
    assert headers["dlq.source.offset"] == str(garbage.offset).encode()
    assert headers["dlq.error.class"] == b"DecodeError"
    assert b"unknown framing" in headers["dlq.error.message"]
    assert decode.error is not None  # replay shows it undecodable, without failing

    process = dict(by_stage[b"process"].headers)
    assert process["dlq.error.class"] == b"ValueError"
    assert process["dlq.attempts"] == str(settings.max_attempts).encode()
    assert process["dlq.group"] == group.encode()

    # Everything was committed: a new member of the group has nothing left to read.
    consumer = make_consumer(settings, group, topics=[topic])
    await consumer.start()
    try:
        assert await consumer.committed(TopicPartition(topic, 0)) == 5
    finally:
        await consumer.stop()


async def test_pattern_subscription_sees_every_tenant(settings: Settings, unique: str) -> None:
    tenants = [f"p{i}-{unique}" for i in range(3)]
    async with TopicAdmin(settings) as admin:
        for tenant in tenants:
            await admin.ensure_tenant(tenant)
    got: list[tuple[str | None, str]] = []

    async def handler(event: Event, ctx: RecordContext) -> None:
        got.append((event.tenant_id, ctx.topic))

    loop = ConsumeLoop(settings, group_id=f"pattern-{unique}", role="test", handler=handler,
                       pattern=rf"nexus\.t\.p\d-{unique}\.status")
    async with running(loop), EventProducer(settings) as producer:
        for tenant in tenants:
            await producer.send(f"nexus.t.{tenant}.status", heartbeat(0, tenant), key=tenant)
        await wait_for(lambda: len(got) == 3, what="one record per tenant")
    assert sorted(got) == sorted((t, f"nexus.t.{t}.status") for t in tenants)


async def test_a_followers_caught_up_waits_for_every_partition_of_a_new_topic(settings: Settings,
                                                                             unique: str) -> None:
    """Read-your-writes for a topic created after the follower started (a new tenant's first
    job): ``caught_up`` must wait for ALL its partitions. It once knew only partition 0 of a topic
    its metadata did not list yet, and returned at once when that one was empty. Pattern
    refreshes list every topic of the cluster, so they are rare (here 120 s): it asks itself."""
    settings = settings.model_copy(update={"pattern_refresh_ms": 120_000})
    tenant = f"late-{unique}"
    topic = tenant_topic(settings, tenant, "sessions")
    got: list[int] = []
    follower = TopicFollower(settings, rf"nexus\.t\.late-{unique}\.sessions",
                             lambda event, record: got.append(record.partition), name="late")
    async with follower:
        await asyncio.sleep(1.0)  # its first metadata read is behind it: the topic does not exist yet
        async with TopicAdmin(settings) as admin:
            await admin.ensure_tenant(tenant)
            partitions = await admin.partitions(topic)
        assert partitions > 1
        async with EventProducer(settings) as producer:
            for p in range(1, partitions):  # partition 0 stays empty
                await producer.send(topic, heartbeat(p, tenant), key=tenant, partition=p)
        await follower.caught_up([topic], timeout_s=15.0)
        assert sorted(got) == list(range(1, partitions))


async def _status_follower(settings: Settings, tenant: str, settle_s: float
                           ) -> tuple[str, list[int], TopicFollower]:
    """A new tenant's status topic, and a follower of it that collects each heartbeat's sequence."""
    topic = tenant_topic(settings, tenant, "status")
    async with TopicAdmin(settings) as admin:
        await admin.ensure_tenant(tenant)
    got: list[int] = []
    follower = TopicFollower(settings, rf"nexus\.t\.{tenant}\.status",
                             lambda event, record: got.append(event.sequence), name=tenant, settle_s=settle_s)
    return topic, got, follower


async def test_a_settling_follower_reads_a_busy_topic_in_few_fetches(settings: Settings, unique: str) -> None:
    """A read model with ``settle_s`` (the roles' job books and health views) reads a topic that
    gets a record every 25 ms in about one fetch cycle per ``settle_s``, not one per record, and
    loses none of them."""
    tenant = f"settle-{unique}"
    topic, got, follower = await _status_follower(settings, tenant, settle_s=0.5)
    async with follower, EventProducer(settings) as producer:
        await follower.caught_up([topic], timeout_s=15.0)  # subscribed and assigned
        before = follower.reads
        for i in range(40):
            await producer.send(topic, heartbeat(i, tenant), key=tenant)
            await asyncio.sleep(0.025)
        await wait_for(lambda: len(got) == 40, timeout_s=10.0)
        reads = follower.reads - before
    assert got == list(range(40))
    assert reads <= 8, f"{reads} fetch cycles for 40 records over ~1.2 s at settle_s=0.5"


async def test_caught_up_does_not_wait_for_a_settling_follower(settings: Settings, unique: str) -> None:
    """Read-your-writes waits for no settling: a follower that would let records gather for a
    minute still shows a caller its own write as soon as it is fetched."""
    tenant = f"hurry-{unique}"
    topic, got, follower = await _status_follower(settings, tenant, settle_s=60.0)
    async with follower, EventProducer(settings) as producer:
        await follower.caught_up([topic], timeout_s=15.0)
        await producer.send(topic, heartbeat(1, tenant), key=tenant)
        await wait_for(lambda: got == [1], timeout_s=10.0)  # a quiet topic's record: read at once
        await producer.send(topic, heartbeat(2, tenant), key=tenant)  # the follower settles now
        await follower.caught_up([topic], timeout_s=10.0)
        assert got == [1, 2]


async def test_slow_sync_handler_does_not_starve_heartbeats(settings: Settings, unique: str) -> None:
    """A plain-function handler busy for longer than the session timeout runs in a
    thread, so the member keeps heartbeating: no rebalance, and its commit succeeds."""
    topic, group = f"test.slow.{unique}", f"slow-{unique}"
    tight = settings.model_copy(update={"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000})
    async with TopicAdmin(settings) as admin:
        await admin.ensure_topic(topic, 1)
    async with EventProducer(settings) as producer:
        for seq in range(3):
            await producer.send(topic, heartbeat(seq))
    done: list[int] = []

    def slow(event: Event, ctx: RecordContext) -> None:
        if event.sequence == 0:
            time.sleep(9)  # CPU-bound work stand-in, 1.5x the session timeout
        done.append(event.sequence)

    loop = ConsumeLoop(tight, group_id=group, topics=[topic], handler=slow, role="test")
    async with running(loop):
        await wait_for(lambda: len(done) == 3, timeout_s=60, what="3 records")
        await wait_for(lambda: not loop._pending, what="the commit")
    assert done == [0, 1, 2]
    assert loop.assignments == 1, "the member was kicked out of its group while working"
    consumer = make_consumer(settings, group, topics=[topic])
    await consumer.start()
    try:
        assert await consumer.committed(TopicPartition(topic, 0)) == 3
    finally:
        await consumer.stop()


async def test_start_at_replays_a_group_from_an_offset_or_a_time(settings: Settings, unique: str) -> None:
    from datetime import UTC, datetime

    from consumers.bus.loop import StartAt

    topic = f"test.startat.{unique}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_topic(topic, 1)
    async with EventProducer(settings) as producer:
        stamps = [(await producer.send(topic, heartbeat(seq))).timestamp for seq in range(10)]

    async def consume(start: StartAt, expect: int) -> list[int]:
        got: list[int] = []

        async def handler(event: Event, ctx: RecordContext) -> None:
            got.append(event.sequence)

        loop = ConsumeLoop(settings, group_id=f"start-{unique}-{len(str(start))}-{expect}",
                           topics=[topic], handler=handler, role="test", start_at=start)
        async with running(loop):
            await wait_for(lambda: len(got) >= expect, what=f"{expect} records")
        return got

    assert await consume(StartAt(offset=7), 3) == [7, 8, 9]
    sixth = datetime.fromtimestamp(stamps[6] / 1000, UTC)
    from_time = await consume(StartAt(time=sixth), 10 - 6)
    # Records sharing the 6th's millisecond also count: the window starts at that time.
    assert from_time == [s for s in range(10) if stamps[s] >= stamps[6]]


async def test_logs_are_json_bound_to_the_record(settings: Settings, unique: str) -> None:
    import structlog

    from infra.logging import configure_logging

    topic = f"nexus.t.log-{unique}.status"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_tenant(f"log-{unique}")
        await admin.ensure_shared()
    async with EventProducer(settings) as producer:
        await producer.send(topic, heartbeat(1, f"log-{unique}"))

    def handler(event: Event, ctx: RecordContext) -> None:
        raise RuntimeError("boom")

    captured = structlog.testing.LogCapture()
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, captured])
    try:
        loop = ConsumeLoop(settings, group_id=f"log-{unique}", topics=[topic], handler=handler,
                           role="metering")
        async with running(loop):
            await wait_for(lambda: loop.dead_lettered == 1, what="the dead letter")
    finally:
        configure_logging(settings.log_level, settings.log_format)
    failures = [e for e in captured.entries if e["event"] == "handler failed"]
    assert failures, captured.entries
    for entry in failures + [e for e in captured.entries if e["event"] == "record dead-lettered"]:
        assert entry["role"] == "metering"
        assert entry["tenant"] == f"log-{unique}"
        assert (entry["topic"], entry["partition"], entry["offset"]) == (topic, 0, 0)


async def poll_until_read(reader: RolloutReader, records: int, what: str) -> None:
    async def read_all() -> bool:
        await reader.poll()
        return reader.read == records
    await wait_for(read_all, what=what)


async def test_rollout_reader_commits_only_offsets_that_moved(settings: Settings, unique: str) -> None:
    """The rollout role and the evaluator commit after every poll; a commit is an append to the
    broker's offsets log, so an offset that did not move is not committed again. A held episode
    keeps the commit at its first record; once released, the commit moves past it."""
    tenant = f"reader-{unique}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_tenant(tenant)
    topic = tenant_topic(settings, tenant, "rollouts")
    tp = TopicPartition(topic, 0)
    image = from_numpy(np.zeros((8, 8, 3), np.uint8))
    async with EventProducer(settings) as producer:
        for step in range(3):
            obs = ev.Observation(envelope=ev.Envelope(tenant_id=tenant), session_id="s", episode_id="s/0",
                                 step=step, instruction="reach", image=image)
            await producer.send(topic, ev.RolloutRecord(
                envelope=ev.Envelope(tenant_id=tenant), session_id="s", episode_id="s/0", step=step,
                reset_seed=0, observation=obs, action=from_numpy(np.zeros(2, np.float32)), reward=0.0,
                terminated=step == 2, truncated=False, success=False, policy_version=0), partition=0)
    reader = RolloutReader(make_consumer(settings, f"reader-{unique}", topics=[topic]), Codec())
    commits: list[dict] = []
    real_commit = reader.consumer.commit

    async def counted(offsets=None):  # a spy: the real commit, counted
        commits.append(dict(offsets))
        await real_commit(offsets)

    reader.consumer.commit = counted
    await reader.consumer.start()
    try:
        await poll_until_read(reader, 3, "the episode's three records")
        await reader.commit()
        await reader.commit()  # nothing moved
        assert commits == [{tp: 0}]  # the held episode keeps its first record uncommitted
        reader.collector.release("s")
        await reader.commit()
        await reader.commit()
        assert commits == [{tp: 0}, {tp: 3}]
        assert await reader.consumer.committed(tp) == 3
    finally:
        await reader.consumer.stop()


async def test_rollout_reader_skips_unwanted_keys_undecoded(settings: Settings, unique: str) -> None:
    """The evaluator decodes only evaluation sessions' rollouts (picked by their key); a training
    session's records are never decoded (a record that would not decode proves it) and hold
    nothing back: the commit moves past them."""
    tenant = f"skip-{unique}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_tenant(tenant)
    topic = tenant_topic(settings, tenant, "rollouts")
    tp = TopicPartition(topic, 0)
    train, evaluation = rl_session_id(tenant, "job", 0), eval_session_id(tenant, "job")
    obs = ev.Observation(envelope=ev.Envelope(tenant_id=tenant), session_id=evaluation,
                         episode_id=f"{evaluation}/0", step=0, instruction="reach")
    async with EventProducer(settings) as producer:
        await producer.send_raw(topic, b"not avro", key=rollout_key(train), partition=0)
        await producer.send(topic, ev.RolloutRecord(
            envelope=ev.Envelope(tenant_id=tenant), session_id=evaluation, episode_id=f"{evaluation}/0",
            step=0, reset_seed=0, observation=obs, action=from_numpy(np.zeros(2, np.float32)), reward=1.0,
            terminated=True, truncated=False, success=True, policy_version=0),
            key=rollout_key(evaluation), partition=0)
        await producer.send_raw(topic, b"not avro either", key=rollout_key(train), partition=0)
    reader = RolloutReader(make_consumer(settings, f"skip-{unique}", topics=[topic]), Codec(),
                           wants=is_eval_rollout_key)
    decoded: list[bytes] = []
    real_decode = reader.codec.decode
    reader.codec.decode = lambda value: decoded.append(value) or real_decode(value)  # a spy
    await reader.consumer.start()
    try:
        await poll_until_read(reader, 3, "the three records")
        assert len(decoded) == 1
        assert reader.collector.sessions() == [evaluation]
        assert [e.success for e in reader.collector.done_episodes(evaluation)] == [True]
        await reader.commit()
        assert await reader.consumer.committed(tp) == 1  # held at the evaluation's episode
        reader.collector.release(evaluation)
        await reader.commit()
        assert await reader.consumer.committed(tp) == 3
    finally:
        await reader.consumer.stop()


@contextlib.asynccontextmanager
async def held_fetches(settings: Settings,
                       name: str) -> AsyncIterator[tuple[Settings, AIOKafkaConsumer, str]]:
    """A group consumer of a new 3-partition topic whose empty fetches the broker holds 5 s:
    (its settings, the consumer, the topic), joined and positioned, a fetch now waiting."""
    settings = settings.model_copy(update={"fetch_max_wait_ms": 5_000})
    topic = f"test.longpoll.{name}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_topic(topic, 3)
    consumer = make_consumer(settings, f"longpoll-{name}", topics=[topic])
    await consumer.start()
    try:
        await consumer.getmany(timeout_ms=3000)
        yield settings, consumer, topic
    finally:
        await consumer.stop()


async def next_record(consumer: AIOKafkaConsumer, *partitions: TopicPartition) -> float:
    """Seconds until the consumer hands over one record (of ``partitions``, if given)."""
    began = time.monotonic()
    got: dict = {}
    while not got:
        got = await consumer.getmany(*partitions, timeout_ms=100, max_records=1)
    return time.monotonic() - began


async def test_a_long_fetch_wait_answers_as_soon_as_a_record_arrives(settings: Settings, unique: str) -> None:
    """``fetch_max_wait_ms`` bounds only a fetch that finds nothing: a record published to a
    consumer's idle partitions, plainly or in a committed transaction (what rollouts and
    gradient jobs are), reaches it long before that, every time."""
    async with held_fetches(settings, unique) as (settings, consumer, topic), EventProducer(
            settings) as plain, EventProducer(settings, transactional_id=f"longpoll-{unique}") as txn:
        waits = []
        for i in range(6):
            await asyncio.sleep(1.0)  # the pending fetch has found nothing for a while
            began = time.monotonic()
            if i % 2:
                async with txn.transaction():
                    await txn.enqueue(topic, heartbeat(i), key=str(i))
            else:
                await plain.send(topic, heartbeat(i), key=str(i))
            await next_record(consumer)
            waits.append(time.monotonic() - began)
    assert max(waits) < 2.5, waits


async def test_a_busy_consumer_gets_its_partitions_next_records_at_once(settings: Settings,
                                                                          unique: str) -> None:
    """A consumer that is busy while records it has not read yet sit in its buffer (a role in
    the middle of a forward, a poll capped by ``max_records``) must not have the broker's other
    partitions fetched without that one, held 5 s: the partition's next record would wait for
    that fetch (``infra/longpoll.py``)."""
    async with held_fetches(settings, f"busy.{unique}") as (settings, consumer, topic), EventProducer(
            settings) as producer:
        tp = TopicPartition(topic, 0)
        waits = []
        for i in range(3):
            for j in range(2):
                await producer.send(topic, heartbeat(2 * i + j), partition=0)
            got = await consumer.getmany(timeout_ms=3000, max_records=1)
            assert [len(rs) for rs in got.values()] == [1], got
            await asyncio.sleep(0.5)  # busy: one record of partition 0 still unread
            waits.append(await next_record(consumer, tp))
            await producer.send(topic, heartbeat(100 + i), partition=0)
            waits.append(await next_record(consumer, tp))
    assert max(waits) < 2.5, waits


async def test_a_seek_beside_a_held_fetch_does_not_wait_for_it(settings: Settings, unique: str) -> None:
    """With fetches held 5 s, ``seek_to_beginning`` / ``seek_to_end`` (an env worker's rebalance
    listener awaits both, without heartbeats) and a plain ``seek`` (a rewind after a failed
    transaction) take effect at once: aiokafka sends no offset reset to a broker while a fetch is
    held there, and fetches a moved partition only when that fetch returns (``infra/longpoll.py``)."""
    async with held_fetches(settings, f"seek.{unique}") as (settings, consumer, topic), EventProducer(
            settings) as producer:
        tps = [TopicPartition(topic, p) for p in range(3)]
        await producer.send(topic, heartbeat(0), partition=0)
        await next_record(consumer)
        waits = []
        for _ in range(2):
            await asyncio.sleep(0.7)  # the next fetch is held at the broker
            began = time.monotonic()
            assert await consumer.seek_to_beginning(*tps)
            waits.append(time.monotonic() - began)
            waits.append(await next_record(consumer, tps[0]))  # offset 0 again
            await asyncio.sleep(0.7)
            began = time.monotonic()
            assert await consumer.seek_to_end(*tps)
            waits.append(time.monotonic() - began)
            assert await consumer.position(tps[0]) == 1
            await asyncio.sleep(0.7)
            consumer.seek(tps[0], 0)
            waits.append(await next_record(consumer, tps[0]))
    assert max(waits) < 2.5, waits


async def test_requests_beside_a_held_fetch_do_not_wait_for_it(settings: Settings, unique: str) -> None:
    """With fetches held 5 s at the broker, a consumer's end-offsets and metadata requests (a
    follower's ``caught_up``, an env worker positioning partitions) still answer at once: the
    fetches go on a connection of their own (``infra/longpoll.py``). Sent on the fetch's
    connection, each would wait for the held fetch, up to 5 s."""
    async with held_fetches(settings, f"side.{unique}") as (settings, consumer, topic):
        tps = [TopicPartition(topic, p) for p in range(3)]
        waits = []
        for _ in range(4):
            await asyncio.sleep(0.7)
            began = time.monotonic()
            assert await consumer.end_offsets(tps) == {tp: 0 for tp in tps}
            await consumer._client.force_metadata_update()
            waits.append(time.monotonic() - began)
        async with EventProducer(settings) as producer:  # and the held fetch still delivers
            await producer.send(topic, heartbeat(1), key="1")
            waits.append(await next_record(consumer))
    assert max(waits) < 2.5, waits


async def test_a_commit_naming_a_deleted_topic_gives_up_instead_of_holding_the_role(settings: Settings,
                                                                                     unique: str) -> None:
    """aiokafka retries a commit's retriable errors forever, and a deleted topic's partition answers
    UNKNOWN_TOPIC_OR_PARTITION: the inference role, committing a deleted tenant's observations
    partition, stopped answering anyone. ``commit_within`` gives up; the caller reads again later."""
    topic = f"bench.commit.{unique}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_topic(topic, 1)
    tp = TopicPartition(topic, 0)
    consumer = make_consumer(settings, f"commit-{unique}")
    await consumer.start()
    try:
        consumer.assign([tp])  # manual: no rebalance will take the partition away
        await commit_within(consumer, {tp: 0})  # an existing partition commits at once
        async with TopicAdmin(settings) as admin:
            await admin.delete_topics([topic])
        raw = asyncio.create_task(consumer.commit({tp: 0}))
        await asyncio.sleep(COMMIT_TIMEOUT_S + 1)
        assert not raw.done(), "aiokafka no longer retries forever: commit_within may be unneeded"
        raw.cancel()
        await asyncio.gather(raw, return_exceptions=True)
        with pytest.raises(TimeoutError):
            await commit_within(consumer, {tp: 0})
    finally:
        await consumer.stop()


async def test_a_pattern_consumer_keeps_every_topic_after_asking_about_a_deleted_one(settings: Settings,
                                                                                    unique: str) -> None:
    """aiokafka's offset lookup of a partition without a leader narrows the client's metadata from
    every topic to that one, and a pattern subscription then shrinks to it: an env worker lost 88 of
    its 106 topics when a tenant was deleted during a lookup (CI, 2026-12-03). ``make_consumer``
    keeps every topic tracked (``infra/every_topic.py``)."""
    topics = [f"every.{unique}.{i}" for i in range(3)]
    async with TopicAdmin(settings) as admin:
        for topic in topics:
            await admin.ensure_topic(topic, 1)
    consumer = make_consumer(settings, f"every-{unique}", pattern=rf"^every\.{unique}\.\d$")
    await consumer.start()
    try:
        await wait_for_assignment(consumer, topics)
        async with TopicAdmin(settings) as admin:
            await admin.delete_topics(topics[:1])
        await consumer._client.force_metadata_update()  # the client knows no leader for it now
        with pytest.raises((TimeoutError, KafkaError)):  # no leader: aiokafka waits for metadata
            await asyncio.wait_for(consumer.end_offsets([TopicPartition(topics[0], 0)]), 3)
        assert consumer._client._topics == set(), "the client no longer tracks every topic"
        await wait_for_assignment(consumer, topics[1:])
    finally:
        await consumer.stop()
    raw = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap)  # what aiokafka itself does
    raw._client.add_topic(topics[0])
    narrowed = raw._client._topics
    await raw.stop()
    assert narrowed == {topics[0]}, "aiokafka keeps every topic now: track_every_topic may be unneeded"


async def test_an_offset_lookup_of_a_deleted_topic_is_logged_at_info(settings: Settings, unique: str) -> None:
    """A consumer resetting a partition's offset after its topic was deleted, before the rebalance
    takes it away (env workers, when a tenant leaves): aiokafka logs a WARNING and an ERROR each
    time; both are INFO for a topic this process saw exist (``infra/deleted_topic_lines.py``)."""
    topic = f"gone.{unique}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_topic(topic, 1)
    tp = TopicPartition(topic, 0)
    lines = LogRecords()
    fetcher = logging.getLogger("aiokafka.consumer.fetcher")
    fetcher.addHandler(lines)
    consumer = make_consumer(settings, f"gone-{unique}")
    await consumer.start()
    try:
        consumer.assign([tp])
        # Paused before positioned, so no fetch is ever sent: a fetch's answer for the deleted topic
        # refreshes the metadata, and the lookup below would then wait for a leader instead of
        # asking the stale one (a fetch sent between positioning and pausing did so in CI).
        consumer.pause(tp)
        assert await consumer.position(tp) == 0  # listed, positioned: seen to exist
        async with TopicAdmin(settings) as admin:
            await admin.delete_topics([topic])
        with contextlib.suppress(TimeoutError, KafkaError):  # asks the (stale) leader, which has it no more
            await asyncio.wait_for(consumer.seek_to_beginning(tp), 3)
    finally:
        await consumer.stop()
        fetcher.removeHandler(lines)
    about = [(r.levelno, r.getMessage()) for r in lines.records if topic in r.getMessage()]
    # aiokafka alone: a WARNING ("Received unknown topic or partition error in ListOffset request")
    # and an ERROR ("Failed fetch offsets from 1: [Error 3] UnknownTopicOrPartitionError") per try
    assert any("Failed fetch offsets" in message for _, message in about), about
    assert any("ListOffset request" in message for _, message in about), about
    assert all(level == logging.INFO and message.endswith("(deleted since this process saw it)")
               for level, message in about), about


async def wait_for_assignment(consumer: AIOKafkaConsumer, topics: list[str], timeout_s: float = 60.0) -> None:
    """Poll (heartbeats, rebalances and pattern refreshes need the consumer read) until the
    consumer holds exactly ``topics``' partition 0."""
    wanted = {TopicPartition(t, 0) for t in topics}
    deadline = time.monotonic() + timeout_s
    while consumer.assignment() != wanted:
        assert time.monotonic() < deadline, f"assigned {sorted(consumer.assignment())}, not {sorted(wanted)}"
        await consumer.getmany(timeout_ms=200)
