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
import re

import numpy as np

from consumers.episodes import Episode, EpisodeCollector
from consumers.loop import make_consumer
from consumers.service import Service
from infra.errors import SchemaError
from infra.logging import get_logger
from infra.topics import tenant_topic
from producers.client.spec import JobSpec
from producers.producer import EventProducer
from schemas import events as ev
from schemas.codec import Codec

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
        self.codec = Codec()
        prefix = re.escape(settings.topic_prefix)
        self.consumer = make_consumer(settings, GROUP, pattern=rf"^{prefix}\.t\.[^.]+\.rollouts$")
        self.producer = EventProducer(settings, self.codec, client_id="evaluator")
        self.collector = EpisodeCollector()
        self.completed = 0

    async def start(self) -> None:
        await self.producer.start()
        await self.consumer.start()

    async def stop(self) -> None:
        await self.consumer.stop()
        await self.producer.stop()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            batches = await self.consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for record in records:
                    try:
                        event = self.codec.decode(record.value)
                    except SchemaError as exc:
                        log.error(
                            "undecodable rollout record skipped", offset=record.offset, error=str(exc)[:200]
                        )
                        continue
                    if isinstance(event, ev.RolloutRecord):
                        self.collector.add(record, event)
            await self._advance()
            offsets = {
                tp: o for tp, o in self.collector.safe_offsets().items() if tp in self.consumer.assignment()
            }
            if offsets:
                try:
                    await self.consumer.commit(offsets)
                except Exception as exc:  # a re-read only re-scores what is still held
                    log.warning("commit failed", error_class=type(exc).__name__)

    async def _advance(self) -> None:
        for session_id in self.collector.sessions():
            episodes = self.collector.done_episodes(session_id)
            if not episodes:
                continue
            tenant = episodes[0].records[0].tenant_id
            state = next((s for s in self.service.book.of_tenant(tenant) if session_id in s.sessions), None)
            if state is None:
                continue  # not in the book yet
            if state.kind != "EVAL" or state.terminal or state.cancel_requested:
                self.collector.release(session_id)
                continue
            spec = JobSpec.parse(state.spec_json)
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
