"""GroupBatcher: many tenants' requests, one backbone forward per compatible group.

``await batcher.submit(request)`` returns that request's VLAFeature. Requests
are normalised on submit (a bad one fails there, alone) and queued in the
bucket of their key (see ``backbone.inputs``). A bucket is flushed when it
holds ``target_batch`` requests (B), when its oldest request has waited
``max_wait_ms`` (T), or when it is complete: every source (an env session, given
as ``submit(request, source=...)``) answered in the last ``active_window_s``
has a request queued again, so nobody else is coming soon (a source said to be
finished, ``forget(source)``, is not waited for even within that window), or when
every source still expected is due only after the oldest request's T ("late": a
source is due its last round trip, answer to next request, after its last answer;
waiting T for it would only idle the device, and two groups of sessions answered
at different times would keep each other waiting T on every step). One flush takes at
most ``max_batch`` requests, oldest first, and runs ONE forward. The
completeness rule lets T be long enough for sessions answered together to come
back together (bigger groups) without making a lone session wait T per step.
Results go back to each request's own future, so nothing is lost or reordered.
If a forward fails, each request of the group is retried alone, so only the
culprit sees the error.

The forward runs through ``backbone.grouped`` (in a worker thread, on the device
gate's queue when one is given): the event loop stays responsive, and one forward
runs at a time, because the backbone is one device.
Each group is recorded (size, tenants, wait, busy time) for the utilisation report.
Given a ``FeatureCache``, every feature computed is put into it after its
request is answered (the key is computed on submit, in the worker thread that
prepares the request), so a later user of the same backbone (backbone-train)
finds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from backbone.feature import VLAFeature
from backbone.feature_cache import FeatureCache
from backbone.gate import DeviceGate
from backbone.grouped import forward_grouped_on
from backbone.inputs import BucketKey, Prepared, VLARequest
from backbone.model import Backbone
from infra.logging import get_logger

__all__ = ["BatcherConfig", "GroupBatcher", "GroupRecord"]

log = get_logger("backbone.batcher")


@dataclass(frozen=True)
class BatcherConfig:
    target_batch: int = 8  # B
    max_wait_ms: float = 10.0  # T
    max_batch: int = 32
    active_window_s: float = 1.0  # a source answered this recently is expected back

    def __post_init__(self) -> None:
        if not 1 <= self.target_batch <= self.max_batch:
            raise ValueError("need 1 <= target_batch <= max_batch")
        if self.max_wait_ms < 0:
            raise ValueError("max_wait_ms must be >= 0")
        if self.active_window_s < 0:
            raise ValueError("active_window_s must be >= 0")


@dataclass(frozen=True)
class GroupRecord:
    key: BucketKey
    size: int
    tenants: tuple[str, ...]  # one entry per request, in group order
    reason: str  # "full" (reached B), "complete" (every active source asked), "late" (the others
    # are due after T), "timeout" (waited T) or "drain" (stopping)
    wait_s: float  # how long the oldest request waited
    busy_s: float  # backbone forward time (inside the device gate; retries alone included)
    retried_alone: bool = False


@dataclass
class _Pending:
    prepared: Prepared
    future: asyncio.Future
    enqueued: float
    key: str | None = None  # in the feature cache
    source: str | None = None  # who will ask again once answered (an env session)


class GroupBatcher:
    def __init__(self, backbone: Backbone, config: BatcherConfig = BatcherConfig(),
                 clock: Callable[[], float] = time.monotonic,
                 on_group: Callable[[GroupRecord], None] | None = None, gate: DeviceGate | None = None,
                 queue: str = "inference", cache: FeatureCache | None = None):
        self.backbone = backbone
        self.cache = cache
        self.gate = gate  # shared with another user of the backbone (backbone/gate.py)
        self.queue = queue
        self.config = config
        self.clock = clock
        self.on_group = on_group
        self.records: deque[GroupRecord] = deque(maxlen=100_000)  # a service runs for days
        # totals over every group ever, kept as they come: heartbeats report them, and summing the
        # records instead cost a walk over up to 100k of them every 2 s
        self.groups = self.rows = self.group_tenants = 0
        self.by_reason: dict[str, int] = {}  # groups per flush reason: what a group waited for
        self.waited_s = 0.0  # summed over groups: how long each one's oldest request waited
        self._buckets: dict[BucketKey, deque[_Pending]] = {}
        self._answered: dict[BucketKey, dict[str, float]] = {}  # source -> when last answered
        self._round_trip: dict[str, float] = {}  # source -> its last answer-to-next-request seconds
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._busy_s = 0.0

    async def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="group-batcher")

    async def stop(self) -> None:
        """Flush everything still queued, then stop."""
        self._stopping = True
        self._wake.set()
        if self._task:
            await self._task
            self._task = None

    async def __aenter__(self) -> GroupBatcher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def submit(self, request: VLARequest, source: str | None = None) -> VLAFeature:
        """Queue one request; returns its features once its group has run. ``source`` names who
        sends it (an env session): only grouping uses it, never the result."""
        if self._task is None or self._stopping:
            raise RuntimeError("GroupBatcher is not running")
        prepared, key = await asyncio.to_thread(self._prepare, request)  # InvalidRequest: alone
        future = asyncio.get_running_loop().create_future()
        now = self.clock()
        answered_at = self._answered.get(prepared.key, {}).get(source) if source else None
        if answered_at is not None:
            self._round_trip[source] = now - answered_at
        self._buckets.setdefault(prepared.key, deque()).append(
            _Pending(prepared, future, now, key, source))
        self._wake.set()
        return await future

    def _prepare(self, request: VLARequest) -> tuple[Prepared, str | None]:
        prepared = self.backbone.prepare(request)  # InvalidRequest first: a bad request has no key
        return prepared, self.cache.key(request) if self.cache is not None else None

    def wake(self) -> None:
        """Re-check deadlines now (for a test clock that was moved forward)."""
        self._wake.set()

    def forget(self, source: str) -> None:
        """``source`` asks no more (its session ended): groups stop waiting for it now rather than
        after ``active_window_s`` of flushes on T."""
        self._round_trip.pop(source, None)
        for answered in self._answered.values():
            if answered.pop(source, None) is not None:
                self._wake.set()

    def pending(self) -> int:
        return sum(len(q) for q in self._buckets.values())

    # ------------------------------------------------------------------ scheduler
    def _due(self) -> tuple[BucketKey, str] | None:
        now, wait_s = self.clock(), self.config.max_wait_ms / 1000
        candidates = []
        for key, queue in self._buckets.items():
            if not queue:
                continue
            if len(queue) >= self.config.target_batch:
                candidates.append((queue[0].enqueued, key, "full"))
            elif self._stopping:
                candidates.append((queue[0].enqueued, key, "drain"))
            elif now - queue[0].enqueued >= wait_s:
                candidates.append((queue[0].enqueued, key, "timeout"))
            elif complete := self._complete(key, queue, now):
                candidates.append((queue[0].enqueued, key, complete))
        if not candidates:
            return None
        _, key, reason = min(candidates, key=lambda c: c[0])  # oldest request first
        return key, reason

    def _complete(self, key: BucketKey, queue: deque[_Pending], now: float) -> str | None:
        """"complete" when every source answered in the last window has asked again (none is
        expected); "late" when each one still expected is due after the oldest request's T."""
        answered = self._answered.get(key, {})
        self._forget_quiet(answered, now)
        if any(p.source is None for p in queue):
            return None  # an anonymous request waits for B or T, as before sources existed
        missing = answered.keys() - {p.source for p in queue}
        if not missing:
            return "complete"
        deadline = queue[0].enqueued + self.config.max_wait_ms / 1000
        trips = self._round_trip
        if all(s in trips and answered[s] + trips[s] > deadline for s in missing):
            return "late"
        return None

    def _forget_quiet(self, answered: dict[str, float], now: float) -> None:
        """Sources gone quiet (a closed session) no longer hold groups back."""
        for source in [s for s, at in answered.items() if now - at > self.config.active_window_s]:
            del answered[source]
            self._round_trip.pop(source, None)

    def _next_deadline_s(self) -> float | None:
        oldest = [q[0].enqueued for q in self._buckets.values() if q]
        if not oldest:
            return None
        return max(0.0, min(oldest) + self.config.max_wait_ms / 1000 - self.clock())

    async def _run(self) -> None:
        while True:
            due = self._due()
            if due is None:
                if self._stopping:
                    return
                self._wake.clear()
                timeout = self._next_deadline_s()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            key, reason = due
            queue = self._buckets[key]
            group = [queue.popleft() for _ in range(min(len(queue), self.config.max_batch))]
            await self._flush(key, group, reason)

    async def _flush(self, key: BucketKey, group: list[_Pending], reason: str) -> None:
        wait_s = self.clock() - group[0].enqueued
        self._busy_s = 0.0  # summed by _forward: device time only, not the wait for the gate
        retried = False
        try:
            features = await self._forward([p.prepared for p in group])
            for pending, feature in zip(group, features, strict=True):
                _resolve(pending.future, feature)
            if self.cache is not None:  # after the answers: an action never waits for the copies
                for pending, feature in zip(group, features, strict=True):
                    self.cache.put(pending.key, feature)
        except Exception as exc:  # isolate the culprit: every request alone
            retried = len(group) > 1
            log.warning("group forward failed; retrying requests alone", size=len(group),
                        error_class=type(exc).__name__, error=str(exc)[:300])
            for pending in group:
                try:
                    (feature,) = await self._forward([pending.prepared])
                    _resolve(pending.future, feature)
                except Exception as alone:
                    _fail(pending.future, alone)
        answered_at = self.clock()
        answered = self._answered.setdefault(key, {})
        for pending in group:
            if pending.source is not None:
                answered[pending.source] = answered_at
        self._forget_quiet(answered, answered_at)  # a service sees sessions come and go for days
        record = GroupRecord(key, len(group), tuple(p.prepared.tenant for p in group), reason,
                             wait_s, self._busy_s, retried)
        self.records.append(record)
        self.groups += 1
        self.rows += record.size
        self.group_tenants += len(set(record.tenants))
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        self.waited_s += wait_s
        if self.on_group:
            self.on_group(record)

    async def _forward(self, group: list[Prepared]) -> list[VLAFeature]:
        features, done = await forward_grouped_on(self.gate, self.queue, self.backbone, group)
        self._busy_s += sum(f.busy_s for f in done)
        return features


def _resolve(future: asyncio.Future, value: VLAFeature) -> None:
    if not future.done():  # the submitter may have been cancelled
        future.set_result(value)


def _fail(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
