"""A short event round trip through the broker: the smoke test a user runs first.

Provisions a tenant, starts a consumer group over its topics and the shared
ones, publishes events of every kind the architecture names (a small job's
worth: submission, lifecycle, observations, actions, rollouts, gradient jobs,
feature batches, a policy version, heartbeats, usage), and checks that each
comes back equal to what was sent. Events carry this run's id as their
correlation id, so earlier runs on the same topics do not count.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from consumers.bus.loop import ConsumeLoop, StartAt
from consumers.bus.protocols import RecordContext
from infra.settings import Settings
from infra.topics import TopicAdmin, shared_topic, tenant_topic
from producers.producer import EventProducer
from schemas import events as ev
from schemas.tensors import from_numpy

__all__ = ["RoundTripReport", "run_roundtrip"]


@dataclass(frozen=True)
class Row:
    topic: str
    event: str
    sent: int
    received: int
    p50_ms: float
    max_ms: float


@dataclass(frozen=True)
class RoundTripReport:
    rows: list[Row]
    ok: bool
    total: int


def _events(settings: Settings, tenant: str, run_id: str, n: int) -> list[tuple[str, ev.Event, str]]:
    """(topic, event, key) for one small job's worth of traffic."""
    rng = np.random.default_rng(0)

    def env() -> ev.Envelope:
        return ev.Envelope(tenant_id=tenant, producer_id="roundtrip", correlation_id=run_id)

    def t(stream: str) -> str:
        return tenant_topic(settings, tenant, stream)

    job, session = f"job-{run_id}", f"{tenant}-session-0"
    image = from_numpy(rng.integers(0, 255, (1, 32, 32, 3), dtype=np.uint8))
    proprio = from_numpy(rng.standard_normal(7).astype(np.float32))
    action = from_numpy(rng.standard_normal((4, 7)).astype(np.float32))
    out: list[tuple[str, ev.Event, str]] = [
        (t("jobs"), ev.JobSubmitted(envelope=env(), job_id=job, kind=ev.JobKind.RL,
                                    spec_json='{"kind": "rl"}'), tenant),
        (t("status"), ev.JobAccepted(envelope=env(), job_id=job, kind=ev.JobKind.RL,
                                     resources={"features": t("features")}), tenant),
    ]
    for i in range(n):
        obs = ev.Observation(envelope=env(), session_id=session, episode_id="0", step=i,
                             instruction="push the cube to the goal", image=image, proprio=proprio)
        out += [
            (t("observations"), obs, session),
            (t("actions"), ev.Action(envelope=env(), session_id=session, episode_id="0", step=i,
                                     action=action, policy_version=0, log_prob=-1.5), session),
            (t("rollouts"), ev.RolloutRecord(
                envelope=env(), session_id=session, episode_id="0", step=i, reset_seed=7,
                observation=obs, action=action, reward=0.0, terminated=False,
                truncated=i == n - 1, success=False, policy_version=0), session),
            (t("gradient-jobs"), ev.GradientJob(
                envelope=env(), job_id=job, batch_id=f"{job}/{i}", sequence=i, policy_version=0,
                instructions=("push the cube to the goal",), images=image, proprio=proprio,
                targets={"actions": action}), tenant),
            (t("features"), ev.FeatureBatch(
                envelope=env(), job_id=job, batch_id=f"{job}/{i}", sequence=i, policy_version=0,
                backbone_id="none", features={"pooled": from_numpy(np.zeros((1, 64), np.float32))},
                targets={"actions": action}, group_size=1, source_offset=i), tenant),
            (t("status"), ev.JobProgress(envelope=env(), job_id=job, step=i + 1, total_steps=n,
                                         metrics={"loss": 1.0 / (i + 1)}), tenant),
            (shared_topic(settings, "health"), ev.Heartbeat(
                envelope=env(), role="roundtrip", instance_id=run_id, host="localhost", pid=0,
                status=ev.RoleStatus.HEALTHY, sequence=i), "roundtrip"),
            (shared_topic(settings, "usage"), ev.UsageRecorded(
                envelope=env(), usage_id=f"{run_id}/{i}", role="roundtrip", resource="none",
                device="cpu", seconds=0.0, window_start=datetime.now(UTC),
                window_end=datetime.now(UTC), group_size=1), tenant),
        ]
    out += [
        (t("policy-versions"), ev.PolicyVersionPublished(
            envelope=env(), job_id=job, version=1, parent_version=0, step=n,
            checkpoint=ev.BlobRef(uri="file:///dev/null", sha256="0" * 64, size_bytes=0),
            source_offsets={t("features") + ":0": n}, metrics={}), tenant),
        (t("status"), ev.JobCompleted(envelope=env(), job_id=job, final_policy_version=1,
                                      metrics={"loss": 1.0 / n}), tenant),
    ]
    return out


async def run_roundtrip(settings: Settings, tenant: str, n: int, timeout_s: float = 60) -> RoundTripReport:
    run_id = uuid.uuid4().hex[:12]
    async with TopicAdmin(settings) as admin:
        await admin.ensure_shared()
        topics = await admin.ensure_tenant(tenant)
    topics += [shared_topic(settings, "health"), shared_topic(settings, "usage")]

    received: dict[str, tuple[ev.Event, float]] = {}

    async def handler(event: ev.Event, ctx: RecordContext) -> None:
        if event.envelope.correlation_id == run_id:
            received[event.envelope.event_id] = (event, time.time())

    loop = ConsumeLoop(settings, group_id=f"roundtrip-{run_id}", topics=topics, handler=handler,
                       role="roundtrip", start_at=StartAt(time=datetime.now(UTC)))
    await loop.start()
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    try:
        await _wait_assigned(loop, timeout_s)
        sent = _events(settings, tenant, run_id, n)
        async with EventProducer(settings) as producer:
            for topic, event, key in sent:
                await producer.enqueue(topic, event, key)
            await producer.flush()
        deadline = time.monotonic() + timeout_s
        while len(received) < len(sent) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task
        await loop.stop()
    return _report(sent, received)


async def _wait_assigned(loop: ConsumeLoop, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not loop.consumer.assignment() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    # Partitions are sought to "now" in the assignment callback; give it a beat to finish.
    await asyncio.sleep(0.5)


def _report(
    sent: list[tuple[str, ev.Event, str]], received: dict[str, tuple[ev.Event, float]],
) -> RoundTripReport:
    groups: dict[tuple[str, str], list[float | None]] = {}
    ok = True
    for topic, event, _ in sent:
        got = received.get(event.envelope.event_id)
        intact = got is not None and got[0] == event
        ok &= intact
        latency = (got[1] - event.envelope.occurred_at.timestamp()) * 1000 if intact else None
        groups.setdefault((topic, type(event).__name__), []).append(latency)
    rows = []
    for (topic, name), lats in sorted(groups.items()):
        good = [x for x in lats if x is not None]
        rows.append(Row(topic, name, len(lats), len(good),
                        statistics.median(good) if good else float("nan"),
                        max(good) if good else float("nan")))
    return RoundTripReport(rows, ok and len(received) == len(sent), len(sent))
