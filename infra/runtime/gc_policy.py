"""The garbage collector of a role process: what it may walk, how often, and what it costs.

A role process allocates short-lived containers by the million (Kafka responses, decoded events)
and holds a large heap that lives as long as it does (modules, the backbone, its clients). With
CPython's defaults every 700 net allocations start a young collection, and a full one walks the
whole heap: GC was 6-17% of the device host's, rollout's and evaluator's busy samples in a profiled
benchmark run (py-spy, 2026-12-01). So, once start-up is done (``tune``):

* what start-up built is frozen: no collection walks it again;
* a young collection waits for ``YOUNG_THRESHOLD`` net allocations: most containers have died by
  then (reference counting frees them), so fewer survive into the older generations to be walked
  again. Cycles are still collected, later;
* ``GcClock`` adds up the seconds spent collecting, for the heartbeat (``gc_s``).
"""

from __future__ import annotations

import gc
import time

__all__ = ["YOUNG_THRESHOLD", "GcClock", "tune"]

YOUNG_THRESHOLD = 10_000  # CPython's default: 700


class GcClock:
    """Seconds this process spent in the garbage collector since ``start`` (a ``gc.callbacks`` hook)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self._began: float | None = None

    def __call__(self, phase: str, _info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began is not None:
            self.seconds += time.perf_counter() - self._began
            self.collections += 1
            self._began = None

    def start(self) -> GcClock:
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        return self

    def stop(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)


def tune() -> None:
    """Freeze the start-up heap and raise the young generation's threshold (see the module doc)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
