"""The env role against the real broker: sessions of several tenants stepping at once,
answered by an external action source, each tenant's rollouts in its own topic."""

from __future__ import annotations

import asyncio
import collections
import functools
import hashlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import TopicPartition

from consumers.bus.loop import ConsumeLoop
from consumers.bus.protocols import RecordContext
from consumers.env import simulator_for
from consumers.env.worker import EnvWorker
from infra.runtime.host import RoleHost
from infra.settings import Settings
from infra.topics import TopicAdmin, tenant_topic
from producers.producer import EventProducer
from schemas import events as ev
from schemas.tensors import from_numpy
from tests.helpers import read_topic, running, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]


def action_for(session_id: str, episode_id: str, step: int, dim: int) -> np.ndarray:
    """Deterministic in (session, episode, step), as the platform's RL sampling is."""
    seed = int.from_bytes(hashlib.sha256(f"{session_id}|{episode_id}|{step}".encode()).digest()[:8], "little")
    return np.random.default_rng(seed).uniform(-1, 1, dim).astype(np.float32)


class ActionSource:
    """A test stand-in for the inference role: answers every Observation with an Action."""

    def __init__(self, settings: Settings, pattern: str, action_dim: int, group: str):
        self.settings = settings
        self.action_dim = action_dim
        self.answered = 0
        self.producer = EventProducer(settings, client_id="test-action-source")
        self.loop = ConsumeLoop(settings, group_id=group, pattern=pattern, handler=self.answer,
                                role="test-inference", dlq_producer=self.producer)

    async def answer(self, obs: ev.Event, ctx: RecordContext) -> None:
        assert isinstance(obs, ev.Observation)
        action = action_for(obs.session_id, obs.episode_id, obs.step, self.action_dim)
        await self.producer.send(
            tenant_topic(self.settings, obs.tenant_id, "actions"),
            ev.Action(envelope=ev.Envelope(tenant_id=obs.tenant_id), session_id=obs.session_id,
                      episode_id=obs.episode_id, step=obs.step, action=from_numpy(action),
                      policy_version=0),
            key=obs.session_id)
        self.answered += 1

    async def start(self) -> None:
        await self.producer.start()
        await self.loop.start()

    async def run(self, stop: asyncio.Event) -> None:
        await self.loop.run(stop)

    async def stop(self) -> None:
        await self.loop.stop()
        await self.producer.stop()


def session_request(tenant: str, sid: str, env_id: str, episodes: int, steps: int,
                    seed: int = 7) -> ev.EnvSessionRequested:
    return ev.EnvSessionRequested(
        envelope=ev.Envelope(tenant_id=tenant), session_id=sid, job_id=f"job-{sid}", env_id=env_id,
        obs_mode="rgb", image_size=32, cameras=1, seed=seed, episodes=episodes, max_episode_steps=steps)


async def request_sessions(settings: Settings, requests: list[ev.EnvSessionRequested]) -> None:
    async with EventProducer(settings) as producer:
        for request in requests:
            await producer.send(tenant_topic(settings, request.tenant_id, "sessions"), request,
                                key=request.session_id)


async def episodes_by_session(settings: Settings, tenant: str) -> dict[str, dict[str, list[int]]]:
    """session -> episode -> the steps recorded for it (committed rollouts only)."""
    out: dict[str, dict[str, list[int]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for record in await read_topic(settings, tenant_topic(settings, tenant, "rollouts")):
        event = record.event
        assert isinstance(event, ev.RolloutRecord) and event.tenant_id == tenant
        out[event.session_id][event.episode_id].append(event.step)
    return out


async def test_three_tenants_step_concurrently_each_in_its_own_topics(settings: Settings,
                                                                      unique: str) -> None:
    tenants = [f"env{i}-{unique}" for i in range(3)]
    async with TopicAdmin(settings) as admin:
        await admin.ensure_shared()
        for tenant in tenants:
            await admin.ensure_tenant(tenant)
    episodes, steps = 2, 6
    requests = [session_request(t, f"{t}-s{j}", "joynexus/Reach-v0", episodes, steps)
                for t in tenants for j in range(2 if t == tenants[0] else 1)]
    source = ActionSource(settings, rf"^nexus\.t\.env\d-{unique}\.observations$", 2, f"act-{unique}")
    worker = EnvWorker(settings, simulator_for, worker_id=f"w-{unique}", group_id=f"env-{unique}",
                       tenants=rf"env\d-{unique}")
    # hosted as a process hosts it: the host heartbeats for the worker
    async with running(source), RoleHost(settings, roles={"env": worker}, instance=f"w-{unique}"):
        await request_sessions(settings, requests)

        async def all_done() -> bool:
            for t in tenants:
                sessions = await episodes_by_session(settings, t)
                mine = [r for r in requests if r.tenant_id == t]
                if any(len(sessions.get(r.session_id, {})) < episodes for r in mine):
                    return False
            return True

        await wait_for(all_done, timeout_s=120, what="every session's episodes")
    for t in tenants:
        sessions = await episodes_by_session(settings, t)
        assert set(sessions) == {r.session_id for r in requests if r.tenant_id == t}
        for sid, eps in sessions.items():
            assert sorted(eps) == [f"{sid}/0", f"{sid}/1"]
            for steps_seen in eps.values():
                assert steps_seen == list(range(len(steps_seen))) and 1 <= len(steps_seen) <= steps
    total_steps = 0
    for t in tenants:
        total_steps += sum(len(steps) for eps in (await episodes_by_session(settings, t)).values()
                           for steps in eps.values())
    metered = [r.event for r in await read_topic(settings, "nexus.usage")
               if isinstance(r.event, ev.UsageRecorded) and r.event.role == "env"
               and r.event.tenant_id in tenants]
    assert sum(u.steps for u in metered) == total_steps  # each committed step metered once
    assert len({u.usage_id for u in metered}) == len(metered)
    beats = [r.event for r in await read_topic(settings, "nexus.health")
             if isinstance(r.event, ev.Heartbeat) and r.event.instance_id == f"w-{unique}"]
    assert beats[0].status == ev.RoleStatus.STARTING and beats[-1].status == ev.RoleStatus.STOPPING
    assert [b.sequence for b in beats] == list(range(len(beats))) and beats[0].role == "env"
    assert any(b.partitions for b in beats) and beats[-1].progress_at is not None  # the sample is real
    # Every rollout step was answered; an observation may be asked twice (a rebalance restarts
    # a running episode, or an answer was late), never recorded twice.
    assert source.answered >= total_steps
    # the worker's heartbeat says how long its latest steps waited for their action
    waits = beats[-1].details
    assert int(waits["action_waits"]) >= total_steps
    assert 0 < float(waits["action_wait_p50_ms"]) <= float(waits["action_wait_p99_ms"]) \
        <= float(waits["action_wait_max_ms"])
    assert int(waits["late_actions"]) == sum(1 for w in worker.action_waits if w >= 10.0)


async def test_the_next_session_of_a_tenant_reuses_the_finished_sessions_simulator(settings: Settings,
                                                                                   unique: str) -> None:
    tenant = f"reuse-{unique}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_shared()
        await admin.ensure_tenant(tenant)
    source = ActionSource(settings, rf"^nexus\.t\.{re.escape(tenant)}\.observations$", 2, f"act-{unique}")
    worker = EnvWorker(settings, simulator_for, worker_id=f"w-{unique}", group_id=f"env-{unique}",
                       tenants=re.escape(tenant))
    async with running(source), running(worker):
        for j in range(2):  # an RL job's iterations: one session after the other
            request = session_request(tenant, f"{tenant}-it{j}", "joynexus/Reach-v0", 2, 5)
            await request_sessions(settings, [request])

            async def done(sid: str = request.session_id) -> bool:
                return len((await episodes_by_session(settings, tenant)).get(sid, {})) == 2

            await wait_for(done, timeout_s=120, what=f"session {j}")
            await wait_for(lambda: worker.simulators.idle == 1, timeout_s=10, what="the simulator kept")
        # finished sessions are forgotten: the worker's pass after every poll walks live ones only
        await wait_for(lambda: not worker._specs, timeout_s=10, what="the finished sessions forgotten")
    assert (worker.simulators.made, worker.simulators.reused) == (1, 1)


async def status_events(settings: Settings, tenant: str) -> list[ev.Event]:
    return [r.event for r in await read_topic(settings, tenant_topic(settings, tenant, "status"))]


@pytest.mark.parametrize("fault, isolation", [("raise", "thread"), ("hang", "thread"),
                                              ("exit", "process"), ("hang", "process")])
async def test_a_failing_simulator_restarts_in_place_and_others_never_notice(
        settings: Settings, unique: str, tmp_path, fault: str, isolation: str) -> None:
    """raise/hang in-process, and a simulator process that dies (as a segfault would) or hangs
    in a child process: restarted in place, the episode re-run, the other tenant unaffected."""
    faulty, calm = f"flt-{unique}-{fault}-{isolation}", f"calm-{unique}-{fault}-{isolation}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_shared()
        for tenant in (faulty, calm):
            await admin.ensure_tenant(tenant)
    once = tmp_path / "faulted"
    env_id = f"joynexus/Faulty-v0?fault={fault}&at_step=3&once_file={once}&hang_s=60"
    requests = [session_request(faulty, f"{faulty}-s", env_id, 2, 6),
                session_request(calm, f"{calm}-s", "joynexus/Reach-v0", 2, 6)]
    pattern = rf"^nexus\.t\.({re.escape(faulty)}|{re.escape(calm)})\.observations$"
    source = ActionSource(settings, pattern, 2, f"act-{unique}-{fault}-{isolation}")
    worker = EnvWorker(settings, functools.partial(simulator_for, isolation=isolation),
                       worker_id=f"w-{unique}-{fault}", step_timeout_s=4.0,
                       group_id=f"env-{unique}-{fault}-{isolation}",
                       tenants=f"{re.escape(faulty)}|{re.escape(calm)}")
    async with running(source), running(worker):
        await request_sessions(settings, requests)

        async def both_done() -> bool:
            for request in requests:
                eps = (await episodes_by_session(settings, request.tenant_id)).get(request.session_id, {})
                if len(eps) < 2:
                    return False
            return True

        await wait_for(both_done, timeout_s=120, what="both sessions' episodes")
    assert once.exists(), "the fault never fired; the test proved nothing"
    for request in requests:
        eps = (await episodes_by_session(settings, request.tenant_id))[request.session_id]
        assert sorted(eps) == [f"{request.session_id}/0", f"{request.session_id}/1"]
        assert all(steps == list(range(len(steps))) for steps in eps.values())
    restarted = [e for e in await status_events(settings, faulty) if isinstance(e, ev.EnvSessionRestarted)]
    assert len(restarted) == 1
    assert restarted[0].episode_id == f"{faulty}-s/0"
    assert restarted[0].error_class == ("SimulatorHung" if fault == "hang" else "SimulatorError")
    assert not [e for e in await status_events(settings, calm) if isinstance(e, ev.EnvSessionRestarted)]


def spawn_env_worker(settings: Settings, worker_id: str, log_path, group: str,
                     tenants: str) -> subprocess.Popen:
    env = {**os.environ, "JOYNEXUS_BOOTSTRAP_SERVERS": settings.bootstrap,
           "JOYNEXUS_SESSION_TIMEOUT_MS": "6000", "JOYNEXUS_HEARTBEAT_INTERVAL_MS": "1000",
           "JOYNEXUS_HOME": str(settings.home)}
    with open(log_path, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "infra", "run", "env", "--instance", worker_id,
                                 "--group", group, "--tenants", tenants],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def sessions_per_partition(prefix: str, partitions: int, per_partition: int) -> list[str]:
    """Session ids that the producer's default partitioner spreads evenly over the partitions."""
    chosen: dict[int, list[str]] = collections.defaultdict(list)
    for j in range(10_000):
        sid = f"{prefix}-s{j}"
        p = DefaultPartitioner()(sid.encode(), list(range(partitions)), list(range(partitions)))
        if len(chosen[p]) < per_partition:
            chosen[p].append(sid)
        if all(len(chosen[q]) == per_partition for q in range(partitions)):
            return [sid for q in range(partitions) for sid in chosen[q]]
    raise AssertionError("could not spread session ids over the partitions")


async def group_members(settings: Settings, group: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap)
    await admin.start()
    try:
        (description,) = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    _, _, state, _, _, members, *_ = description.groups[0]
    return len(members) if state == "Stable" else 0


async def progress_writers(settings: Settings, tenant: str) -> dict[str, set[str]]:
    """session -> the env workers that committed its progress."""
    out: dict[str, set[str]] = collections.defaultdict(set)
    for record in await read_topic(settings, tenant_topic(settings, tenant, "sessions")):
        if isinstance(record.event, ev.EnvSessionProgress):
            out[record.event.session_id].add(record.event.worker_id)
    return out


async def test_a_killed_env_worker_loses_no_episode_and_repeats_none(settings: Settings, unique: str,
                                                                    tmp_path) -> None:
    tenant, episodes, steps, group = f"elastic-{unique}", 8, 12, f"env-{unique}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_shared()
        await admin.ensure_tenant(tenant)
    # Two sessions per partition, so that every worker has sessions whatever it is assigned.
    sids = sessions_per_partition(tenant, settings.partitions, 2)
    requests = [session_request(tenant, sid, "joynexus/Reach-v0", episodes, steps, seed=j * 100)
                for j, sid in enumerate(sids)]
    source = ActionSource(settings, rf"^nexus\.t\.{re.escape(tenant)}\.observations$", 2, f"act-{unique}")
    workers = {w: spawn_env_worker(settings, w, tmp_path / f"{w}.log", group, re.escape(tenant))
               for w in ("wa", "wb")}
    try:
        async with running(source):
            # Both workers in the group before any session exists: each gets its share.
            await wait_for(lambda: _is(group_members(settings, group), 2), timeout_s=90,
                           what="two env workers in the group")
            await request_sessions(settings, requests)

            async def both_working() -> bool:
                writers = set().union(*(await progress_writers(settings, tenant)).values())
                return writers >= {"wa", "wb"}

            await wait_for(both_working, timeout_s=240, what="both workers to commit episodes")
            before = await episodes_by_session(settings, tenant)
            workers["wa"].send_signal(signal.SIGKILL)
            workers["wa"].wait()

            async def all_done() -> bool:
                sessions = await episodes_by_session(settings, tenant)
                return all(len(sessions.get(r.session_id, {})) == episodes for r in requests)

            await wait_for(all_done, timeout_s=180, what="every episode after the kill")
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
    assert sum(len(e) for e in before.values()) < episodes * len(requests), "killed after the end"
    sessions = await episodes_by_session(settings, tenant)
    for request in requests:
        eps = sessions[request.session_id]
        assert sorted(eps, key=lambda e: int(e.rsplit("/", 1)[1])) == \
            [f"{request.session_id}/{k}" for k in range(episodes)]
        for steps_seen in eps.values():  # each step recorded exactly once
            assert steps_seen == list(range(len(steps_seen)))
    writers = await progress_writers(settings, tenant)
    taken_over = [sid for sid, w in writers.items() if w == {"wa", "wb"}]
    assert taken_over, "no session moved from the killed worker to the survivor"


async def _is(value, expected) -> bool:
    return await value == expected


async def test_a_tenant_deleted_under_a_running_worker_stops_nothing_else(settings: Settings,
                                                                           unique: str) -> None:
    """``tenant delete`` while the env role runs another tenant's session. A deleted tenant's
    partitions can be in an assignment made from metadata older than the deletion; asking for their
    offsets (aiokafka retries for a whole request timeout, 40 s) kept the rebalance listener past
    the group session, the worker was expelled, and every other session stalled."""
    calm, doomed = f"del0-{unique}", f"del1-{unique}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_shared()
        await admin.ensure_tenant(calm)
        await admin.ensure_tenant(doomed)
    source = ActionSource(settings, rf"^nexus\.t\.del\d-{unique}\.observations$", 2, f"act-{unique}")
    worker = EnvWorker(settings, simulator_for, worker_id=f"w-{unique}", group_id=f"env-{unique}",
                       tenants=rf"del\d-{unique}")
    request = session_request(calm, f"{calm}-s0", "joynexus/Reach-v0", 30, 10)

    async def done() -> bool:
        sessions = await episodes_by_session(settings, calm)
        return len(sessions.get(request.session_id, {})) == request.episodes

    async with running(source), running(worker), TopicAdmin(settings) as admin:
        # the offsets of a deleted topic's partition, asked for as the listener asks: in bounded
        # time, the partition left out, the others answered
        gone = TopicPartition(tenant_topic(settings, doomed, "sessions"), 0)
        alive = TopicPartition(tenant_topic(settings, calm, "sessions"), 0)
        await admin.delete_tenant(doomed)
        await wait_for(lambda: not {tp.topic for tp in worker.consumer.assignment()} & {gone.topic},
                       timeout_s=60, what="the deleted tenant's partitions revoked")
        assert set(await worker._end_offsets([gone, alive])) == {alive} and gone in worker._gone
        # the tenant made and deleted over and over (each a rebalance of the worker's group) while
        # the other tenant's session runs: it ends, every episode whole, no action late
        await request_sessions(settings, [request])
        deadline = asyncio.get_running_loop().time() + 240
        while not await done():
            assert asyncio.get_running_loop().time() < deadline, "the session did not end"
            await admin.ensure_tenant(doomed)
            await asyncio.sleep(settings.pattern_refresh_ms / 1000)
            await admin.delete_tenant(doomed)
            await asyncio.sleep(0.5)
    sessions = await episodes_by_session(settings, calm)
    assert sorted(sessions[request.session_id], key=lambda e: int(e.rsplit("/", 1)[1])) == \
        [f"{request.session_id}/{k}" for k in range(request.episodes)]
    assert worker.late_actions == 0
