"""One device, two queues: inference forwards go before training forwards.

The inference role (latency-bound) and backbone-train (throughput-bound) share
the resident backbone. Each takes the gate before a forward; when the device
frees up, a waiting inference forward always goes first, and training waits
until no inference is queued. The gate also counts busy seconds per queue,
the numbers behind the "backbone busy fraction" of the demo's summary, and
keeps a timeline of every forward (``backbone/timeline.py``: queue, start, end
and the tenant of each row) for the run report and the benchmarks.

Inference can only go first when a forward ends, so a training forward over
hundreds of rows would hold the device for seconds while actions wait. With a
``train_budget_s``, the gate bounds that: it learns the seconds per row of
training forwards (a moving average over the forwards it saw) and
``chunk_rows("train")`` says how many rows fit in the budget, so the grouped
forward splits a training group into chunks and an inference forward waits at
most about one budget. Chunking changes no feature: a row computes the same
whatever shares its forward (``backbone/grouped.py``).

Inference first must not mean training never: with enough sessions, some
inference is always queued when a forward ends (the real-weights backbone on
2 CPU cores with 18 sessions starved training for 60 s, and the health role
judged backbone-train HUNG). With a ``train_max_wait_s``, a training forward
that has waited that long goes next, ahead of queued inference: inference then
waits at most one training chunk per ``train_max_wait_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence

from backbone.timeline import ForwardLog

__all__ = ["DeviceGate"]

QUEUES = ("inference", "train")
FIRST_CHUNK_ROWS = 8  # before the gate has timed a training forward
SMOOTHING = 0.3  # weight of the newest forward in the seconds-per-row average


class DeviceGate:
    def __init__(self, train_budget_s: float | None = None, train_max_wait_s: float | None = None) -> None:
        if train_budget_s is not None and train_budget_s <= 0:
            raise ValueError(f"train_budget_s must be positive or None, got {train_budget_s}")
        if train_max_wait_s is not None and train_max_wait_s < 0:
            raise ValueError(f"train_max_wait_s must be >= 0 or None, got {train_max_wait_s}")
        self.train_budget_s = train_budget_s
        self.train_max_wait_s = train_max_wait_s
        self._train_since: list[float] = []  # when each waiting training forward began to wait
        self.row_s: dict[str, float | None] = {q: None for q in QUEUES}  # seconds per row, averaged
        self._busy = False
        self._waiting = {q: 0 for q in QUEUES}
        self._changed = asyncio.Condition()
        self.busy_s = {q: 0.0 for q in QUEUES}
        self.forwards = {q: 0 for q in QUEUES}
        self.started = time.monotonic()
        self.timeline = ForwardLog()  # one record per forward: the report's device timeline

    def _starving(self, since: float) -> bool:
        return self.train_max_wait_s is not None and time.monotonic() - since >= self.train_max_wait_s

    def _may_go(self, queue: str, since: float) -> bool:
        if self._busy:
            return False
        if queue == "inference":
            return not (self._train_since and self._starving(min(self._train_since)))
        return self._waiting["inference"] == 0 or self._starving(since)

    def chunk_rows(self, queue: str) -> int | None:
        """The most rows one forward of ``queue`` should take (None: no bound). Only training
        forwards are bounded, and only with a budget."""
        if queue != "train" or self.train_budget_s is None:
            return None
        per_row = self.row_s["train"]
        if per_row is None:
            return FIRST_CHUNK_ROWS
        return max(1, int(self.train_budget_s / max(per_row, 1e-9)))

    @contextlib.asynccontextmanager
    async def use(self, queue: str, rows: int | None = None,
                  tenants: Sequence[str] = ()) -> AsyncIterator[None]:
        """Hold the device for one forward of ``queue`` ("inference" or "train") over ``rows`` rows
        (when given, the forward's time per row feeds ``chunk_rows``); ``tenants`` (one entry per
        row, optional) goes into the timeline record of this forward."""
        rows = rows or len(tenants) or None
        if queue not in QUEUES:
            raise ValueError(f"queue must be one of {QUEUES}, got {queue!r}")
        since = time.monotonic()
        async with self._changed:
            self._waiting[queue] += 1
            if queue == "train":
                self._train_since.append(since)
            try:
                await self._changed.wait_for(lambda: self._may_go(queue, since))
            finally:
                self._waiting[queue] -= 1
                if queue == "train":
                    self._train_since.remove(since)
            self._busy = True
        began = time.monotonic()
        start_s = self.timeline.now()
        try:
            yield
        finally:
            took = time.monotonic() - began
            self.busy_s[queue] += took
            self.timeline.add(queue, start_s, self.timeline.now(), tenants)
            self.forwards[queue] += 1
            if rows:
                last, now = self.row_s[queue], took / rows
                self.row_s[queue] = now if last is None else (1 - SMOOTHING) * last + SMOOTHING * now
            async with self._changed:
                self._busy = False
                self._changed.notify_all()
