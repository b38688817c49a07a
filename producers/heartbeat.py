"""Heartbeats: every role instance tells ``nexus.health`` it is alive, every ``heartbeat_s``.

Keyed by ``<role>/<instance>``. A beat carries who sends it (role, instance, host,
pid, restarts) and what ``sample`` says of its work: assigned partitions, consumer
lag, work held but unfinished, when it last finished something, and a small map of
details. The first beat says STARTING, the last STOPPING, the rest HEALTHY. A beat
that cannot be sent (broker down) is skipped, not retried: the next one says the
same, newer. The health role (``consumers/health.py``) judges instances from these.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from aiokafka.errors import KafkaError

from infra.logging import get_logger
from infra.settings import Settings
from infra.topics import shared_topic
from producers.producer import EventProducer
from schemas import events as ev

__all__ = ["HealthSample", "Heartbeater"]

log = get_logger("producers.heartbeat")


@dataclass(frozen=True)
class HealthSample:
    """One look at a role's work, taken just before a beat."""

    partitions: tuple[str, ...] = ()
    lag: int = -1  # unknown
    pending: int = 0
    progress_at: datetime | None = None
    details: dict[str, str] = field(default_factory=dict)


async def _no_sample() -> HealthSample:
    return HealthSample()


class Heartbeater:
    def __init__(self, settings: Settings, producer: EventProducer, role: str, instance_id: str,
                 interval_s: float | None = None,
                 sample: Callable[[], Awaitable[HealthSample]] = _no_sample, restarts: int = 0):
        self.topic = shared_topic(settings, "health")
        self.producer = producer
        self.role = role
        self.instance_id = instance_id
        self.interval_s = interval_s or settings.heartbeat_s
        self.sample = sample
        self.restarts = restarts
        self.sequence = 0

    async def beat(self, status: ev.RoleStatus) -> None:
        try:
            sample = await asyncio.wait_for(self.sample(), self.interval_s)
        except Exception as exc:  # a beat without numbers still says "alive"
            log.warning("health sample failed", role=self.role, error_class=type(exc).__name__)
            sample = HealthSample()
        event = ev.Heartbeat(
            envelope=ev.Envelope(producer_id=f"{self.role}/{self.instance_id}"), role=self.role,
            instance_id=self.instance_id, host=socket.gethostname(), pid=os.getpid(), status=status,
            sequence=self.sequence, details={k: str(v) for k, v in sample.details.items()},
            partitions=tuple(sample.partitions), lag=sample.lag, pending=sample.pending,
            progress_at=sample.progress_at, restarts=self.restarts)
        try:
            key = f"{self.role}/{self.instance_id}"
            await asyncio.wait_for(self.producer.send(self.topic, event, key=key), self.interval_s)
            self.sequence += 1
        except (KafkaError, TimeoutError) as exc:
            log.warning("heartbeat not sent", role=self.role, error_class=type(exc).__name__)

    async def run(self, stop: asyncio.Event) -> None:
        """Beat until ``stop`` is set; the last beat says STOPPING."""
        await self.beat(ev.RoleStatus.STARTING)
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.interval_s)
            except TimeoutError:
                await self.beat(ev.RoleStatus.HEALTHY)
        await self.beat(ev.RoleStatus.STOPPING)
