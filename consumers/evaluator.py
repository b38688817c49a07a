"""The evaluator role: scores a pinned policy version on seeded episodes; parameters never change.

An evaluation job is compiled by the master into one env session pinned to
(tenant, version) with deterministic actions, and episode seeds no training
run uses. The env and inference roles run it like any session (same path,
same batching); this role, consumer group ``evaluator`` on the rollouts
topics, collects the session's episodes and, when all are in, completes the
job with success rate, mean return and mean episode length. It never loads
a slot for training and never writes to the policy store.
"""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np

from backbone.grouped import forward_grouped_on
from consumers.bus.episodes import Episode, RolloutReader
from consumers.bus.loop import make_consumer
from consumers.bus.protocols import Workload
from consumers.master.plan import dataset_path
from consumers.service import Service
from infra.errors import JoynexusError
from infra.logging import get_logger
from infra.topics import tenant_stream_pattern, tenant_topic
from producers.dataset.format import Dataset
from producers.producer import EventProducer
from schemas import events as ev
from schemas.codec import Codec
from schemas.jobspec import JobSpec
from schemas.sessions import is_eval_rollout_key

__all__ = ["EvaluatorRole", "episode_metrics"]

log = get_logger("consumers.evaluator")
GROUP = "evaluator"


def episode_metrics(episodes: list[Episode]) -> dict[str, float]:
    return {
        "episodes": float(len(episodes)),
        "success_rate": float(np.mean([e.success for e in episodes])),
        "mean_return": float(np.mean([e.total_reward for e in episodes])),
        "mean_length": float(np.mean([len(e.records) for e in episodes])),
    }


class EvaluatorRole:
    def __init__(self, service: Service, instance: str = "0"):
        self.service = service
        settings = self.settings = service.settings
        self.producer_id = f"evaluator/{instance}"
        self.codec = Codec.for_settings(service.settings)
        # every tenant's rollouts go by; only evaluation sessions' are decoded (the training ones,
        # nearly all of them: their Avro decoding was 7% of its samples in a profiled benchmark run)
        self.reader = RolloutReader(
            make_consumer(settings, GROUP, pattern=tenant_stream_pattern(settings, "rollouts")), self.codec,
            wants=is_eval_rollout_key,
        )
        self.collector = self.reader.collector
        self.producer = EventProducer(settings, self.codec, client_id="evaluator")
        self.completed = 0
        self._scoring: dict[tuple[str, str], asyncio.Task] = {}

    def workload(self) -> Workload:
        return Workload((self.reader.consumer,), done=self.reader.read,
                        details={"sessions": len(self.collector.sessions())})

    async def start(self) -> None:
        await self.producer.start()
        await self.reader.consumer.start()

    async def stop(self) -> None:
        await self.reader.consumer.stop()
        await self.producer.stop()

    async def run(self, stop: asyncio.Event) -> None:
        settle = self.settings.read_model_settle_ms / 1000
        while not stop.is_set():
            read = self.reader.read
            await self.reader.poll()
            await self._advance()
            self._score_datasets()
            await self.reader.commit()
            if settle and self.reader.read > read:
                # Every tenant's training rollouts go by, one transaction an episode: reading them
                # in bulk costs one fetch cycle per settle instead of one per episode; an
                # evaluation's result comes at most two settles later.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), settle)

    def _score_datasets(self) -> None:
        """Held-out dataset evaluations: no sessions, the evaluator scores them itself."""
        for key, state in list(self.service.book.jobs.items()):
            if state.kind != "EVAL" or state.phase != "accepted" or key in self._scoring:
                continue
            spec = state.spec
            if spec.dataset is not None:
                self._scoring[key] = asyncio.create_task(
                    self._score(state, spec), name=f"score-{state.job_id}"
                )

    async def _score(self, state, spec: JobSpec) -> None:
        version = int(state.resources["policy_version"])
        envelope = ev.Envelope(
            tenant_id=state.tenant, producer_id=self.producer_id, correlation_id=state.job_id
        )
        topic = tenant_topic(self.settings, state.tenant, "status")
        try:
            metrics = await self._action_error(state.tenant, version, spec)
        except (JoynexusError, OSError, ValueError) as exc:
            await self.producer.send(
                topic,
                ev.JobFailed(
                    envelope=envelope,
                    job_id=state.job_id,
                    error_class=type(exc).__name__,
                    reason=str(exc)[:2000],
                    stage="evaluator",
                ),
                key=state.tenant,
            )
            return
        metrics["policy_version"] = float(version)
        await self.producer.send(
            topic,
            ev.JobCompleted(
                envelope=envelope, job_id=state.job_id, final_policy_version=version, metrics=metrics
            ),
            key=state.tenant,
        )
        self.completed += 1
        log.info(
            "dataset evaluation complete",
            tenant=state.tenant,
            job=state.job_id,
            version=version,
            **{k: round(v, 4) for k, v in metrics.items()},
        )

    async def _action_error(self, tenant: str, version: int, spec: JobSpec) -> dict[str, float]:
        """Mean absolute error between the policy's deterministic chunks and the dataset's, on the
        first ``eval.episodes`` episodes' samples (read-only: nothing is saved). The backbone
        forwards take the device gate's training queue, like any throughput work."""
        from tenants.served import ServedPolicy

        backbone = self.service.backbone
        dataset = Dataset(dataset_path(spec, self.settings))  # the master checked it is allowed
        restored = await asyncio.to_thread(self.service.store.restore, tenant, version)
        slot = restored.mount(backbone.device)
        policy = ServedPolicy(backbone, slot)
        chunk = slot.config.head.chunk_len
        samples = int(dataset.offsets[min(spec.eval.episodes, dataset.num_episodes)])
        errors, weights = [], []
        for start in range(0, samples, 32):
            batch = dataset.minibatch(np.arange(start, min(start + 32, samples)), chunk)
            prepared = await asyncio.to_thread(policy.prepare_batch, batch.images, batch.instructions,
                                               batch.head_proprio(spec.dataset.state_in_proprio))
            features, _ = await forward_grouped_on(self.service.gate, "train", backbone, prepared)
            predicted = policy.act_features(features)
            mask = batch.action_mask[..., None].astype(np.float64)
            errors.append(float((np.abs(predicted - batch.actions) * mask).sum()))
            weights.append(float(mask.sum() * batch.actions.shape[-1]))
        return {"action_l1": sum(errors) / max(sum(weights), 1.0), "samples": float(samples)}

    async def _advance(self) -> None:
        for session_id in self.collector.sessions():
            episodes = self.collector.done_episodes(session_id)
            if not episodes:
                continue
            tenant = episodes[0].records[0].tenant_id
            state = self.service.book.job_of_session(tenant, session_id)
            if state is None:
                continue  # not in the book yet
            if state.kind != "EVAL" or state.terminal or state.cancel_requested:
                self.collector.release(session_id)
                continue
            spec = state.spec
            if len(episodes) < spec.eval.episodes:
                continue
            metrics = episode_metrics(episodes[: spec.eval.episodes])
            version = int(state.resources["policy_version"])
            metrics["policy_version"] = float(version)
            envelope = ev.Envelope(
                tenant_id=tenant, producer_id=self.producer_id, correlation_id=state.job_id
            )
            await self.producer.send(
                tenant_topic(self.settings, tenant, "status"),
                ev.JobCompleted(
                    envelope=envelope, job_id=state.job_id, final_policy_version=version, metrics=metrics
                ),
                key=tenant,
            )
            self.collector.release(session_id)
            self.completed += 1
            log.info(
                "evaluation complete",
                tenant=tenant,
                job=state.job_id,
                version=version,
                **{k: round(v, 4) for k, v in metrics.items()},
            )
