"""The inference role: every tenant's observations, grouped into shared backbone forwards, answered
with each tenant's own policy.

Consumer group ``inference`` on the tenants' observations topics. Each
observation becomes a task: its backbone request joins the group batcher
(flush at B requests or after T ms, one forward per compatible group, on the
device gate's inference queue, which goes before training), then the
tenant's head acts on its own feature row: the rows of one policy that a group brings back act
together, at one fixed shape (``tenants.acts``), so a row's action is the same whoever shared
its group. A group also flushes as soon as every
session answered in the last second has asked again (``backbone.batcher``), so
T can be long enough for sessions answered together to come back together.
The policy is the version the session is pinned to (sync RL, evaluation), or
the tenant's latest published version: ``PolicyVersionPublished`` events are
followed, and a new version is used from the next observation on, without
pausing anyone (hot swap).
The features it computes go into the process's feature cache
(``feature_cache_from_inference``), where backbone-train finds them when the
rollout's gradient jobs bring the same observations back.

Sampling noise comes from a generator seeded by (session's action_seed,
episode, step), so an action never depends on which tenants shared its
group or in what order observations arrived. Observations are requests, not
state: offsets are committed as they are read (at most a second behind), and an
env that gets no answer asks again, so a restarted inference role loses nothing.

With ``settings.step_trace`` on, each answered step's stage times (bus in, lookup, device, head,
ack) are appended beside the forward timeline (``consumers/step_trace.py``).

A policy that cannot run is not left to be asked forever: an observation that fails twice (the
second time after the read models caught up) fails its job with ``JobFailed`` (stage
``inference``, the error as reason) and closes the job's open sessions, within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from collections import OrderedDict
from datetime import UTC, datetime

import numpy as np
import torch
from aiokafka.structs import ConsumerRecord, TopicPartition

from backbone.batcher import BatcherConfig, GroupBatcher, GroupRecord
from backbone.timeline import JSONL_SUFFIX
from consumers.bus.loop import bind_record, commit_within, make_consumer
from consumers.bus.protocols import Workload
from consumers.convert import observation_request
from consumers.service import Service
from consumers.step_trace import STEPS_SUFFIX, StepTrace
from infra.errors import JoynexusError, SchemaError
from infra.follow import TopicFollower
from infra.logging import get_logger
from infra.topics import check_tenant, shared_topic, tenant_stream_pattern, tenant_topic
from producers.producer import EventProducer
from schemas import events as ev
from schemas.codec import Codec
from schemas.tensors import from_numpy
from tenants.acts import TickActs
from tenants.heads import ActorOutput
from tenants.slot import TenantSlot

__all__ = ["InferenceRole", "action_generator"]

log = get_logger("consumers.inference")
ANSWERS_KEPT = 10_000  # recent answers kept for repeated asks (an env re-asks within seconds)
GROUP = "inference"
COMMIT_EVERY_S = 1.0  # observations are requests: a restart re-reads at most this long of them
TIMELINE_EXPORT_S = 2.0  # how often the device timeline is appended to its file (run reports read it)


def action_generator(action_seed: int, episode_seed: int | str, step: int) -> torch.Generator:
    digest = hashlib.sha256(f"{action_seed}/{episode_seed}/{step}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def _episode_seed(session: ev.EnvSessionRequested, episode_id: str) -> int | str:
    """Episode k of a session resets with seed + k: a function of the spec's seed only, so the same
    spec run by another tenant, or under another job id, draws the same noise."""
    _, _, k = episode_id.rpartition("/")
    return session.seed + int(k) if k.isdigit() else episode_id


class InferenceRole:
    def __init__(self, service: Service, instance: str = "0"):
        self.service = service
        settings = self.settings = service.settings
        self.instance = instance
        self._next_export = 0.0
        self.trace = StepTrace() if settings.step_trace else None
        self.codec = Codec.for_settings(service.settings)
        self.consumer = make_consumer(
            settings, GROUP, pattern=tenant_stream_pattern(settings, "observations")
        )
        self.producer = EventProducer(settings, self.codec, client_id="inference")
        self.batcher = GroupBatcher(
            service.backbone,
            BatcherConfig(
                target_batch=settings.inference_target_batch,
                max_wait_ms=settings.inference_max_wait_ms,
                max_batch=max(settings.inference_target_batch, 32),
            ),
            gate=service.gate,
            queue="inference",
            on_group=self._meter_group,
            # what inference computes when acting is what RL training forwards next: leave it there
            cache=service.features if settings.feature_cache_from_inference else None,
        )
        self.acts = TickActs()
        self.sessions: dict[str, ev.EnvSessionRequested] = {}
        self.latest: dict[str, int] = {}  # tenant -> latest published version
        self._followers = [
            TopicFollower(
                settings,
                tenant_stream_pattern(settings, "sessions"),
                self._on_session,
                name="inference-sessions",
            ),
            TopicFollower(
                settings,
                tenant_stream_pattern(settings, "policy-versions"),
                self._on_version,
                name="inference-versions",
            ),
        ]
        self._policies: OrderedDict[tuple[str, int], TenantSlot] = OrderedDict()
        self._loading: dict[tuple[str, int], asyncio.Task] = {}
        self._tasks: set[asyncio.Task] = set()
        self._unsaved: dict[TopicPartition, int] = {}  # positions read, not committed yet
        self._next_commit = 0.0
        self.answered = 0
        self.usage: dict[str, float] = {}  # tenant -> device-seconds not yet published
        self.run_id = uuid.uuid4().hex[:12]  # usage ids stay unique across restarts
        self.usage_seq = 0
        self.failed_sessions: set[tuple[str, str]] = set()  # (tenant, session) of failed jobs
        self.failed_jobs: set[tuple[str, str]] = set()  # (tenant, job) this instance failed
        # An env that waited 10 s asks again for the same step. Under overload the first answer is
        # only late: a repeat of a step in flight is dropped, and a repeat of a step answered
        # recently gets that same action again (an action is a pure function of the step), so
        # repeats never cost a forward and never feed the overload that caused them.
        self._in_flight: set[tuple[str, str, str, int]] = set()
        self._answers: OrderedDict[tuple[str, str, str, int], ev.Action] = OrderedDict()
        self.repeats = 0

    def _on_session(self, event: ev.Event, record: ConsumerRecord) -> None:
        if isinstance(event, ev.EnvSessionRequested):
            self.sessions[event.session_id] = event
        elif _finished(event, self.sessions):  # its peers' groups stop waiting for it
            self.batcher.forget(_source(event.tenant_id, event.session_id))

    def _on_version(self, event: ev.Event, record: ConsumerRecord) -> None:
        if not isinstance(event, ev.PolicyVersionPublished) or not event.tenant_id:
            return
        if event.version > self.latest.get(event.tenant_id, 0):
            self.latest[event.tenant_id] = event.version
            log.info("policy hot-swapped", tenant=event.tenant_id, version=event.version, job=event.job_id)

    def workload(self) -> Workload:
        batcher, gate = self.batcher, self.service.gate
        n = max(batcher.groups, 1)
        return Workload(
            (self.consumer,), done=self.answered, waiting=len(self._tasks),
            details={"policies_loaded": len(self._policies), "groups": batcher.groups,
                     "repeats": self.repeats,
                     "mean_group_size": round(batcher.rows / n, 3),
                     "mean_group_tenants": round(batcher.group_tenants / n, 3),
                     "mean_group_wait_ms": round(1000 * batcher.waited_s / n, 2),
                     **{f"groups_{reason}": count for reason, count in sorted(batcher.by_reason.items())},
                     # the device gate of this process: inference and training share it
                     "busy_inference_s": round(gate.busy_s["inference"], 3),
                     "busy_train_s": round(gate.busy_s["train"], 3),
                     "gate_wall_s": round(time.monotonic() - gate.started, 3)},
        )

    async def start(self) -> None:
        for follower in self._followers:
            await follower.start()
        await self.producer.start()
        await self.batcher.start()
        await self.consumer.start()

    async def stop(self) -> None:
        self._export_timeline()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.consumer.stop()
        await self.batcher.stop()
        await self.producer.stop()
        for follower in self._followers:
            await follower.stop()

    def _export_timeline(self) -> None:
        """The device gate's new forwards into this instance's timeline file, where a run report in
        another process finds them (``backbone/timeline.py``; this role already reports the gate),
        and the step trace beside it when it is on."""
        self._next_export = time.monotonic() + TIMELINE_EXPORT_S
        directory = self.settings.timeline_dir
        try:
            self.service.gate.timeline.export_jsonl(directory / f"{self.instance}{JSONL_SUFFIX}")
            if self.trace is not None:
                self.trace.export(directory / f"{self.instance}{STEPS_SUFFIX}")
        except OSError as exc:  # the report loses a stretch of timeline; the service loses nothing
            log.warning("timeline export failed", error=str(exc)[:200])

    async def run(self, stop: asyncio.Event) -> None:
        metering = asyncio.create_task(self._usage_loop(stop), name="inference-usage")
        try:
            while not stop.is_set():
                if time.monotonic() >= self._next_export:
                    self._export_timeline()
                batches = await self.consumer.getmany(timeout_ms=100)
                for records in batches.values():
                    for record in records:
                        task = asyncio.create_task(self._answer(record))
                        self._tasks.add(task)
                        task.add_done_callback(self._tasks.discard)
                self._unsaved.update({tp: records[-1].offset + 1 for tp, records in batches.items()})
                if self._unsaved and time.monotonic() >= self._next_commit:
                    await self._commit()
        finally:
            if self._unsaved:
                await self._commit()
            if not stop.is_set():  # stopped by an error: an unpublished sum is lost (at most once)
                metering.cancel()
            await asyncio.gather(metering, return_exceptions=True)

    async def _commit(self) -> None:
        """The positions read since the last commit, at most every ``COMMIT_EVERY_S``: a commit is an
        append to the broker's offsets log, and a bare ``commit()`` after every poll wrote every
        assigned partition (three per tenant). A restart re-reads at most that long of observations;
        their actions come out the same (sampling is seeded per step) and an env drops answers
        to steps it is past."""
        owned = self.consumer.assignment()  # a partition moved away by a rebalance is its new owner's
        offsets = {tp: offset for tp, offset in self._unsaved.items() if tp in owned}
        self._unsaved, self._next_commit = {}, time.monotonic() + COMMIT_EVERY_S
        if not offsets:
            return
        try:
            await commit_within(self.consumer, offsets)
        except Exception as exc:  # observations are re-asked for; a lost commit costs nothing
            log.warning("commit failed", error_class=type(exc).__name__)

    # ------------------------------------------------------------------ one observation
    async def _answer(self, record: ConsumerRecord) -> None:
        read = time.time()
        with bind_record("inference", record):
            try:
                obs = self.codec.decode(record.value)
                if not isinstance(obs, ev.Observation):
                    raise SchemaError(f"expected an Observation, got {type(obs).__name__}")
                check_tenant(record.topic, obs.tenant_id)  # the topic decides whose policy acts
            except (JoynexusError, ValueError) as exc:
                log.error("observation not answered", error_class=type(exc).__name__, error=str(exc)[:300])
                return
            if (obs.tenant_id, obs.session_id) in self.failed_sessions:
                return  # its job is failed: the env's repeats get no answer and cost no forward
            step = (obs.tenant_id, obs.session_id, obs.episode_id, obs.step)
            if step in self._in_flight or step in self._answers:
                self.repeats += 1
                if step in self._answers:
                    await self.producer.send(tenant_topic(self.settings, obs.tenant_id, "actions"),
                                             self._answers[step], key=obs.session_id)
                return
            self._in_flight.add(step)
            marks = [obs.envelope.occurred_at.timestamp(), read] if self.trace is not None else None
            try:
                action = await self._answer_step(obs, marks)
            finally:
                self._in_flight.discard(step)
            if action is None:
                return
            self._answers[step] = action
            while len(self._answers) > ANSWERS_KEPT:
                self._answers.popitem(last=False)
            await self.producer.send(
                tenant_topic(self.settings, obs.tenant_id, "actions"), action, key=obs.session_id
            )
            self.answered += 1
            if marks is not None:
                marks.append(time.time())
                self.trace.add(obs.tenant_id, obs.session_id, obs.episode_id, obs.step, marks)

    async def _answer_step(self, obs: ev.Observation, marks: list[float] | None) -> ev.Action | None:
        """The action for ``obs``, with one retry; None when the policy failed (its job is failed).
        ``marks``: the step trace's times so far, extended by ``_act`` (None: not traced)."""
        try:
            action = await self._act(obs, marks)
        except Exception as first:  # noqa: BLE001 - one retry, after the read models caught up
            log.warning("inference failed; retrying once", error_class=type(first).__name__,
                        error=str(first)[:300])
            try:
                await self._catch_up(obs.tenant_id)
                action = await self._act(obs, marks)
            except Exception as exc:
                log.error("inference failed twice; failing the job", error_class=type(exc).__name__,
                          error=str(exc)[:300])
                await self._fail_session(obs, exc)
                return None
        return action

    # ------------------------------------------------------------------ usage (metering)
    # Each group's forward time is split between tenants by their share of its rows and published
    # every usage_flush_s as UsageRecorded (at most once: observations are commit-as-read, and an
    # unpublished sum dies with the process).
    def _meter_group(self, record: GroupRecord) -> None:
        for tenant in record.tenants:
            self.usage[tenant] = self.usage.get(tenant, 0.0) + record.busy_s / record.size

    async def _usage_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.usage_flush_s)
            usage, self.usage = self.usage, {}
            now = datetime.now(UTC)
            for tenant, seconds in sorted(usage.items()):
                self.usage_seq += 1
                try:
                    await self.producer.send(shared_topic(self.settings, "usage"), ev.UsageRecorded(
                        envelope=ev.Envelope(tenant_id=tenant, producer_id=f"inference/{self.instance}"),
                        usage_id=f"inference/{self.instance}/{self.run_id}/{self.usage_seq}",
                        role="inference", resource="backbone.forward",
                        device=str(self.service.info.device), seconds=seconds,
                        window_start=now, window_end=now, group_size=1), key=tenant)
                except Exception as exc:  # metering must never stop answering
                    log.warning("usage not published", tenant=tenant, error_class=type(exc).__name__)

    # ------------------------------------------------------------------ a policy that cannot run
    # The env asks again every 10 s without an answer; a policy that fails for good would keep
    # its job "accepted" forever. So: one retry (after the session and version read models caught
    # up, which rules out a race with a just-published version), then the job fails with the
    # reason, and its open sessions are closed so the env stops asking.
    async def _catch_up(self, tenant: str) -> None:
        topics = [tenant_topic(self.settings, tenant, s) for s in ("sessions", "policy-versions")]
        for follower, topic in zip(self._followers, topics, strict=True):
            await follower.caught_up([topic], 10.0)

    async def _fail_session(self, obs: ev.Observation, exc: BaseException) -> None:
        tenant = obs.tenant_id
        session = self.sessions.get(obs.session_id)
        if session is None:  # no job to fail (yet): the env asks again
            return
        job_id = session.job_id
        self.failed_sessions.add((tenant, obs.session_id))
        if (tenant, job_id) in self.failed_jobs:
            return
        self.failed_jobs.add((tenant, job_id))
        version = session.policy_version or self.latest.get(tenant)
        state = self.service.book.get(tenant, job_id)
        open_sessions = sorted(set(state.open_sessions if state else ()) | {obs.session_id})
        self.failed_sessions.update((tenant, sid) for sid in open_sessions)
        envelope = ev.Envelope(tenant_id=tenant, producer_id=f"inference/{self.instance}",
                               correlation_id=job_id)
        try:
            await self.producer.send(tenant_topic(self.settings, tenant, "status"), ev.JobFailed(
                envelope=envelope, job_id=job_id, error_class=type(exc).__name__, stage="inference",
                reason=f"policy version {version} cannot run (session {obs.session_id}): {exc}"[:2000]),
                key=tenant)
            for sid in open_sessions:
                await self.producer.send(tenant_topic(self.settings, tenant, "sessions"), ev.EnvSessionClosed(
                    envelope=envelope, session_id=sid, job_id=job_id, reason="failed"), key=sid)
        except Exception as publish_error:  # the next observation of the job tries again
            self.failed_jobs.discard((tenant, job_id))
            self.failed_sessions.difference_update((tenant, sid) for sid in open_sessions)
            log.error("could not publish the job's failure", job=job_id,
                      error_class=type(publish_error).__name__)

    async def _session(self, obs: ev.Observation) -> ev.EnvSessionRequested:
        session = self.sessions.get(obs.session_id)
        if session is None:  # the request may still be on its way to our follower
            await self._followers[0].caught_up([tenant_topic(self.settings, obs.tenant_id, "sessions")], 10.0)
            session = self.sessions.get(obs.session_id)
        if session is None:
            raise SchemaError(f"observation for unknown session {obs.session_id}")
        return session

    async def _act(self, obs: ev.Observation, marks: list[float] | None = None) -> ev.Action:
        if marks is not None:
            del marks[2:]  # a retry marks afresh
        session = await self._session(obs)
        tenant = obs.tenant_id
        version = session.policy_version or self.latest.get(tenant)
        if version is None:
            raise SchemaError(f"tenant {tenant} has no published policy version yet")
        slot = await self._policy(tenant, version)
        _mark(marks)
        feature = await self.batcher.submit(observation_request(obs, session.state_in_proprio),
                                            source=_source(tenant, obs.session_id))
        _mark(marks)
        generator = action_generator(session.action_seed, _episode_seed(session, obs.episode_id), obs.step)
        out = await self.acts.act(slot.policy, feature.detach(), generator, session.deterministic)
        _mark(marks)
        if isinstance(out, ActorOutput):
            action, log_prob, value = out.action[0], float(out.log_prob[0]), float(out.value[0])
        else:
            action, log_prob, value = out[0], None, None
        return ev.Action(
            envelope=ev.Envelope(
                tenant_id=tenant, producer_id=f"inference/{self.instance}", correlation_id=session.job_id
            ),
            session_id=obs.session_id,
            episode_id=obs.episode_id,
            step=obs.step,
            action=from_numpy(action.detach().cpu().numpy().astype(np.float32)),
            policy_version=version,
            log_prob=log_prob,
            value=value,
        )

    async def _policy(self, tenant: str, version: int) -> TenantSlot:
        """A read-only slot holding (tenant, version), loaded once and kept in an LRU."""
        key = (tenant, version)
        if key in self._policies:
            self._policies.move_to_end(key)
            return self._policies[key]
        if key not in self._loading:  # many observations may want it at once: load it once
            self._loading[key] = asyncio.create_task(asyncio.to_thread(self._load, tenant, version))
        try:
            slot = await asyncio.shield(self._loading[key])
        finally:
            if self._loading.get(key) is not None and self._loading[key].done():
                self._loading.pop(key, None)
        self._policies[key] = slot
        while len(self._policies) > self.settings.policy_cache:
            self._policies.popitem(last=False)
        return slot

    def _load(self, tenant: str, version: int) -> TenantSlot:
        slot = self.service.store.restore(tenant, version).mount(self.service.backbone.device)
        slot.policy.eval()
        log.info("policy loaded", tenant=tenant, version=version)
        return slot


def _mark(marks: list[float] | None) -> None:
    """The step trace's next time (``consumers/step_trace.py``), when this step is traced."""
    if marks is not None:
        marks.append(time.time())


def _source(tenant: str, session_id: str) -> str:
    """The batcher's name for a session (its completeness rule waits for sources)."""
    return f"{tenant}/{session_id}"


def _finished(event: ev.Event, sessions: dict[str, ev.EnvSessionRequested]) -> bool:
    """Whether ``event`` says its session asks nothing more: closed, failed, or its last episode
    committed (the CLOSED progress follows that one; acting on the first saves the wait)."""
    if isinstance(event, ev.EnvSessionClosed):
        return True
    if not isinstance(event, ev.EnvSessionProgress):
        return False
    if event.status in (ev.SessionStatus.CLOSED, ev.SessionStatus.FAILED):
        return True
    spec = sessions.get(event.session_id)
    return bool(spec and spec.episodes and event.episodes_completed >= spec.episodes)
