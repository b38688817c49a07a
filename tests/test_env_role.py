"""The env role against the real broker: sessions of several tenants stepping at once,
answered by an external action source, each tenant's rollouts in its own topic."""

from __future__ import annotations

import asyncio
import collections
import hashlib

import numpy as np
import pytest

from consumers.abc import RecordContext
from consumers.env import simulator_for
from consumers.env.worker import EnvWorker
from consumers.loop import ConsumeLoop
from infra.settings import Settings
from infra.topics import TopicAdmin, tenant_topic
from producers.producer import EventProducer
from schemas import events as ev
from schemas.tensors import from_numpy
from tests.helpers import read_topic, running, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow]


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
    worker = EnvWorker(settings, simulator_for, worker_id=f"w-{unique}")
    async with running(source), running(worker):
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
    # Every rollout step was answered; an observation may be asked twice (a rebalance restarts
    # a running episode, or an answer was late), never recorded twice.
    assert source.answered >= total_steps
