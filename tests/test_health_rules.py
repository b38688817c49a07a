"""The health manager's rules as pure functions: verdicts from heartbeats, env worker targets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from infra.healthbook import HealthBook
from infra.runtime.scaling import LAG_HIGH, env_target
from schemas import events as ev

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def beat(seq: int, *, pid: int = 10, lag: int = 0, pending: int = 0, progress_s: float | None = None,
         status: ev.RoleStatus = ev.RoleStatus.HEALTHY) -> ev.Heartbeat:
    at = T0 + timedelta(seconds=2 * seq)
    return ev.Heartbeat(envelope=ev.Envelope(occurred_at=at), role="rollout", instance_id="rollout-0.h",
                        host="h", pid=pid, status=status, sequence=seq, lag=lag, pending=pending,
                        progress_at=None if progress_s is None else T0 + timedelta(seconds=progress_s))


def test_silence_is_dead_once_per_process() -> None:
    clock = Clock()
    book = HealthBook(clock)
    book.apply(beat(0))
    clock.now = 7.9
    assert book.verdicts(health_timeout_s=8, stall_timeout_s=60) == []
    clock.now = 8.5
    (verdict,) = book.verdicts(health_timeout_s=8, stall_timeout_s=60)
    assert verdict.verdict == "DEAD" and verdict.state.pid == 10 and "8.5" in verdict.reason
    clock.now = 30
    assert book.verdicts(health_timeout_s=8, stall_timeout_s=60) == []  # judged already
    book.apply(beat(1, pid=11))  # restarted: a new process, judged afresh
    clock.now = 40
    assert [v.state.pid for v in book.verdicts(health_timeout_s=8, stall_timeout_s=60)] == [11]


def test_stalled_with_work_waiting_is_hung_idle_is_not() -> None:
    clock = Clock()
    book = HealthBook(clock)
    for seq in range(40):  # 78 s of beats, progress last at 10 s
        book.apply(beat(seq, lag=0, progress_s=10))
    assert book.verdicts(health_timeout_s=8, stall_timeout_s=60) == []  # no work waits: idle, fine
    book.apply(beat(40, lag=5, progress_s=10))
    (verdict,) = book.verdicts(health_timeout_s=8, stall_timeout_s=60)
    assert verdict.verdict == "HUNG" and "lag 5" in verdict.reason
    book.apply(beat(41, pending=3, progress_s=81))  # progress again
    assert book.verdicts(health_timeout_s=8, stall_timeout_s=60) == []


def test_a_paused_machine_is_not_hung_by_its_pause() -> None:
    """A VM held by its host for 2 minutes stopped every process at once (2026-12-03: the broker
    and every role silent for 130 s); the first beats after it showed 135 s without progress, and
    the optimizer was killed as HUNG. A gap in a sender's beats is not time it was seen stalling."""
    clock = Clock()
    book = HealthBook(clock, pause_s=8)
    for seq in range(5):  # work waits, no progress since 0 s
        book.apply(beat(seq, lag=5, progress_s=0))
    book.apply(beat(70, lag=5, progress_s=0))  # 132 s later by its own clock: paused
    assert book.verdicts(health_timeout_s=8, stall_timeout_s=60) == []
    for seq in range(71, 100):  # 58 s more, seen running, still no progress
        book.apply(beat(seq, lag=5, progress_s=0))
    assert book.verdicts(health_timeout_s=8, stall_timeout_s=60) == []
    book.apply(beat(101, lag=5, progress_s=0))  # 62 s seen without progress: hung after all
    (verdict,) = book.verdicts(health_timeout_s=8, stall_timeout_s=60)
    assert verdict.verdict == "HUNG" and "62.0" in verdict.reason


def test_a_clean_stop_is_never_judged() -> None:
    clock = Clock()
    book = HealthBook(clock)
    book.apply(beat(0, status=ev.RoleStatus.STOPPING, lag=9))
    clock.now = 1000
    assert book.verdicts(health_timeout_s=8, stall_timeout_s=60) == []


def test_env_target() -> None:
    kw = {"per_worker": 4, "lo": 1, "hi": 3}
    assert env_target(1, 0, 0, **kw) == 1
    assert env_target(1, 5, 0, **kw) == 2
    assert env_target(2, 100, 0, **kw) == 3  # never above hi
    assert env_target(3, 4, 0, **kw) == 1  # the supervisor waits before acting on a lower target
    assert env_target(1, 2, LAG_HIGH + 1, **kw) == 2  # unread records: one more
    assert env_target(0, 0, 0, per_worker=4, lo=0, hi=3) == 0
