"""Dataset generation, then feeding one tenant's training queue, resumed after SIGKILLs
without skipping or repeating a batch (real broker)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from infra.settings import Settings
from infra.topics import TopicAdmin, tenant_topic
from producers.dataset.feeder import DatasetFeeder, FeedPlan
from producers.dataset.format import Dataset, layout_batches
from producers.dataset.generate import generate_dataset
from schemas import events as ev
from schemas.tensors import to_numpy
from tests.helpers import end_offset, read_topic, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    path = tmp_path_factory.mktemp("data") / "reach"
    generate_dataset("joynexus/Reach-v0", path, episodes=12, seed=3, image_size=32, progress=False)
    return Dataset(path)


def feed_process(settings: Settings, path: Path, tenant: str, job: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "JOYNEXUS_BOOTSTRAP_SERVERS": settings.bootstrap,
           "JOYNEXUS_HOME": str(settings.home)}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "infra", "dataset", "feed", str(path), "--tenant", tenant, "--job", job,
             "--batch-size", "4", "--epochs", "30", "--seed", "5", "--chunk-len", "4"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


async def test_feeder_resumes_after_kills_without_gaps_or_repeats(
        settings: Settings, unique: str, dataset: Dataset, tmp_path: Path) -> None:
    tenant, job = f"sft-{unique}", f"job-{unique}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_tenant(tenant)
    topic = tenant_topic(settings, tenant, "gradient-jobs")
    plan = FeedPlan(tenant, job, batch_size=4, epochs=30, seed=5, chunk_len=4)
    expected = DatasetFeeder(settings, dataset, plan)

    async def committed() -> int:
        return await end_offset(settings, topic)

    kills = []
    for threshold in (expected.total // 4, expected.total // 2):
        proc = feed_process(settings, dataset.path, tenant, job, tmp_path / "feed.log")
        await wait_for(lambda t=threshold: _at_least(committed, t), timeout_s=120,
                       what=f"{threshold} batches")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills.append(len(await read_topic(settings, topic)))
    assert kills[-1] < expected.total, "the feeder finished before the last kill; the test proved nothing"
    proc = feed_process(settings, dataset.path, tenant, job, tmp_path / "feed.log")
    assert await asyncio.to_thread(proc.wait, 120) == 0

    jobs = [r.event for r in await read_topic(settings, topic)]
    assert [j.sequence for j in jobs] == list(range(expected.total))  # no gap, no repeat, in order
    per_epoch = len(layout_batches(dataset, 4, 5, 0))
    for job_event in jobs[:: max(1, len(jobs) // 7)]:  # content = the plan's batch, bit for bit
        epoch, batch = divmod(job_event.sequence, per_epoch)
        assert job_event.batch_id == f"{job}/e{epoch}/b{batch}"
        mb = dataset.minibatch(layout_batches(dataset, 4, 5, epoch)[batch], 4)
        assert np.array_equal(to_numpy(job_event.images), mb.images)
        assert np.array_equal(to_numpy(job_event.targets["actions"]), mb.actions)
        assert np.array_equal(to_numpy(job_event.targets["action_mask"]), mb.action_mask)
        assert list(job_event.instructions) == mb.instructions
        assert isinstance(job_event, ev.GradientJob) and job_event.tenant_id == tenant
    # Run again: everything is in the log already, so nothing is published.
    assert await DatasetFeeder(settings, dataset, plan).run() == 0


async def _at_least(count, n: int) -> bool:
    return await count() >= n
