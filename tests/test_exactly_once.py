"""A consume-transform-produce worker SIGKILLed mid-batch, again and again: every
input appears in the output exactly once (read_committed)."""

from __future__ import annotations

import asyncio
import collections
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from infra.settings import Settings
from infra.topics import TopicAdmin
from producers.producer import EventProducer
from schemas.events import Envelope, Heartbeat, RoleStatus
from tests.helpers import read_topic, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
N = 1500
KILLS = 4


def spawn(settings: Settings, args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "JOYNEXUS_BOOTSTRAP_SERVERS": settings.bootstrap,
           "JOYNEXUS_SESSION_TIMEOUT_MS": "6000", "JOYNEXUS_HEARTBEAT_INTERVAL_MS": "1000",
           "JOYNEXUS_MAX_POLL_RECORDS": "50", "JOYNEXUS_HOME": str(settings.home)}
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "tests.workers.relay", *args], cwd=ROOT,
                                env=env, stdout=out, stderr=subprocess.STDOUT)


async def test_sigkill_mid_batch_keeps_exactly_once(settings: Settings, unique: str,
                                                    tmp_path: Path) -> None:
    source, sink, group = f"test.eos-in.{unique}", f"test.eos-out.{unique}", f"relay-{unique}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_shared()
        await admin.ensure_topic(source, 3)
        await admin.ensure_topic(sink, 3)
    async with EventProducer(settings) as producer:
        for seq in range(N):
            await producer.enqueue(source, Heartbeat(
                envelope=Envelope(), role="src", instance_id="i", host="h", pid=1,
                status=RoleStatus.HEALTHY, sequence=seq), key=str(seq))
        await producer.flush()

    async def committed_count() -> int:
        return len(await read_topic(settings, sink))

    log = tmp_path / "relay.log"
    rng = random.Random(unique)
    args = [source, sink, group]
    counts = []
    for kill in range(KILLS):
        worker = spawn(settings, args, log)
        # Kill once the worker is demonstrably in the middle of the stream.
        threshold = (kill + 1) * N // (KILLS + 2)
        await wait_for(lambda t=threshold: _at_least(committed_count, t), timeout_s=120,
                       what=f"{threshold} committed outputs")
        await asyncio.sleep(rng.uniform(0.0, 0.3))
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        counts.append(await committed_count())
    assert counts[-1] < N, "the worker finished before the last kill; the test proved nothing"

    worker = spawn(settings, args, log)
    try:
        await wait_for(lambda: _at_least(committed_count, N), timeout_s=180,
                       what=f"{N} committed outputs")
        await asyncio.sleep(2)  # leave time for any duplicate to show up
    finally:
        worker.terminate()
        worker.wait(30)

    outputs = await read_topic(settings, sink)
    seqs = collections.Counter(r.event.sequence for r in outputs)
    duplicates = {s: c for s, c in seqs.items() if c > 1}
    assert not duplicates, f"applied twice: {list(duplicates)[:10]}"
    assert set(seqs) == set(range(N)), f"missing: {sorted(set(range(N)) - set(seqs))[:10]}"
    # The kills did leave aborted work behind: uncommitted reads see more records.
    raw = await read_topic(settings, sink, read_uncommitted=True)
    print(f"committed outputs after kills: {counts}; records incl. aborted: {len(raw)}")


async def _at_least(count, n: int) -> bool:
    return await count() >= n
