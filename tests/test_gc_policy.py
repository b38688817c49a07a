"""The role processes' garbage collector (``infra/runtime/gc_policy.py``): tuned, still collecting
cycles, and its time measured for the heartbeat."""

from __future__ import annotations

import gc
import weakref

from infra.runtime import gc_policy


class Node:
    pass


def test_tune_freezes_the_startup_heap_raises_the_young_threshold_and_still_collects_cycles() -> None:
    before = gc.get_threshold()
    try:
        gc_policy.tune()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (gc_policy.YOUNG_THRESHOLD, *before[1:])
        cycle = Node()
        cycle.me = cycle
        alive = weakref.ref(cycle)
        del cycle
        kept = [[] for _ in range(2 * gc_policy.YOUNG_THRESHOLD)]  # net allocations: a young collection
        assert alive() is None
        del kept
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_gc_clock_adds_up_the_collections_it_saw_and_stops_seeing_them() -> None:
    clock = gc_policy.GcClock().start()
    try:
        for _ in range(3):
            gc.collect()
        assert clock.collections >= 3
        assert clock.seconds > 0.0
    finally:
        clock.stop()
    seen = clock.collections
    gc.collect()
    assert clock.collections == seen
    assert clock not in gc.callbacks


async def test_a_role_processes_heartbeat_carries_its_collector_seconds() -> None:
    from consumers.bus.protocols import Workload
    from infra.runtime.host import _Sampler

    class Idle:
        def workload(self) -> Workload:
            return Workload(details={"sessions": 2})

    clock = gc_policy.GcClock().start()
    try:
        gc.collect()
        sample = await _Sampler(Idle(), clock)()
    finally:
        clock.stop()
    assert sample.details["sessions"] == 2
    assert clock.seconds > 0.0 and sample.details["gc_s"] == round(clock.seconds, 3)
    assert "gc_s" not in (await _Sampler(Idle())()).details  # in-process hosts: no clock, no figure
