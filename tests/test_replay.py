"""Replay windows, exactly, without touching consumer groups; and the replay CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from consumers.bus.loop import ConsumeLoop
from consumers.bus.protocols import RecordContext
from infra.settings import Settings
from infra.topics import TopicAdmin
from producers.producer import EventProducer
from schemas.events import Envelope, Event, Heartbeat, RoleStatus
from tests.helpers import read_topic, running, wait_for

pytestmark = pytest.mark.broker
ROOT = Path(__file__).resolve().parents[1]


def hb(seq: int) -> Heartbeat:
    return Heartbeat(envelope=Envelope(), role="r", instance_id="i", host="h", pid=1,
                     status=RoleStatus.HEALTHY, sequence=seq)


async def _write(producer: EventProducer, topic: str, seqs: range) -> list[int]:
    stamps = []
    for seq in seqs:
        meta = await producer.send(topic, hb(seq), key=str(seq))
        stamps.append(meta.timestamp)
    return stamps


def _ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


async def test_replay_by_time_returns_exactly_the_window(settings: Settings, unique: str) -> None:
    topic = f"test.replay-time.{unique}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_topic(topic, 3)
    async with EventProducer(settings) as producer:
        before = await _write(producer, topic, range(0, 30))
        await asyncio.sleep(0.05)
        inside = await _write(producer, topic, range(30, 60))
        await asyncio.sleep(0.05)
        after = await _write(producer, topic, range(60, 90))
    start, end = min(inside), max(inside) + 1
    assert max(before) < start and min(after) >= end  # the window separates the batches

    window = await read_topic(settings, topic, from_time=_ms(start), to_time=_ms(end))
    assert sorted(r.event.sequence for r in window) == list(range(30, 60))
    assert all(start <= r.timestamp_ms < end for r in window)
    # open-ended windows
    tail = await read_topic(settings, topic, from_time=_ms(min(after)))
    assert sorted(r.event.sequence for r in tail) == list(range(60, 90))
    head = await read_topic(settings, topic, to_time=_ms(start))
    assert sorted(r.event.sequence for r in head) == list(range(0, 30))


async def test_replay_by_offset_and_limit(settings: Settings, unique: str) -> None:
    topic = f"test.replay-offset.{unique}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_topic(topic, 1)
    async with EventProducer(settings) as producer:
        await _write(producer, topic, range(20))
    records = await read_topic(settings, topic, from_offset=5, to_offset=12)
    assert [r.offset for r in records] == list(range(5, 12))
    assert [r.event.sequence for r in records] == list(range(5, 12))
    assert len(await read_topic(settings, topic, from_offset=3, limit=4)) == 4
    assert await read_topic(settings, topic, from_offset=50) == []


async def _group_offsets(settings: Settings) -> dict[str, dict]:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap)
    await admin.start()
    try:
        groups = sorted(g[0] for g in await admin.list_consumer_groups())
        return {g: await admin.list_consumer_group_offsets(g) for g in groups}
    finally:
        await admin.close()


async def test_replay_moves_no_group_offsets(settings: Settings, unique: str) -> None:
    topic, group = f"test.replay-groups.{unique}", f"reader-{unique}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_topic(topic, 2)
    async with EventProducer(settings) as producer:
        await _write(producer, topic, range(10))
    seen: list[int] = []

    async def handler(event: Event, ctx: RecordContext) -> None:
        seen.append(event.sequence)

    loop = ConsumeLoop(settings, group_id=group, topics=[topic], handler=handler, role="test")
    async with running(loop):
        await wait_for(lambda: len(seen) == 10, what="the group to read everything")
    async with EventProducer(settings) as producer:
        await _write(producer, topic, range(10, 15))  # unread by the group

    before = await _group_offsets(settings)
    assert group in before
    assert len(await read_topic(settings, topic)) == 15
    result = _cli("replay", topic, "--json", settings=settings)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 15
    assert await _group_offsets(settings) == before


def _cli(*args: str, settings: Settings | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if settings is not None:
        env["JOYNEXUS_BOOTSTRAP_SERVERS"] = settings.bootstrap
    return subprocess.run([sys.executable, "-m", "infra", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


async def test_replay_cli_prints_json_lines_and_survives_garbage(settings: Settings, unique: str) -> None:
    tenant = f"cli-{unique}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_tenant(tenant)
    topic = f"nexus.t.{tenant}.status"
    async with EventProducer(settings) as producer:
        await producer.send(topic, hb(1), key=tenant)
        await producer.send_raw(topic, b"\xde\xad\xbe\xef", key=tenant)
        await producer.send(topic, hb(2), key=tenant)

    result = _cli("replay", "status", "--tenant", tenant, "--json", settings=settings)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["offset"] for line in lines] == [0, 1, 2]
    assert lines[0]["type"] == "Heartbeat" and lines[0]["event"]["sequence"] == 1
    assert lines[0]["topic"] == topic and lines[0]["partition"] == 0 and lines[0]["key"] == tenant
    assert lines[1]["type"] is None and "unknown framing" in lines[1]["error"]
    assert lines[2]["event"]["sequence"] == 2
    datetime.fromisoformat(lines[0]["timestamp"])

    limited = _cli("replay", "status", "-t", tenant, "--from-offset", "1", "--limit", "1",
                   "--json", settings=settings)
    assert [json.loads(x)["offset"] for x in limited.stdout.splitlines()] == [1]

    bad = _cli("replay", "status", "--tenant", "Not_Valid", settings=settings)
    assert bad.returncode != 0 and "invalid tenant id" in bad.stderr
    missing = _cli("replay", f"no.such.topic.{unique}", settings=settings)
    assert missing.returncode == 1 and "UnknownTopicOrPartitionError" in missing.stderr
