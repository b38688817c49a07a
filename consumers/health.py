"""The health role: judges every role instance from its heartbeats (``joynexus run health``).

It folds ``nexus.health`` into a ``HealthBook`` (``infra/healthbook.py`` holds
the rules: DEAD when heartbeats stop, HUNG when progress stalls while work
waits) and publishes each new judgement as an ``InstanceVerdict`` on the same
topic. It never acts itself: the supervisor of the instance's machine reads the
verdict, kills the process and restarts it in place (``infra/runtime/supervisor.py``),
so one health role serves any number of machines, and several health roles only
repeat each other (a verdict about a pid that is already gone changes nothing).
"""

from __future__ import annotations

import asyncio
import contextlib

from consumers.bus.protocols import Workload
from infra.healthbook import HealthView, Verdict
from infra.logging import get_logger
from infra.settings import Settings
from infra.topics import shared_topic
from producers.producer import EventProducer
from schemas import events as ev

__all__ = ["HealthRole"]

log = get_logger("consumers.health")


class HealthRole:
    def __init__(self, settings: Settings, instance: str = "0"):
        self.settings = settings
        self.instance = instance
        # Look back over a few timeouts: enough to know every live instance, little to read.
        self.view = HealthView(settings, lookback_s=max(30.0, 4 * settings.health_timeout_s),
                               name=f"health-{instance}")
        self.producer = EventProducer(settings, client_id=f"health-{instance}")
        self.given = 0

    def workload(self) -> Workload:
        return Workload((), done=self.view.follower.applied,
                        details={"instances": len(self.view.book.instances), "verdicts": self.given})

    async def start(self) -> None:
        await self.producer.start()
        await self.view.start()

    async def stop(self) -> None:
        await self.view.stop()
        await self.producer.stop()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for verdict in self.view.book.verdicts(self.settings.health_timeout_s,
                                                   self.settings.stall_timeout_s):
                await self._publish(verdict)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)

    async def _publish(self, verdict: Verdict) -> None:
        state = verdict.state
        event = ev.InstanceVerdict(
            envelope=ev.Envelope(producer_id=f"health/{self.instance}"), role=state.role,
            instance_id=state.instance_id, host=state.host, pid=state.pid, verdict=verdict.verdict,
            reason=verdict.reason, last_heartbeat_at=state.beat_at, progress_at=state.progress_at)
        await self.producer.send(shared_topic(self.settings, "health"), event,
                                 key=f"{state.role}/{state.instance_id}")
        self.given += 1
        log.warning("instance judged", verdict=verdict.verdict, role=state.role, instance=state.instance_id,
                    host=state.host, pid=state.pid, reason=verdict.reason)
