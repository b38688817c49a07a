"""The inference role: every tenant's observations, grouped into shared backbone forwards, answered
with each tenant's own policy.

Consumer group ``inference`` on the tenants' observations topics. Each
observation becomes a task: its backbone request joins the group batcher
(flush at B requests or after T ms, one forward per compatible group, on the
device gate's inference queue, which goes before training), then the
tenant's head acts on its own feature row. The policy is the version the
session is pinned to (sync RL, evaluation), or the tenant's latest published
version: ``PolicyVersionPublished`` events are followed, and a new version is
used from the next observation on, without pausing anyone (hot swap).

Sampling noise comes from a generator seeded by (session's action_seed,
episode, step), so an action never depends on which tenants shared its
group or in what order observations arrived. Observations are requests, not
state: offsets are committed as they are read, and an env that gets no answer
asks again, so a restarted inference role loses nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict

import numpy as np
import torch
from aiokafka.structs import ConsumerRecord

from backbone.batcher import BatcherConfig, GroupBatcher
from backbone.timeline import JSONL_SUFFIX
from consumers.bus.loop import bind_record, make_consumer
from consumers.bus.protocols import Workload
from consumers.convert import observation_request
from consumers.service import Service
from infra.errors import JoynexusError, SchemaError
from infra.follow import TopicFollower
from infra.logging import get_logger
from infra.topics import tenant_stream_pattern, tenant_topic
from producers.producer import EventProducer
from schemas import events as ev
from schemas.codec import Codec
from schemas.tensors import from_numpy
from tenants.heads import ActorOutput
from tenants.slot import TenantSlot

__all__ = ["InferenceRole", "action_generator"]

log = get_logger("consumers.inference")
GROUP = "inference"
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
        self.codec = Codec()
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
        )
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
        self.answered = 0

    def _on_session(self, event: ev.Event, record: ConsumerRecord) -> None:
        if isinstance(event, ev.EnvSessionRequested):
            self.sessions[event.session_id] = event

    def _on_version(self, event: ev.Event, record: ConsumerRecord) -> None:
        if not isinstance(event, ev.PolicyVersionPublished) or not event.tenant_id:
            return
        if event.version > self.latest.get(event.tenant_id, 0):
            self.latest[event.tenant_id] = event.version
            log.info("policy hot-swapped", tenant=event.tenant_id, version=event.version, job=event.job_id)

    def workload(self) -> Workload:
        groups, gate = self.batcher.records, self.service.gate
        n = max(len(groups), 1)
        return Workload(
            (self.consumer,), done=self.answered, waiting=len(self._tasks),
            details={"policies_loaded": len(self._policies), "groups": len(groups),
                     "mean_group_size": round(sum(g.size for g in groups) / n, 3),
                     "mean_group_tenants": round(sum(len(set(g.tenants)) for g in groups) / n, 3),
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
        another process finds them (``backbone/timeline.py``; this role already reports the gate)."""
        self._next_export = time.monotonic() + TIMELINE_EXPORT_S
        try:
            self.service.gate.timeline.export_jsonl(
                self.settings.timeline_dir / f"{self.instance}{JSONL_SUFFIX}")
        except OSError as exc:  # the report loses a stretch of timeline; the service loses nothing
            log.warning("timeline export failed", error=str(exc)[:200])

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if time.monotonic() >= self._next_export:
                self._export_timeline()
            batches = await self.consumer.getmany(timeout_ms=100)
            for records in batches.values():
                for record in records:
                    task = asyncio.create_task(self._answer(record))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
            if batches:
                await self._commit()

    async def _commit(self) -> None:
        try:
            await self.consumer.commit()
        except Exception as exc:  # observations are re-asked for; a lost commit costs nothing
            log.warning("commit failed", error_class=type(exc).__name__)

    # ------------------------------------------------------------------ one observation
    async def _answer(self, record: ConsumerRecord) -> None:
        with bind_record("inference", record):
            try:
                obs = self.codec.decode(record.value)
                if not isinstance(obs, ev.Observation):
                    raise SchemaError(f"expected an Observation, got {type(obs).__name__}")
                action = await self._act(obs)
            except (JoynexusError, ValueError) as exc:
                log.error("observation not answered", error_class=type(exc).__name__, error=str(exc)[:300])
                return
            except Exception as exc:
                log.exception("inference failed", error_class=type(exc).__name__)
                return
            await self.producer.send(
                tenant_topic(self.settings, obs.tenant_id, "actions"), action, key=obs.session_id
            )
            self.answered += 1

    async def _session(self, obs: ev.Observation) -> ev.EnvSessionRequested:
        session = self.sessions.get(obs.session_id)
        if session is None:  # the request may still be on its way to our follower
            await self._followers[0].caught_up([tenant_topic(self.settings, obs.tenant_id, "sessions")], 10.0)
            session = self.sessions.get(obs.session_id)
        if session is None:
            raise SchemaError(f"observation for unknown session {obs.session_id}")
        return session

    async def _act(self, obs: ev.Observation) -> ev.Action:
        session = await self._session(obs)
        tenant = obs.tenant_id
        version = session.policy_version or self.latest.get(tenant)
        if version is None:
            raise SchemaError(f"tenant {tenant} has no published policy version yet")
        slot = await self._policy(tenant, version)
        feature = await self.batcher.submit(observation_request(obs, session.state_in_proprio))
        generator = action_generator(session.action_seed, _episode_seed(session, obs.episode_id), obs.step)
        with torch.no_grad():
            out = slot.policy.act(feature.detach(), generator, session.deterministic)
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
