"""The metering role (faust-streaming, a worker process of its own) against the real broker, fed by
the whole service running two RL tenants.

Promised: per tenant, the metered backbone device-seconds (inference + backbone-train) add up to
the device gate's busy time; the metered optimizer steps are the steps the jobs took; and neither
a replay of the whole usage topic nor re-published copies of usage records count anything twice."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition

from consumers.metering import app_id, read_usage
from infra.connection import client_options
from infra.topics import shared_topic
from producers.producer import EventProducer
from tests.helpers import read_topic, wait_for
from tests.service_helpers import Stack, running_stack

pytestmark = [pytest.mark.broker, pytest.mark.slow]

BACKBONE = ("inference|backbone.forward", "backbone-train|backbone")
# The gate times each forward from the moment it holds the device to the moment it lets go; the
# roles time the forward inside that, so metered <= busy. Measured: 0.09% under (printed figures).
TOLERANCE_S = 0.02  # plus 1% of the busy time


class Worker:
    """The metering worker as its own process, like `joynexus metering` in production."""

    def __init__(self, settings, log_path):
        self.env = {**os.environ, "JOYNEXUS_BOOTSTRAP_SERVERS": settings.bootstrap,
                    "JOYNEXUS_HOME": str(settings.home), "JOYNEXUS_METERING_WINDOW_S": "60"}
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "infra", "metering"], env=self.env,
                                         stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def worker(settings, tmp_path_factory) -> Iterator[Worker]:
    w = Worker(settings.model_copy(update={"home": tmp_path_factory.mktemp("metering-home")}),
               tmp_path_factory.mktemp("metering-log") / "worker.log")
    w.start()
    try:
        yield w
    finally:
        w.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(settings, model_root, tmp_path_factory) -> AsyncIterator[Stack]:
    # inference's features not shared with training: backbone-train then forwards an RL job's rows
    # itself, so its metering is exercised too (with sharing it forwards none of them)
    async with running_stack(settings, model_root, tmp_path_factory.mktemp("metered-home"), usage_flush_s=1.0,
                             metering_window_s=60, check_restarts=False,
                             feature_cache_from_inference=False) as s:
        yield s


def totals(rows, tenants) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        if row.tenant in tenants:
            mine = out.setdefault(row.tenant, {})
            for key, (seconds, steps, events) in row.by_resource.items():
                total = mine.setdefault(key, [0.0, 0, 0])
                total[0] += seconds
                total[1] += steps
                total[2] += events
    return out


async def usage_partitions(settings, topic: str) -> list[TopicPartition]:
    admin = AIOKafkaAdminClient(**client_options(settings))
    await admin.start()
    try:
        (meta,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    tps = [TopicPartition(topic, p["partition"]) for p in meta["partitions"]]
    assert tps, f"no partitions of {topic}"
    return sorted(tps)


async def lag(settings) -> int:
    """Committed usage records the metering group has not processed yet, counted as records (not
    end offset minus committed offset: transaction markers take offsets too)."""
    topic = shared_topic(settings, "usage")
    admin = AIOKafkaAdminClient(**client_options(settings))
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(app_id(settings))
    finally:
        await admin.close()
    done = {tp.partition: meta.offset for tp, meta in committed.items() if tp.topic == topic}
    return sum(r.offset >= done.get(r.partition, 0) for r in await read_topic(settings, topic))


async def reset_group(settings, tenants: set[str]) -> None:
    """Rewind the (stopped) metering group to this test's first usage record in each partition: a
    full replay of everything this test metered (and whatever came after it), without re-reading
    the records the session's earlier tests left in the shared topic."""
    topic = shared_topic(settings, "usage")
    first: dict[int, int] = {}
    for r in await read_topic(settings, topic):
        if r.event is not None and r.event.tenant_id in tenants:
            first[r.partition] = min(first.get(r.partition, r.offset), r.offset)
    consumer = AIOKafkaConsumer(**client_options(settings), group_id=app_id(settings),
                                enable_auto_commit=False)
    await consumer.start()
    try:
        tps = await usage_partitions(settings, topic)
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        # every partition gets a position: this test's first record, or its end when it has none
        await consumer.commit({tp: first.get(tp.partition, ends[tp]) for tp in tps})
    finally:
        await consumer.stop()


async def test_metering_adds_up_to_the_gate_and_replays_count_nothing_twice(
        stack: Stack, worker: Worker, unique: str) -> None:
    tenants = {f"meter-a-{unique}", f"meter-b-{unique}"}
    jobs = [await stack.client.submit(stack.rl_spec(t, "metered", seed=i))
            for i, t in enumerate(sorted(tenants))]
    states = {job.tenant: await stack.follow(job) for job in jobs}
    gate = stack.service.gate

    async def metered() -> float:
        got = totals(await read_usage(stack.settings), tenants)
        return sum(v[0] for t in got.values() for k, v in t.items() if k in BACKBONE)

    async def settled() -> bool:
        # the env's last observations may still be answered after a job completes, the inference
        # role publishes every second, and the table's changelog trails the worker's commits
        busy = sum(gate.busy_s.values())
        return (await metered() >= busy - TOLERANCE_S - 0.01 * busy
                and await _all_counted(stack.settings, tenants))

    await wait_for(settled, 120, "metering to catch up with the gate")
    busy = sum(gate.busy_s.values())
    tolerance = TOLERANCE_S + 0.01 * busy
    snapshot = totals(await read_usage(stack.settings), tenants)
    total = sum(v[0] for t in snapshot.values() for k, v in t.items() if k in BACKBONE)
    print(f"gate busy {busy:.4f} s (inference {gate.busy_s['inference']:.4f}, training "
          f"{gate.busy_s['train']:.4f}, forwards {dict(gate.forwards)}); metered {total:.4f} s; "
          f"difference {total - busy:+.4f} s; per tenant "
          f"{ {t: {k: round(v[0], 4) for k, v in r.items()} for t, r in snapshot.items()} }")
    # every metered second is measured inside the gate, so never more than it counted
    assert busy - tolerance <= total <= busy + 1e-9, (total, busy)
    for tenant, state in states.items():
        assert snapshot[tenant]["optimizer|optimizer.step"][1] == state.metrics["steps"], snapshot[tenant]
        assert snapshot[tenant]["backbone-train|backbone"][0] > 0
        assert snapshot[tenant]["inference|backbone.forward"][0] > 0

    # replay: the worker stops, its group is rewound to this test's first records, copies of usage records are
    # re-published, and it starts again
    worker.stop()
    await reset_group(stack.settings, tenants)
    usage_topic = shared_topic(stack.settings, "usage")
    copies = [r for r in await read_topic(stack.settings, usage_topic)
              if r.event is not None and r.event.tenant_id in tenants][:20]
    async with EventProducer(stack.settings) as producer:
        for record in copies:
            await producer.send_raw(usage_topic, record.value, record.key, record.headers)
    behind = await lag(stack.settings)
    assert behind >= len(copies) + sum(v[2] for t in snapshot.values() for v in t.values()), behind
    ours = [r.event.usage_id for r in await read_topic(stack.settings, usage_topic)
            if r.event is not None and r.event.tenant_id in tenants]  # originals and copies
    log_start = worker.log_path.stat().st_size
    worker.start()
    await wait_for(lambda: _lag_zero(stack.settings), 120, "the replay to finish")
    await asyncio.sleep(2 * 1.0)  # a double count would reach the changelog within faust's flush
    assert totals(await read_usage(stack.settings), tenants) == snapshot
    skipped = _skipped(worker.log_path, log_start, tenants)
    short = {i: (n, skipped[i]) for i, n in Counter(ours).items() if skipped[i] < n}
    print(f"replay: {behind} records re-read, {len(ours)} of them this test's, "
          f"{sum(skipped.values())} of those skipped as already counted; recognised fewer times than "
          f"the topic holds them (copies, skips): {short}")
    # every usage event of this test's tenants was re-read and recognised, none counted again (the
    # totals above). Per event, not per record: faust's consumer may deliver a record twice around a
    # rebalance, and once (a fresh-clone suite, 2026-12-06) one of the 20 re-published copies was
    # recognised once for its two records; the totals were unchanged either way.
    assert set(ours) <= set(skipped), set(ours) - set(skipped)


def _skipped(log_path, start: int, tenants: set[str]) -> Counter:
    """How often the worker logged each usage id of ``tenants`` as already counted, after ``start``."""
    with open(log_path, "rb") as log:
        log.seek(start)
        lines = log.read().decode(errors="replace").splitlines()
    found: Counter = Counter()
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a traceback printed by a crashing worker is not JSON
        if (isinstance(entry, dict) and entry.get("event") == "usage already counted"
                and entry.get("tenant") in tenants):
            found[entry["usage_id"]] += 1
    return found


async def _all_counted(settings, tenants) -> bool:
    """The table counts as many events as there are distinct usage ids of ``tenants`` in the log."""
    ids = {r.event.usage_id for r in await read_topic(settings, shared_topic(settings, "usage"))
           if r.event is not None and r.event.tenant_id in tenants}
    got = totals(await read_usage(settings), tenants)
    return sum(v[2] for t in got.values() for v in t.values()) == len(ids)


async def _lag_zero(settings) -> bool:
    return await lag(settings) == 0
