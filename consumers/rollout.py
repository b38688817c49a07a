"""The rollout role (RL): episodes in, PPO minibatches out, and the pace of sync RL.

Consumer group ``rollout`` on the tenants' rollouts topics. Records are
collected into episodes (``episodes.py``); evaluation sessions are left to the
evaluator. When an iteration's episodes are in, each episode gets GAE
advantages and returns (``tenants/advantages.py``), advantages are
normalised over the iteration, and the iteration becomes ONE GradientJob in
the tenant's training queue: its rows once (the images by reference above
``tensor_inline_max_bytes``) and ``ppo_epochs`` shuffled passes of minibatches as
row indices, which backbone-train turns into one FeatureBatch each. The last
one asks the optimizer to publish a version (and, on the last iteration, to
complete the job). Sequences are ``iteration * SEQUENCE_STRIDE + index``, so
a re-emission after a restart is recognised and skipped by the optimizer.

sync: iteration k is the session ``<job>-it<k>`` (or ``rl.envs`` sessions ``<job>-it<k>-s<j>``
playing contiguous runs of its episodes at once; the iteration trains when all are in, its
episodes sorted by reset seed, so it is the same batch however many collected it), pinned to
one version. A
reconcile loop requests iteration k+1 once the version trained on iteration k
is published (its ``metrics["iteration"] == k``): collection never overlaps
training, so a run is a deterministic function of the spec.

async: ``envs`` sessions follow the latest version. Every
``episodes_per_iteration`` finished episodes form an iteration; episodes
collected with a version more than ``max_policy_lag`` behind the latest are
dropped, not importance-corrected (PPO's clipped ratio already bounds the
update; dropping keeps the bias explicit and is counted in the metrics).
"""

from __future__ import annotations

import asyncio

import numpy as np
from aiokafka.structs import ConsumerRecord

from consumers.bus.episodes import Episode, RolloutReader
from consumers.bus.loop import make_consumer
from consumers.bus.protocols import Workload
from consumers.master import plan
from consumers.service import Service
from infra.follow import TopicFollower
from infra.logging import get_logger
from infra.topics import tenant_stream_pattern, tenant_topic
from producers.producer import EventProducer
from schemas import events as ev
from schemas.codec import Codec
from schemas.jobspec import JobSpec
from schemas.sessions import iteration_of
from schemas.tensors import from_numpy, to_numpy
from tenants.advantages import gae, normalize_advantages, ppo_minibatches

__all__ = ["SEQUENCE_STRIDE", "RolloutRole", "iteration_job"]

log = get_logger("consumers.rollout")
GROUP = "rollout"
SEQUENCE_STRIDE = 1_000_000


def _proprio(record: ev.RolloutRecord, state_in_proprio: bool) -> np.ndarray:
    obs = record.observation
    parts = [to_numpy(obs.proprio).astype(np.float32)] if obs.proprio is not None else []
    if state_in_proprio and obs.state is not None:
        parts.append(to_numpy(obs.state).astype(np.float32))
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def iteration_job(
    spec: JobSpec,
    iteration: int,
    episodes: list[Episode],
    producer: str,
    dropped: int = 0,
    latest: int | None = None,
) -> ev.GradientJob:
    """One iteration's rows and PPO minibatches: a pure function of the spec and the episodes."""
    rl = spec.rl
    advantages, returns = [], []
    for episode in episodes:
        rewards = np.array([r.reward for r in episode.records])
        values = np.array([r.value or 0.0 for r in episode.records])
        adv, ret = gae(rewards, values, episode.records[-1].terminated, rl.gamma, rl.gae_lambda)
        advantages.append(adv)
        returns.append(ret)
    records = [r for e in episodes for r in e.records]
    adv = normalize_advantages(np.concatenate(advantages))
    ret = np.concatenate(returns).astype(np.float32)
    images = np.stack([to_numpy(r.observation.image) for r in records])
    proprio = np.stack([_proprio(r, spec.env.state_in_proprio) for r in records])
    actions = np.stack(
        [to_numpy(r.action).astype(np.float32).reshape(spec.modules.chunk_len, -1) for r in records]
    )
    old_log_probs = np.array([r.log_prob or 0.0 for r in records], np.float32)
    metrics = {
        "iteration": float(iteration),
        "episodes": float(len(episodes)),
        "mean_return": float(np.mean([e.total_reward for e in episodes])),
        "success_rate": float(np.mean([e.success for e in episodes])),
        "mean_length": float(np.mean([len(e.records) for e in episodes])),
        "dropped_stale_episodes": float(dropped),
        # async: the newest version when the iteration was formed (staleness is measured against it)
        "latest_version": float(latest if latest is not None else min(r.policy_version for r in records)),
        "collected_version": float(min(r.policy_version for r in records)),
    }
    batches = ppo_minibatches(len(records), rl.minibatch_size, rl.ppo_epochs, spec.seed, iteration)
    return ev.GradientJob(
        envelope=ev.Envelope(tenant_id=spec.tenant, producer_id=producer, correlation_id=spec.job_id),
        job_id=spec.job_id,
        batch_id=f"{spec.job_id}/it{iteration}",
        sequence=iteration * SEQUENCE_STRIDE,
        policy_version=records[0].policy_version,
        instructions=tuple(r.observation.instruction for r in records),
        images=from_numpy(images),
        proprio=from_numpy(proprio),
        targets={
            "actions": from_numpy(actions),
            "old_log_probs": from_numpy(old_log_probs),
            "advantages": from_numpy(adv),
            "returns": from_numpy(ret),
        },
        publish=True,
        final=iteration == rl.iterations - 1,
        needs_sequence=spec.modules.suffix,
        metrics=metrics,
        minibatches=tuple(tuple(int(i) for i in idx) for idx in batches),
    )


class RolloutRole:
    def __init__(self, service: Service, instance: str = "0"):
        self.service = service
        settings = self.settings = service.settings
        self.producer_id = f"rollout/{instance}"
        self.codec = Codec.for_settings(service.settings)
        self.reader = RolloutReader(
            make_consumer(settings, GROUP, pattern=tenant_stream_pattern(settings, "rollouts")), self.codec
        )
        self.collector = self.reader.collector
        self.producer = EventProducer(settings, self.codec, client_id="rollout")
        self.published: dict[tuple[str, str], ev.PolicyVersionPublished] = {}  # (tenant, job) -> latest
        self.latest: dict[str, int] = {}
        self.versions = TopicFollower(
            settings,
            tenant_stream_pattern(settings, "policy-versions"),
            self._on_version,
            name="rollout-versions",
        )
        self._async_iteration: dict[tuple[str, str], int] = {}
        self._async_buffer: dict[tuple[str, str], list[Episode]] = {}
        self._emitted: set[str] = set()  # sync session ids already turned into gradient jobs

    def _on_version(self, event: ev.Event, record: ConsumerRecord) -> None:
        if isinstance(event, ev.PolicyVersionPublished) and event.tenant_id:
            self.published[(event.tenant_id, event.job_id)] = event
            self.latest[event.tenant_id] = max(self.latest.get(event.tenant_id, 0), event.version)

    def workload(self) -> Workload:
        return Workload((self.reader.consumer,), done=self.reader.read,
                        details={"sessions": len(self.collector.sessions())})

    async def start(self) -> None:
        await self.versions.start()
        await self.producer.start()
        await self.reader.consumer.start()

    async def stop(self) -> None:
        await self.reader.consumer.stop()
        await self.producer.stop()
        await self.versions.stop()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.reader.poll()
            await self._advance()
            await self._pace()
            await self.reader.commit()

    async def _advance(self) -> None:
        """Turn finished iterations into gradient jobs."""
        for session_id in self.collector.sessions():
            episodes = self.collector.done_episodes(session_id)
            if not episodes:
                continue
            tenant = episodes[0].records[0].tenant_id
            state = self.service.book.job_of_session(tenant, session_id)
            if state is None:
                continue  # the job book has not seen the session yet
            if state.kind == "EVAL":
                self.collector.release(session_id)  # the evaluator's business
                continue
            if state.kind != "RL":
                continue  # the book has the session but not yet the job's kind
            spec = state.spec
            if self.service.book.stopped(tenant, spec.job_id):
                self.collector.release(session_id)
                continue
            if spec.rl.mode == "sync":
                await self._advance_sync(spec, session_id)
            else:
                await self._advance_async(spec, session_id, episodes)

    async def _advance_sync(self, spec: JobSpec, session_id: str) -> None:
        """An iteration trains once every one of its sessions has played its run of episodes: the
        episodes, sorted by reset seed, are the iteration's in episode order, however many sessions
        collected them (the master split them with ``plan.iteration_parts``)."""
        found = iteration_of(session_id, plan.session_prefix(spec.tenant, spec.job_id))
        if found is None or session_id in self._emitted:
            return
        iteration = found[0]
        parts = plan.iteration_parts(spec, iteration)
        episodes: list[Episode] = []
        for part_id, _, count in parts:
            done = self.collector.done_episodes(part_id)
            if len(done) < count:
                return  # a part still collects (or its records are not all read yet)
            episodes += done[:count]
        episodes.sort(key=lambda e: e.order)
        await self._emit(spec, iteration, episodes)
        for part_id, _, _ in parts:
            self._emitted.add(part_id)
            self.collector.release(part_id)

    async def _advance_async(self, spec: JobSpec, session_id: str, episodes: list[Episode]) -> None:
        key = (spec.tenant, spec.job_id)
        self.collector.take(session_id, episodes)
        lag = spec.limits.max_staleness if spec.limits.max_staleness is not None else spec.rl.max_policy_lag
        latest = self.latest.get(spec.tenant, 0)
        fresh = [e for e in episodes if latest - min(r.policy_version for r in e.records) <= lag]
        buffer = self._async_buffer.setdefault(key, [])
        buffer.extend(fresh)
        dropped = len(episodes) - len(fresh)
        if dropped:
            log.info(
                "stale episodes dropped",
                tenant=spec.tenant,
                job=spec.job_id,
                dropped=dropped,
                latest_version=latest,
                max_lag=lag,
            )
        if key not in self._async_iteration:
            last = self.published.get(key)
            done = last.metrics.get("iteration") if last else None
            self._async_iteration[key] = 0 if done is None else int(done) + 1
        while (
            len(buffer) >= spec.rl.episodes_per_iteration and self._async_iteration[key] < spec.rl.iterations
        ):
            take, buffer[:] = (
                buffer[: spec.rl.episodes_per_iteration],
                buffer[spec.rl.episodes_per_iteration :],
            )
            await self._emit(spec, self._async_iteration[key], take, dropped, latest)
            self._async_iteration[key] += 1
        if self._async_iteration[key] >= spec.rl.iterations:
            await self._close_async(spec)

    async def _close_async(self, spec: JobSpec) -> None:
        state = self.service.book.get(spec.tenant, spec.job_id)
        for sid in state.open_sessions if state else []:
            await self.producer.send(
                tenant_topic(self.settings, spec.tenant, "sessions"),
                ev.EnvSessionClosed(
                    envelope=ev.Envelope(
                        tenant_id=spec.tenant, producer_id=self.producer_id, correlation_id=spec.job_id
                    ),
                    session_id=sid,
                    job_id=spec.job_id,
                    reason="iterations done",
                ),
                key=sid,
            )
            self.collector.release(sid)

    async def _emit(
        self,
        spec: JobSpec,
        iteration: int,
        episodes: list[Episode],
        dropped: int = 0,
        latest: int | None = None,
    ) -> None:
        def build() -> ev.GradientJob:  # off the loop: the images may be written to the tensor store
            job = iteration_job(spec, iteration, episodes, self.producer_id, dropped, latest)
            return job.model_copy(update={"images": self.service.tensors.offload(job.images)})

        job = await asyncio.to_thread(build)
        topic = tenant_topic(self.settings, spec.tenant, "gradient-jobs")
        await self.producer.send(topic, job, key=spec.tenant)
        metrics = job.metrics
        await self.producer.send(
            tenant_topic(self.settings, spec.tenant, "status"),
            ev.JobProgress(
                envelope=ev.Envelope(
                    tenant_id=spec.tenant, producer_id=self.producer_id, correlation_id=spec.job_id
                ),
                job_id=spec.job_id,
                step=iteration + 1,
                total_steps=spec.rl.iterations,
                metrics=metrics,
            ),
            key=spec.tenant,
        )
        log.info(
            "iteration collected",
            tenant=spec.tenant,
            job=spec.job_id,
            iteration=iteration,
            minibatches=len(job.minibatches),
            mean_return=round(metrics["mean_return"], 3),
            success_rate=metrics["success_rate"],
        )

    async def _pace(self) -> None:
        """sync RL: request iteration k+1 once the version trained on iteration k is out."""
        for (tenant, job_id), state in list(self.service.book.jobs.items()):
            if state.kind != "RL" or state.phase != "accepted" or self.service.book.stopped(tenant, job_id):
                continue
            spec = state.spec
            if spec.rl.mode != "sync":
                continue
            prefix = plan.session_prefix(tenant, job_id)
            found = (iteration_of(sid, prefix) for sid in state.sessions)
            requested = len({f[0] for f in found if f is not None})  # iterations, whatever their parts
            last = self.published.get((tenant, job_id))
            trained = last.metrics.get("iteration") if last else None
            if trained is None or int(trained) != requested - 1 or requested >= spec.rl.iterations:
                continue
            sessions = plan.iteration_sessions(spec, requested, last.version, self.producer_id)
            for session in sessions:
                await self.producer.enqueue(
                    tenant_topic(self.settings, tenant, "sessions"), session, key=session.session_id
                )
            await self.producer.flush()
            for session in sessions:
                state.sessions.setdefault(session.session_id, "REQUESTED")  # until the book reads it back
            log.info(
                "next iteration requested",
                tenant=tenant,
                job=job_id,
                iteration=requested,
                policy_version=last.version,
                sessions=len(sessions),
            )
