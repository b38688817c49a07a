"""Heartbeats: every role tells ``nexus.health`` it is alive, every few seconds.

Keyed by ``<role>/<instance>``; ``details`` is a small string map of what the role
wants the supervisor to see (sessions, assigned partitions, lag ...). The first
beat says STARTING, the last STOPPING, the rest HEALTHY. A beat that cannot be
sent (broker down) is skipped, not retried: the next one says the same, newer.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable

from aiokafka.errors import KafkaError

from infra.logging import get_logger
from infra.settings import Settings
from infra.topics import shared_topic
from producers.producer import EventProducer
from schemas import events as ev

__all__ = ["Heartbeater"]

log = get_logger("producers.heartbeat")


class Heartbeater:
    def __init__(self, settings: Settings, producer: EventProducer, role: str, instance_id: str,
                 interval_s: float = 5.0, details: Callable[[], dict[str, str]] | None = None):
        self.topic = shared_topic(settings, "health")
        self.producer = producer
        self.role = role
        self.instance_id = instance_id
        self.interval_s = interval_s
        self.details = details or dict
        self.sequence = 0

    async def beat(self, status: ev.RoleStatus) -> None:
        event = ev.Heartbeat(
            envelope=ev.Envelope(producer_id=f"{self.role}/{self.instance_id}"), role=self.role,
            instance_id=self.instance_id, host=socket.gethostname(), pid=os.getpid(), status=status,
            sequence=self.sequence, details={k: str(v) for k, v in self.details().items()})
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
