"""A session the worker no longer runs (its partition was revoked) stops asking for actions: the
answers go to the worker that has it now, so its repeats would only load inference for nobody."""

from __future__ import annotations

import asyncio

import pytest

from consumers.env.session import SessionPorts, SessionRunner
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
