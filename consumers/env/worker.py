"""The env role: a consumer group (``env``) hosting every tenant's simulator sessions.

It subscribes by pattern to the tenants' ``sessions`` and ``actions`` topics.
Both are keyed by session id and have the same partition count, and the group
uses Kafka's range assignor, so the worker that owns partition p of a tenant's
sessions also owns partition p of its actions: a session and its actions
always live on one worker. Adding a worker moves partitions, and with them
sessions; a killed worker's partitions move to the survivors.

Sessions topics are folded from the beginning whenever a partition is assigned
(requests, closes and the latest progress of each session: a compacted
changelog) and never committed; a session then resumes at its first
uncommitted episode. Actions topics start at their end on assignment: only
actions answering observations published from then on matter.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections import deque
from collections.abc import Callable

from aiokafka import ConsumerRebalanceListener
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import IllegalStateError, KafkaError
from aiokafka.structs import TopicPartition

from consumers.bus.loop import make_consumer
from consumers.bus.protocols import Workload
from consumers.env.pool import SimulatorPool
from consumers.env.session import ACTION_TIMEOUT_S, SessionPorts, SessionRunner
from envs.base import Simulator
from infra.errors import SchemaError, TenantMismatch
from infra.logging import get_logger
from infra.settings import Settings
from infra.stats import nearest_rank
from infra.topics import (
    check_tenant,
    parse_topic,
    shared_topic,
    sibling_topic,
    tenant_stream_pattern,
    tenant_topic,
)
from producers.producer import EventProducer
from schemas import events as ev
from schemas.codec import Codec
from schemas.sessions import rollout_key

__all__ = ["EnvWorker", "progress_key"]

FINISHED = (ev.SessionStatus.CLOSED, ev.SessionStatus.FAILED)
log = get_logger("consumers.env.worker")
REVOKE_WAIT_S = 5.0  # how long a revoked session gets to end before the rebalance goes on
GROUP = "env"
ACTION_WAITS_KEPT = 2000  # the heartbeat's action-wait percentiles are over the latest steps
POSITION_WAIT_S = 0.2  # per partition and loop turn; aiokafka's position() alone waits up to 40 s
SETUP_WAIT_S = 2.0  # for the end offsets of newly assigned sessions partitions (in the listener)


def progress_key(session_id: str) -> str:
    # Progress must survive compaction beside the request, so it has a key of its own
    # (and is sent to the request's partition explicitly).
    return f"{session_id}#progress"


class _Listener(ConsumerRebalanceListener):
    def __init__(self, worker: EnvWorker):
        self.worker = worker

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.worker._revoke(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.worker._assign(assigned)


class EnvWorker:
    def __init__(self, settings: Settings, make_simulator: Callable[[ev.EnvSessionRequested], Simulator],
                 *, worker_id: str | None = None, step_timeout_s: float = 30.0, max_restarts: int = 3,
                 group_id: str = GROUP, tenants: str = r"[^.]+", codec: Codec | None = None):
        """``tenants`` is a regex of the tenant ids this worker serves (a pool of env
        workers per tenant group, or one test's tenants); ``group_id`` names the pool."""

        self.settings = settings
        self.simulators = SimulatorPool(make_simulator)
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.step_timeout_s = step_timeout_s
        self.max_restarts = max_restarts
        self.codec = codec or Codec.for_settings(settings)
        self.group_id = group_id
        self.consumer = make_consumer(
            settings, group_id, pattern=tenant_stream_pattern(settings, "sessions|actions", tenants),
            listener=_Listener(self), assignors=(RangePartitionAssignor,))
        self.producer = EventProducer(settings, self.codec, client_id=f"env-{self.worker_id}")
        self.answered = 0  # actions received for a waiting step: the worker's progress (a re-ask is not)
        self.action_waits: deque[float] = deque(maxlen=ACTION_WAITS_KEPT)  # seconds, newest last
        self.late_actions = 0  # steps whose action came after the session's re-ask interval
        self._starting_beats = 0  # heartbeats taken while a simulator was starting: progress too
        self._txn: dict[TopicPartition, EventProducer] = {}
        self._txn_locks: dict[TopicPartition, asyncio.Lock] = {}
        self._actions_ready: set[TopicPartition] = set()  # positioned at their end
        self._to_position: set[TopicPartition] = set()  # sought to their end, position not yet known
        self._folding: dict[TopicPartition, int] = {}  # sessions partitions still catching up: end offset
        self._specs: dict[str, ev.EnvSessionRequested] = {}
        self._progress: dict[str, ev.EnvSessionProgress] = {}
        self._closed: set[str] = set()
        self._home: dict[str, TopicPartition] = {}  # session -> its sessions partition
        self._runners: dict[str, asyncio.Task] = {}
        self._waiting: dict[tuple[str, str, int], asyncio.Future] = {}
        self._early: dict[tuple[str, str, int], ev.Action] = {}
        self._set_up: set[TopicPartition] = set()  # positioned by _setup_partitions since assigned
        self._gone: set[TopicPartition] = set()  # assigned, but their topics were deleted

    # ------------------------------------------------------------------ life cycle
    async def start(self) -> None:
        await self.producer.start()
        await self.consumer.start()

    async def stop(self) -> None:
        await self._revoke(set(self._home.values()) | set(self._txn))
        await self.consumer.stop()
        await self.producer.stop()
        self.simulators.close()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        await self._loop(stop or asyncio.Event())

    def workload(self) -> Workload:
        if self.simulators.starting:
            # A simulator start (ManiSkill: minutes under load) answers no action, but it runs under
            # the session's own watchdog (START_TIMEOUT_S), which restarts a start that hangs; the
            # health manager must not kill the whole worker for it.
            self._starting_beats += 1
        return Workload((self.consumer,), done=self.answered + self._starting_beats,
                        details={"sessions": len(self._runners), "group": self.group_id,
                                 "simulators_started": self.simulators.made,
                                 "simulators_reused": self.simulators.reused, **self._wait_stats()})

    def _wait_stats(self) -> dict[str, float]:
        """How long the latest steps waited for their action (ms): what a user feels of the service."""
        if not self.action_waits:
            return {}
        waits = sorted(self.action_waits)

        def ms(q: float) -> float:
            return round(1000 * nearest_rank(waits, q), 1)

        return {"action_waits": len(waits), "action_wait_p50_ms": ms(0.5), "action_wait_p99_ms": ms(0.99),
                "action_wait_max_ms": ms(1.0), "late_actions": self.late_actions}

    async def _loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.simulators.expire()
            batches = await self.consumer.getmany(timeout_ms=100)
            for tp, records in batches.items():
                stream = parse_topic(tp.topic).stream
                for record in records:
                    self._dispatch(stream, tp, record)
            for tp, end in list(self._folding.items()):
                # position, not the last record: transaction markers occupy offsets too
                position = await self._position(tp) if tp in self.consumer.assignment() else end
                if position is not None and position >= end:
                    del self._folding[tp]
            await self._set_up_missed()
            await self._resolve_positions()
            await self._caught_up()
            for sid, task in list(self._runners.items()):
                if task.done():
                    self._reap(sid, task)

    # ------------------------------------------------------------------ records
    def _dispatch(self, stream: str, tp: TopicPartition, record) -> None:
        try:
            event = self.codec.decode(record.value)
        except SchemaError as exc:
            # Not ours to dead-letter here: sessions/actions are written by joynexus itself.
            log.error("undecodable record skipped", topic=tp.topic, partition=tp.partition,
                      offset=record.offset, error=str(exc)[:200])
            return
        try:
            check_tenant(tp.topic, event.tenant_id)  # the topic decides whose session this is
        except TenantMismatch:
            return  # logged as a security event; a session is never run for a forged envelope
        if stream == "actions" and isinstance(event, ev.Action):
            self._deliver(event)
        elif isinstance(event, ev.EnvSessionRequested):
            self._specs[event.session_id] = event
            self._home[event.session_id] = tp
        elif isinstance(event, ev.EnvSessionClosed):
            self._closed.add(event.session_id)
            task = self._runners.get(event.session_id)
            if task:
                task.cancel()
        elif isinstance(event, ev.EnvSessionProgress):
            self._progress[event.session_id] = event

    def _deliver(self, action: ev.Action) -> None:
        key = (action.session_id, action.episode_id, action.step)
        future = self._waiting.pop(key, None)
        if future is not None and not future.done():
            future.set_result(action)
            self.answered += 1
        elif action.session_id in self._runners:
            self._early[key] = action  # answered before the runner asked (it will, shortly)

    async def next_action(self, session_id: str, episode_id: str, step: int) -> ev.Action:
        key = (session_id, episode_id, step)
        if key in self._early:
            self.answered += 1
            return self._early.pop(key)
        for stale in [k for k in self._early if k[0] == session_id]:  # answers to steps long gone
            del self._early[stale]
        future = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        try:
            return await future
        finally:
            self._waiting.pop(key, None)

    async def _caught_up(self) -> None:
        """Start runners for the active sessions of every sessions partition that is folded. A
        finished session is forgotten here: this runs after every poll, and walking every session
        the worker ever saw made each pass cost more the longer the service ran."""
        for sid, spec in list(self._specs.items()):
            tp = self._home[sid]
            if sid in self._runners:
                continue
            progress = self._progress.get(sid)
            if sid in self._closed or (progress is not None and progress.status in FINISHED):
                self._specs.pop(sid)  # a re-read of its partition finds it finished again
                self._home.pop(sid)
                continue
            if tp in self._folding:
                continue
            actions = TopicPartition(sibling_topic(tp.topic, "actions"), tp.partition)
            if tp not in self.consumer.assignment() or actions not in self._actions_ready:
                continue  # a session runs only where its actions are consumed, from "now" on
            runner = SessionRunner(spec, progress, self._ports(tp), self.worker_id,
                                   self.step_timeout_s, self.max_restarts)
            self._runners[sid] = asyncio.create_task(runner.run(), name=f"session-{sid}")
            log.info("session started", tenant=spec.tenant_id, session=sid,
                     episodes_done=runner.episodes, partition=tp.partition)

    def _reap(self, sid: str, task: asyncio.Task) -> None:
        del self._runners[sid]
        if task.cancelled():
            return
        if task.exception() is not None:
            # A bus error (not the simulator's): the session starts again from its
            # last committed episode on the next pass.
            # _progress only moves after a commit, so the restart resumes exactly there.
            log.error("session runner failed; restarting it", session=sid,
                      error_class=type(task.exception()).__name__, error=str(task.exception())[:300])
        else:
            self._closed.add(sid)

    # ------------------------------------------------------------------ ports
    def _ports(self, sessions_tp: TopicPartition) -> SessionPorts:
        async def publish_observation(obs: ev.Observation) -> None:
            topic = tenant_topic(self.settings, obs.tenant_id, "observations")
            await self.producer.send(topic, obs, key=obs.session_id)

        async def publish_status(event: ev.Event) -> None:
            await self.producer.send(tenant_topic(self.settings, event.tenant_id, "status"), event,
                                     key=event.tenant_id)

        async def commit_episode(records: list[ev.RolloutRecord], progress: ev.EnvSessionProgress) -> None:
            await self._commit(sessions_tp, records, progress)

        return SessionPorts(publish_observation, commit_episode, publish_status, self.next_action,
                            self.simulators.acquire, self.simulators.release, self._action_waited,
                            self._runs_current_task)

    def _action_waited(self, seconds: float) -> None:
        self.action_waits.append(seconds)
        self.late_actions += seconds >= ACTION_TIMEOUT_S

    def _runs_current_task(self) -> bool:
        """Whether the calling session task is still one this worker runs (not revoked since)."""
        task = asyncio.current_task()
        return any(runner is task for runner in self._runners.values())

    async def _commit(self, tp: TopicPartition, records: list[ev.RolloutRecord],
                      progress: ev.EnvSessionProgress) -> None:
        """An episode's rollouts and the session's progress: one transaction."""
        lock = self._txn_locks.setdefault(tp, asyncio.Lock())
        async with lock:
            producer = self._txn.get(tp)
            if producer is None:
                producer = EventProducer(self.settings, self.codec,
                                         transactional_id=f"{self.group_id}-{tp.topic}-{tp.partition}",
                                         client_id=f"env-{self.worker_id}-txn")
                await producer.start()  # fences a previous owner of this partition
                self._txn[tp] = producer
            rollouts = tenant_topic(self.settings, progress.tenant_id, "rollouts")
            async with producer.transaction():
                for record in records:
                    await producer.enqueue(rollouts, record, key=rollout_key(record.session_id))
                if records:  # metered in the same transaction: a re-run episode counts once
                    await producer.enqueue(shared_topic(self.settings, "usage"), self._usage(records),
                                           key=progress.tenant_id)
                await producer.enqueue_raw(tp.topic, self.codec.encode(progress),
                                           key=progress_key(progress.session_id), partition=tp.partition)
            self._progress[progress.session_id] = progress

    def _usage(self, records: list[ev.RolloutRecord]) -> ev.UsageRecorded:
        """An episode's env steps, for metering (steps, not device-seconds: simulators run on hosts)."""
        first, last = records[0], records[-1]
        return ev.UsageRecorded(
            envelope=ev.Envelope(tenant_id=first.tenant_id, producer_id=f"env/{self.worker_id}"),
            usage_id=f"env/{first.episode_id}", role="env", resource="env.step", device="host",
            seconds=0.0, window_start=first.envelope.occurred_at, window_end=last.envelope.occurred_at,
            group_size=1, steps=len(records))

    # ------------------------------------------------------------------ rebalance
    async def _assign(self, assigned: set[TopicPartition]) -> None:
        try:
            await self._setup_partitions(assigned)
        except IllegalStateError:
            # New tenants' topics trigger rebalances back to back; a partition taken away while we
            # awaited is set up by the assignment that follows, the others by the main loop.
            self._set_up -= assigned
            log.info("partitions reassigned during setup", partitions=len(assigned))
        log.info("partitions assigned", worker=self.worker_id,
                 partitions=sorted(f"{tp.topic}:{tp.partition}" for tp in assigned))

    async def _set_up_missed(self) -> None:
        """Partitions a rebalance listener could not position (the assignment moved under it)."""
        missed = self.consumer.assignment() - self._set_up - self._gone
        if missed:
            try:
                await self._setup_partitions(missed)
            except IllegalStateError:
                self._set_up -= missed

    async def _setup_partitions(self, partitions: set[TopicPartition]) -> None:
        """Sessions partitions fold from their beginning, actions partitions start at their end.

        Batched (one end-offsets request, one seek each way), and no waiting for positions here:
        this runs inside the rebalance listener, where aiokafka sends no group heartbeats, and
        per-partition requests for a few dozen tenants' partitions outlasted the 8 s session on a
        loaded machine (the worker was expelled from its group).
        """
        self._set_up |= partitions
        sessions = [tp for tp in partitions if parse_topic(tp.topic).stream == "sessions"]
        actions = [tp for tp in partitions if tp not in sessions]
        if sessions:
            ends = await self._end_offsets(sessions)
            if ends:
                await self.consumer.seek_to_beginning(*ends)
                self._folding.update({tp: end for tp, end in ends.items() if end > 0})
        if actions:
            await self.consumer.seek_to_end(*actions)
            self._to_position.update(actions)  # resolved by the main loop, where heartbeats flow

    async def _end_offsets(self, sessions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """End offsets of the sessions partitions whose topics still exist, in bounded time.

        A tenant deleted while the group rebalanced can be in the assignment (the leader's metadata
        was older than the deletion), and aiokafka asks for a deleted partition's offsets for a whole
        request timeout (40 s; the worker was expelled from its group meanwhile): such partitions are
        left out (``_gone``) until the next rebalance takes them away. Partitions whose offsets are
        only slow are left to the main loop (``_set_up_missed``)."""
        existing = await self.consumer.topics()  # a fresh read of the cluster's metadata
        gone = {tp for tp in sessions if tp.topic not in existing}
        if gone:
            log.info("partitions of deleted topics left out", topics=sorted({tp.topic for tp in gone}))
            self._gone |= gone
        alive = [tp for tp in sessions if tp not in gone]
        if not alive:
            return {}
        try:
            return await asyncio.wait_for(self.consumer.end_offsets(alive), SETUP_WAIT_S)
        except (TimeoutError, KafkaError) as exc:  # deleted since, or only slow: asked again
            log.warning("sessions partitions' end offsets not read; the main loop asks again",
                        partitions=len(alive), error_class=type(exc).__name__)
            self._set_up -= set(alive)
            return {}

    async def _position(self, tp: TopicPartition) -> int | None:
        """The partition's position, None if not known within POSITION_WAIT_S (a reset pending, or
        its topic deleted, where aiokafka's position() alone waits a whole request timeout)."""
        try:
            return await asyncio.wait_for(self.consumer.position(tp), POSITION_WAIT_S)
        except (TimeoutError, IllegalStateError):
            return None

    async def _resolve_positions(self) -> None:
        """Actions partitions sought to their end become ready once "end" is a number, so no
        observation goes out before its answer can be read. Waits briefly per partition: aiokafka's
        position() would wait a whole request timeout (40 s) while a reset is pending."""
        for tp in list(self._to_position):
            if tp not in self.consumer.assignment():
                self._to_position.discard(tp)
                continue
            if await self._position(tp) is None:
                continue
            self._to_position.discard(tp)
            self._actions_ready.add(tp)

    async def _revoke(self, revoked: set[TopicPartition]) -> None:
        # Everything of the revoked partitions is forgotten before the first await: the main loop
        # runs while this waits, and it restarted a session whose spec was still here (a zombie
        # that asked for step 0 every 10 s for minutes on a worker that no longer read its actions).
        tasks = {}
        for sid, tp in list(self._home.items()):
            if tp in revoked:
                task = self._runners.pop(sid, None)
                if task:
                    task.cancel()
                    tasks[sid] = task
                self._specs.pop(sid, None)
                self._progress.pop(sid, None)
                self._home.pop(sid, None)
        for tp in revoked:
            self._set_up.discard(tp)
            self._gone.discard(tp)
            self._folding.pop(tp, None)
            self._actions_ready.discard(tp)
            self._to_position.discard(tp)
        if tasks:  # bounded: this runs in the rebalance listener, which must not wait forever
            await asyncio.wait(tasks.values(), timeout=REVOKE_WAIT_S)
            for sid in [sid for sid, task in tasks.items() if not task.done()]:
                log.warning("revoked session still running", session=sid)
        for tp in revoked:
            producer = self._txn.pop(tp, None)
            if producer:
                await producer.stop()
