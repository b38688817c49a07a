"""GroupBatcher: flushes on B, on T and when every recently answered session asked again; never loses
or reorders, isolates bad requests.
A controllable clock decides what "T has passed" means: no timing assertions."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
import torch

from backbone.batcher import BatcherConfig, GroupBatcher
from backbone.inputs import InvalidRequest, VLARequest
from backbone.model import Backbone
from consumers.inference import _finished
from schemas import events as ev
from tests.helpers import wait_for
from tests.vla import requests


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _settle() -> None:
    for _ in range(50):  # give the batcher time to act (a wrong flush would happen here)
        await asyncio.sleep(0.01)


async def _ask(batcher: GroupBatcher, request: VLARequest, source: str) -> asyncio.Task:
    """Submit, wait until the request is queued (or already answered), then settle. Its prepare
    runs in a thread, so without the wait a slow prepare let the next request overtake it."""
    before = batcher.pending() + batcher.rows
    task = asyncio.create_task(batcher.submit(request, source=source))
    await wait_for(lambda: batcher.pending() + batcher.rows > before, what=f"{source}'s request queued")
    await _settle()
    return task


async def test_flushes_when_a_bucket_reaches_b(backbones: dict[str, Backbone]) -> None:
    clock = FakeClock()  # never advances: only B can trigger a flush
    config = BatcherConfig(target_batch=4, max_wait_ms=50, max_batch=4)
    batcher = GroupBatcher(backbones["tiny"], config, clock)
    async with batcher:
        feats = await asyncio.gather(*(batcher.submit(r) for r in requests(8, words=4)))
    assert len(feats) == 8
    assert [(r.size, r.reason) for r in batcher.records] == [(4, "full"), (4, "full")]
    assert batcher.by_reason == {"full": 2}


async def test_flushes_when_the_oldest_waited_t(backbones: dict[str, Backbone]) -> None:
    clock = FakeClock()
    batcher = GroupBatcher(backbones["tiny"], BatcherConfig(target_batch=8, max_wait_ms=50), clock)
    async with batcher:
        tasks = [asyncio.create_task(batcher.submit(r)) for r in requests(3, words=4)]
        await wait_for(lambda: batcher.pending() + batcher.rows == 3, what="the requests queued")
        await _settle()
        assert not batcher.records and batcher.pending() == 3  # below B, T not reached
        clock.now += 0.049
        batcher.wake()
        await _settle()
        assert not batcher.records
        clock.now += 0.002
        batcher.wake()
        await asyncio.gather(*tasks)
    assert [(r.size, r.reason) for r in batcher.records] == [(3, "timeout")]
    assert batcher.records[0].wait_s == pytest.approx(0.051)
    # the totals a heartbeat reports (consumers/inference.py): groups per reason, summed waits
    assert batcher.by_reason == {"timeout": 1} and batcher.waited_s == pytest.approx(0.051)


async def test_never_loses_or_reorders(backbones: dict[str, Backbone]) -> None:
    """Many tenants, mixed buckets, random arrival: each caller gets exactly the
    features of its own request computed alone."""
    backbone = backbones["tiny"]
    reqs = requests(24, seed=3) + requests(6, seed=4, cameras=2)
    random.Random(0).shuffle(reqs)
    batcher = GroupBatcher(backbone, BatcherConfig(target_batch=4, max_wait_ms=5, max_batch=6))
    async with batcher:
        feats = await asyncio.gather(*(batcher.submit(r) for r in reqs))
    for request, feature in zip(reqs, feats, strict=True):
        (alone,) = backbone.forward([backbone.prepare(request)])
        assert torch.equal(feature.sequence, alone.sequence)
        assert torch.equal(feature.proprio, alone.proprio)
    assert sum(r.size for r in batcher.records) == len(reqs)
    assert max(r.size for r in batcher.records) <= 6
    assert all(len(set(r.tenants)) == r.size for r in batcher.records)  # one request per tenant here
    assert batcher.pending() == 0
    # the running totals heartbeats report are the records' sums
    assert (batcher.groups, batcher.rows) == (len(batcher.records), len(reqs))
    assert batcher.group_tenants == sum(len(set(r.tenants)) for r in batcher.records)


async def test_a_bad_request_fails_alone(backbones: dict[str, Backbone]) -> None:
    reqs = requests(4, words=4)
    bad = VLARequest("mallory", [np.zeros((8, 8), np.uint8)], "pick up the cube")
    batcher = GroupBatcher(backbones["tiny"], BatcherConfig(target_batch=4, max_wait_ms=5))
    async with batcher:
        results = await asyncio.gather(*(batcher.submit(r) for r in [*reqs[:2], bad, *reqs[2:]]),
                                       return_exceptions=True)
    assert isinstance(results[2], InvalidRequest)
    assert all(not isinstance(r, BaseException) for i, r in enumerate(results) if i != 2)


class FlakyBackbone:
    """The real backbone, except a forward containing tenant 'poison' raises (a stand-in
    for a device fault that only one request triggers)."""

    def __init__(self, real: Backbone):
        self.real = real

    def prepare(self, request):
        return self.real.prepare(request)

    def forward(self, group):
        if any(p.tenant == "poison" for p in group):
            raise RuntimeError("device fault")
        return self.real.forward(group)


async def test_a_forward_failure_is_isolated_to_its_culprit(backbones: dict[str, Backbone]) -> None:
    reqs = requests(4, words=4)
    reqs[1] = VLARequest("poison", reqs[1].images, reqs[1].instruction)
    # frozen clock: the four form one group (B) however far apart their threaded prepares end
    batcher = GroupBatcher(FlakyBackbone(backbones["tiny"]), BatcherConfig(target_batch=4), FakeClock())
    async with batcher:
        results = await asyncio.gather(*(batcher.submit(r) for r in reqs), return_exceptions=True)
    assert isinstance(results[1], RuntimeError)
    assert all(not isinstance(r, BaseException) for i, r in enumerate(results) if i != 1)
    assert batcher.records[0].retried_alone


async def test_stop_drains_what_is_queued(backbones: dict[str, Backbone]) -> None:
    clock = FakeClock()
    batcher = GroupBatcher(backbones["tiny"], BatcherConfig(target_batch=8, max_wait_ms=1e6), clock)
    await batcher.start()
    tasks = [asyncio.create_task(batcher.submit(r)) for r in requests(3, words=4)]
    await wait_for(lambda: batcher.pending() == 3, what="the requests queued")
    await batcher.stop()
    assert all(t.done() and not t.exception() for t in tasks)
    assert [r.reason for r in batcher.records] == ["drain"]
    with pytest.raises(RuntimeError, match="not running"):
        await batcher.submit(requests(1)[0])


async def test_a_group_flushes_once_every_recently_answered_session_asked_again(
        backbones: dict[str, Backbone]) -> None:
    clock = FakeClock()  # frozen: T (10 s here) never passes, so only completeness flushes
    config = BatcherConfig(target_batch=8, max_wait_ms=10_000, active_window_s=1.0)
    batcher = GroupBatcher(backbones["tiny"], config, clock)
    a, b, c = requests(3, words=4)

    async def ask(*pairs: tuple[VLARequest, str]) -> list[asyncio.Task]:
        return [await _ask(batcher, r, s) for r, s in pairs]

    async with batcher:
        await batcher.submit(a, source="s-a")  # nobody else was ever answered: complete alone
        waiting = await ask((b, "s-b"), (c, "s-c"))  # s-a was answered just now: it is expected
        assert len(batcher.records) == 1 and batcher.pending() == 2
        await asyncio.gather(*waiting, *await ask((a, "s-a")))
        # all three answered together: two of them asking again is not a group yet
        waiting = await ask((a, "s-a"), (b, "s-b"))
        assert len(batcher.records) == 2 and batcher.pending() == 2
        await asyncio.gather(*waiting, *await ask((c, "s-c")))
        # s-c goes quiet (its session ended): after the window it no longer holds the others back
        waiting = await ask((a, "s-a"), (b, "s-b"))
        assert len(batcher.records) == 3
        clock.now += 1.01
        batcher.wake()
        await asyncio.gather(*waiting)
    assert [(r.size, r.reason) for r in batcher.records] == [
        (1, "complete"), (3, "complete"), (3, "complete"), (2, "complete")]


async def test_a_finished_session_holds_nobody_back(backbones: dict[str, Backbone]) -> None:
    clock = FakeClock()  # frozen: neither T nor the active window passes
    config = BatcherConfig(target_batch=8, max_wait_ms=10_000, active_window_s=1.0)
    batcher = GroupBatcher(backbones["tiny"], config, clock)
    a, b = requests(2, words=4)
    async with batcher:
        await batcher.submit(a, source="s-a")  # nobody else was ever answered: complete alone
        # s-b first, queued before s-a asks again: in one gather, whichever threaded prepare ended
        # first went first, and s-a alone was a complete group that left s-b waiting for s-a
        # forever (T and the window are frozen)
        await asyncio.gather(await _ask(batcher, b, "s-b"), batcher.submit(a, source="s-a"))
        waiting = await _ask(batcher, a, "s-a")
        assert batcher.pending() == 1  # s-b was answered just now: it is expected back
        batcher.forget("s-b")  # its session ended
        await asyncio.wait_for(waiting, 10)  # without forget: never (T and the window are frozen)
        batcher.forget("never-seen")  # harmless
    assert [(r.size, r.reason) for r in batcher.records] == [(1, "complete"), (2, "complete"),
                                                              (1, "complete")]


def test_inference_forgets_a_session_at_its_last_episode_or_its_close() -> None:
    """What the inference role calls ``forget`` on (``_finished``): a close, a final status, or
    the progress of the episode that completes the session's count; not a session midway, nor
    one whose request it has not seen (it cannot know the count)."""
    envelope = ev.Envelope(tenant_id="t")
    spec = ev.EnvSessionRequested(envelope=envelope, session_id="s", job_id="j", env_id="e",
                                  obs_mode="state", image_size=32, cameras=1, seed=0, episodes=2)
    endless = spec.model_copy(update={"session_id": "forever", "episodes": None})
    sessions = {"s": spec, "forever": endless}

    def progress(sid: str, done: int, status=ev.SessionStatus.RUNNING) -> ev.EnvSessionProgress:
        return ev.EnvSessionProgress(envelope=envelope, session_id=sid, job_id="j", status=status,
                                     episodes_completed=done, steps_completed=10 * done, successes=0,
                                     restarts=0, worker_id="w")

    assert not _finished(spec, sessions)
    assert not _finished(progress("s", 1), sessions)
    assert _finished(progress("s", 2), sessions)
    assert not _finished(progress("forever", 50), sessions)
    assert _finished(progress("forever", 50, ev.SessionStatus.CLOSED), sessions)
    assert _finished(progress("forever", 3, ev.SessionStatus.FAILED), sessions)
    assert not _finished(progress("unknown", 9), sessions)
    assert _finished(ev.EnvSessionClosed(envelope=envelope, session_id="unknown", job_id="j",
                                         reason="cancelled"), sessions)


async def test_a_group_does_not_wait_t_for_sessions_due_after_it(backbones: dict[str, Backbone]) -> None:
    """A session is due its last round trip (answer to next request) after its last answer; when
    every one still expected is due after the oldest request's T, waiting would only idle the
    device (and two groups answered at different times would keep each other waiting T)."""
    clock = FakeClock()  # moved by hand: T = 50 ms passes only where the test says
    batcher = GroupBatcher(backbones["tiny"], BatcherConfig(target_batch=8, max_wait_ms=50), clock)
    a, b = requests(2, words=4)

    async def ask(request: VLARequest, source: str) -> asyncio.Task:
        return await _ask(batcher, request, source)

    async with batcher:
        await batcher.submit(a, source="s-a")  # t = 0: alone, complete
        clock.now += 0.03
        await asyncio.gather(await ask(b, "s-b"), await ask(a, "s-a"))  # s-a came back in 30 ms
        clock.now += 0.1
        # s-b waits for s-a (due at 0.03 + 0.03, within T), then both took 100 ms to come back
        await asyncio.gather(await ask(b, "s-b"), await ask(a, "s-a"))
        clock.now += 0.01
        await ask(b, "s-b")  # s-a is due at 0.13 + 0.1, after 0.14 + T: flushed now, "late"
        assert batcher.pending() == 0
        clock.now += 0.08
        waiting = await ask(a, "s-a")  # s-b is due at 0.14 + 0.01, within T: it waits
        assert batcher.pending() == 1
        await asyncio.gather(waiting, await ask(b, "s-b"))
    assert [(r.size, r.reason) for r in batcher.records] == [
        (1, "complete"), (2, "complete"), (2, "complete"), (1, "late"), (2, "complete")]


async def test_a_lone_session_never_waits_t(backbones: dict[str, Backbone]) -> None:
    clock = FakeClock()
    batcher = GroupBatcher(backbones["tiny"], BatcherConfig(target_batch=8, max_wait_ms=10_000), clock)
    async with batcher:
        for request in requests(4, words=4):
            await batcher.submit(request, source="only")
    assert [(r.size, r.reason) for r in batcher.records] == [(1, "complete")] * 4
