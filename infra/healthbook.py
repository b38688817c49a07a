"""The health book: every role instance's latest heartbeat, and the verdicts that follow from them.

A fold over ``nexus.health`` (heartbeats, verdicts, restarts), kept by the health
role, each machine's supervisor and ``joynexus health``. The rules, in one place:

* DEAD: no heartbeat for ``health_timeout_s`` (a killed, crashed or SIGSTOPped
  process), measured on the reader's own clock from when the last beat was READ,
  so a reader that just started, or clocks that disagree between machines, never
  declare a live instance dead;
* HUNG: heartbeats go on, but the instance has made no progress for
  ``stall_timeout_s`` while work waits for it (consumer lag, or work it holds),
  measured on the sender's clock (its beat time minus its last progress), and only
  over time it was seen running: a gap of more than ``pause_s`` between two of its
  beats (its own clock) starts the count afresh. Such a gap is a pause of the sender
  (the whole machine: a VM held by its host, a suspended laptop), during which no
  process progresses; a sender whose loop was blocked that long on a live machine
  was silent too, and is judged DEAD by a reader that watched the silence;
* an instance whose last beat said STOPPING left cleanly: never judged.

A verdict is given once per (instance, pid): the next one needs a new process.
``HealthView`` keeps a book current by reading the topic from a recent moment on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord, TopicPartition

from infra.follow import TopicFollower
from infra.logging import get_logger
from infra.settings import Settings
from infra.topics import shared_topic
from schemas import events as ev

__all__ = ["HealthBook", "HealthView", "InstanceState", "Verdict"]

log = get_logger("infra.healthbook")


@dataclass
class InstanceState:
    role: str
    instance_id: str
    host: str
    pid: int
    status: str
    beat_at: datetime  # the sender's clock
    read_at: float  # the reader's monotonic clock
    first_beat_at: datetime
    partitions: tuple[str, ...] = ()
    lag: int = -1
    pending: int = 0
    progress_at: datetime | None = None
    resumed_at: datetime | None = None  # the sender's first beat after its last pause
    restarts: int = 0
    details: dict[str, str] = field(default_factory=dict)
    verdict: str | None = None  # DEAD / HUNG once judged, for this pid

    @property
    def stopped(self) -> bool:
        return self.status == ev.RoleStatus.STOPPING.value

    @property
    def waiting(self) -> bool:
        return self.lag > 0 or self.pending > 0

    def stalled_s(self) -> float:
        """Seconds without progress, by the sender's own clock."""
        since = self.progress_at or self.first_beat_at
        if self.resumed_at is not None and self.resumed_at > since:
            since = self.resumed_at
        return (self.beat_at - since).total_seconds()


@dataclass(frozen=True)
class Verdict:
    state: InstanceState
    verdict: str  # DEAD or HUNG
    reason: str


class HealthBook:
    """Latest state per (role, instance); ``verdicts`` applies the rules above."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, pause_s: float = 8.0):
        """``pause_s``: a gap between one sender's beats longer than this is a pause (see above)."""
        self.clock = clock
        self.pause_s = pause_s
        self.instances: dict[tuple[str, str], InstanceState] = {}
        self.restarts: list[ev.InstanceRestarted] = []
        self.verdict_events: list[ev.InstanceVerdict] = []

    def apply(self, event: ev.Event, record: ConsumerRecord | None = None) -> None:
        if isinstance(event, ev.Heartbeat):
            self._beat(event)
        elif isinstance(event, ev.InstanceRestarted):
            self.restarts.append(event)
        elif isinstance(event, ev.InstanceVerdict):
            self.verdict_events.append(event)
            state = self.instances.get((event.role, event.instance_id))
            if state is not None and state.pid == event.pid:
                state.verdict = event.verdict

    def _beat(self, beat: ev.Heartbeat) -> None:
        key = (beat.role, beat.instance_id)
        old = self.instances.get(key)
        same_process = old is not None and old.pid == beat.pid and old.host == beat.host
        resumed_at = old.resumed_at if same_process else None
        gap_s = (beat.envelope.occurred_at - old.beat_at).total_seconds() if same_process else 0.0
        if gap_s > self.pause_s:
            resumed_at = beat.envelope.occurred_at
            log.warning("instance was paused; its stall count starts again", role=beat.role,
                        instance=beat.instance_id, pid=beat.pid, gap_s=round(gap_s, 1))
        self.instances[key] = InstanceState(
            role=beat.role, instance_id=beat.instance_id, host=beat.host, pid=beat.pid,
            status=beat.status.value, beat_at=beat.envelope.occurred_at, read_at=self.clock(),
            first_beat_at=old.first_beat_at if same_process else beat.envelope.occurred_at,
            partitions=tuple(beat.partitions), lag=beat.lag, pending=beat.pending,
            progress_at=beat.progress_at, resumed_at=resumed_at, restarts=beat.restarts,
            details=dict(beat.details),
            verdict=old.verdict if same_process else None,
        )

    def verdicts(self, health_timeout_s: float, stall_timeout_s: float) -> list[Verdict]:
        """New verdicts (each instance's process is judged once); marks them given."""
        out = []
        now = self.clock()
        for state in self.instances.values():
            if state.stopped or state.verdict is not None:
                continue
            silent = now - state.read_at
            if silent > health_timeout_s:
                out.append(Verdict(state, "DEAD", f"no heartbeat for {silent:.1f} s "
                                                  f"(health_timeout_s={health_timeout_s:g})"))
            elif state.waiting and state.stalled_s() > stall_timeout_s:
                out.append(Verdict(state, "HUNG", f"no progress for {state.stalled_s():.1f} s with "
                                                  f"lag {state.lag} and {state.pending} pending "
                                                  f"(stall_timeout_s={stall_timeout_s:g})"))
        for v in out:
            v.state.verdict = v.verdict
        return out

    def of_role(self, role: str, live_within_s: float | None = None) -> list[InstanceState]:
        now = self.clock()
        return [s for s in self.instances.values() if s.role == role and not s.stopped
                and (live_within_s is None or now - s.read_at <= live_within_s)]


class HealthView:
    """A ``HealthBook`` kept current from ``nexus.health``, read from ``lookback_s`` ago on (the
    topic keeps a day of beats; a reader needs only the last few)."""

    def __init__(self, settings: Settings, lookback_s: float = 60.0, name: str = "health",
                 on_event: Callable[[ev.Event], None] | None = None):
        self.settings = settings
        self.book = HealthBook(pause_s=settings.health_timeout_s)
        self.lookback_s = lookback_s
        self.on_event = on_event
        self.topic = shared_topic(settings, "health")
        self.follower = TopicFollower(settings, self.topic, self._apply, name=name, seek=self._seek,
                                      settle_s=settings.read_model_settle_ms / 1000)

    def _apply(self, event: ev.Event, record: ConsumerRecord) -> None:
        self.book.apply(event, record)
        if self.on_event is not None:
            self.on_event(event)

    async def _seek(self, consumer: AIOKafkaConsumer, partitions: list[TopicPartition]) -> None:
        since_ms = int((time.time() - self.lookback_s) * 1000)
        found = await consumer.offsets_for_times({tp: since_ms for tp in partitions})
        ends = await consumer.end_offsets(partitions)
        for tp in partitions:
            consumer.seek(tp, found[tp].offset if found.get(tp) else ends[tp])

    async def start(self) -> None:
        await self.follower.start()

    async def stop(self) -> None:
        await self.follower.stop()

    async def caught_up(self, timeout_s: float = 30.0) -> None:
        await self.follower.caught_up([self.topic], timeout_s)

    async def __aenter__(self) -> HealthView:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
