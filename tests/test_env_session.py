"""A session the worker no longer runs (its partition was revoked) stops asking for actions: the
answers go to the worker that has it now, so its repeats would only load inference for nobody. And
a revoke forgets its sessions before it waits for them, so the worker's loop cannot start them again
meanwhile."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.structs import TopicPartition

from consumers.env.session import SessionPorts, SessionRunner
from consumers.env.worker import EnvWorker
from infra.settings import Settings
from tests.test_env_pool import make, request


def _runner(still_mine: bool) -> tuple[SessionRunner, list]:
    published: list = []

    async def publish(observation) -> None:
        published.append(observation.step)

    async def never_answered(*key) -> None:
        await asyncio.Future()  # the actions partition is another worker's now

    async def unused(*args) -> None:
        raise AssertionError("no episode can finish without actions")

    ports = SessionPorts(publish, unused, unused, never_answered, make, still_mine=lambda: still_mine)
    return SessionRunner(request("t"), None, ports, "w", action_timeout_s=0.2), published


async def test_a_revoked_session_stops_asking_after_its_wait() -> None:
    runner, published = _runner(still_mine=False)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(runner.run(), 30)
    assert published == [0]  # asked once, waited, saw it was no longer its worker's, stopped


async def test_a_session_still_its_workers_asks_again() -> None:
    runner, published = _runner(still_mine=True)
    task = asyncio.create_task(runner.run())
    while len(published) < 3:
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert published[:3] == [0, 0, 0]


async def test_a_revoke_forgets_its_sessions_before_it_waits_for_them(settings: Settings) -> None:
    worker = EnvWorker(settings, make, worker_id="w", group_id="g", tenants="t")
    sessions, actions = TopicPartition("nexus.t.t.sessions", 0), TopicPartition("nexus.t.t.actions", 0)

    async def stubborn() -> None:  # a cancel that lands during a simulator step is seen only later
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await asyncio.sleep(0.5)
            raise

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    worker._home["s"], worker._specs["s"], worker._runners["s"] = sessions, request("t"), task
    worker._actions_ready.add(actions)
    revoking = asyncio.create_task(worker._revoke({sessions, actions}))
    await asyncio.sleep(0.1)
    assert not revoking.done()  # still waiting for the session to end...
    # ...and nothing is left from which the worker's loop could start it again meanwhile
    assert "s" not in worker._specs and "s" not in worker._runners and actions not in worker._actions_ready
    await revoking
    assert task.cancelled()
    await worker.producer.stop()  # never started: only their client objects are released
    await worker.consumer.stop()
