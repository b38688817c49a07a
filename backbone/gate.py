"""One device, two queues: inference forwards go before training forwards.

The inference role (latency-bound) and backbone-train (throughput-bound) share
the resident backbone. Each takes the gate before a forward; when the device
frees up, a waiting inference forward always goes first, and training waits
until no inference is queued. The gate also counts busy seconds per queue,
the numbers behind the "backbone busy fraction" of the demo's summary, and
keeps a timeline of every forward (``backbone/timeline.py``: queue, start, end
and the tenant of each row) for the run report and the benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence

from backbone.timeline import ForwardLog

__all__ = ["DeviceGate"]

QUEUES = ("inference", "train")


class DeviceGate:
    def __init__(self) -> None:
        self._busy = False
        self._waiting = {q: 0 for q in QUEUES}
        self._changed = asyncio.Condition()
        self.busy_s = {q: 0.0 for q in QUEUES}
        self.forwards = {q: 0 for q in QUEUES}
        self.started = time.monotonic()
        self.timeline = ForwardLog()  # one record per forward: the report's device timeline

    def _may_go(self, queue: str) -> bool:
        return not self._busy and (queue == "inference" or self._waiting["inference"] == 0)

    @contextlib.asynccontextmanager
    async def use(self, queue: str, tenants: Sequence[str] = ()) -> AsyncIterator[None]:
        """Hold the device for one forward of ``queue`` ("inference" or "train"); ``tenants``
        (one entry per row, optional) goes into the timeline record of this forward."""
        if queue not in QUEUES:
            raise ValueError(f"queue must be one of {QUEUES}, got {queue!r}")
        async with self._changed:
            self._waiting[queue] += 1
            try:
                await self._changed.wait_for(lambda: self._may_go(queue))
            finally:
                self._waiting[queue] -= 1
            self._busy = True
        began = time.monotonic()
        start_s = self.timeline.now()
        try:
            yield
        finally:
            self.busy_s[queue] += time.monotonic() - began
            self.timeline.add(queue, start_s, self.timeline.now(), tenants)
            self.forwards[queue] += 1
            async with self._changed:
                self._busy = False
                self._changed.notify_all()

    def busy_fraction(self) -> dict[str, float]:
        """Share of wall time since creation the device spent on each queue's forwards."""
        wall = max(time.monotonic() - self.started, 1e-9)
        return {q: self.busy_s[q] / wall for q in QUEUES}
