"""A benchmark turn's tenants exist only during the turn: created before it, deleted after it.

Every fetch a consumer sends names each partition assigned to it, and aiokafka has no
incremental fetch sessions (KIP-227), so a tenant whose topics exist costs every fetch of every
role that reads its streams, whether it has work or not. Measured on 2026-12-03 (2 vCPUs, the
observation -> action round trip of ``benchmarks/bus_roundtrip.py`` with 84 idle partitions also
assigned to both of its consumers): client CPU 2.3-2.7 -> 5.2-5.3 ms a round trip, broker CPU
1.2-1.3 -> 1.9-2.1 ms, p50 1.6-1.9 -> 3.5-3.7 ms. A benchmark that made every run's tenants up
front measured its last runs with 24 finished tenants' topics beside the 4 at work, and its
isolated tenants were not alone on the service.

``TenantTurns.turn(tenants)`` creates the tenants' topics, waits until the service has taken
them in, yields, deletes them and waits until the service has let them go. "Taken in": every
consumer group that reads tenant streams by pattern (``PATTERN_GROUPS``) is Stable with exactly
the existing topics of its streams assigned, and a metadata refresh (``pattern_refresh_ms``) has
passed, so the group-less read models (job books, followers) list them too. The waits are
outside the clock: a group's rebalance is not the work measured, and the isolated mode, which
has four turns to the shared mode's one, would otherwise pay it four times.

What deletion leaves: the tenants' checkpoints (the bit-equality check reads them), their
metering on the shared ``usage`` topic, and the service's in-memory state of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from consumers import backbone_train, evaluator, inference, rollout
from consumers.env import worker as env_worker
from consumers.master import role as master
from infra.connection import client_options
from infra.settings import Settings
from infra.topics import TopicAdmin, parse_topic

__all__ = ["PATTERN_GROUPS", "TenantTurns"]

#: The service's consumer groups that subscribe to every tenant's topics of some streams.
PATTERN_GROUPS: dict[str, tuple[str, ...]] = {
    master.GROUP: ("jobs",),
    inference.GROUP: ("observations",),
    backbone_train.GROUP: ("gradient-jobs",),
    env_worker.GROUP: ("sessions", "actions"),
    rollout.GROUP: ("rollouts",),
    evaluator.GROUP: ("rollouts",),
}


class TenantTurns:
    def __init__(self, settings: Settings, timeout_s: float = 120.0) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self.topics = TopicAdmin(settings)
        self.admin = AIOKafkaAdminClient(**client_options(settings), client_id=f"{settings.client_id}-turns")

    async def __aenter__(self) -> TenantTurns:
        await self.topics.__aenter__()
        await self.admin.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.admin.close()
        await self.topics.__aexit__(*exc)

    @contextlib.asynccontextmanager
    async def turn(self, tenants: Iterable[str]) -> AsyncIterator[None]:
        tenants = list(tenants)
        for tenant in tenants:
            await self.topics.ensure_tenant(tenant)
        await self.settled()
        try:
            yield
        finally:
            for tenant in tenants:
                await self.topics.delete_tenant(tenant)
            await self.settled()

    async def settled(self) -> None:
        """Returns once every running pattern group holds exactly its streams' existing topics and
        a pattern refresh has passed; raises TimeoutError naming the groups that did not."""
        refreshed = time.monotonic() + self.settings.pattern_refresh_ms / 1000 + 1.0
        deadline = time.monotonic() + self.timeout_s
        while True:
            behind = await self.unsettled()
            if not behind and time.monotonic() >= refreshed:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumer groups did not settle in {self.timeout_s:.0f} s: {behind}")
            await asyncio.sleep(0.5)

    async def unsettled(self) -> dict[str, str]:
        """Group -> why it has not settled (empty: all have). A group without members is not running."""
        prefix = self.settings.topic_prefix
        streams = {t: n.stream for t in await self.admin.list_topics()  # every tenant topic's stream
                   if (n := parse_topic(t)) is not None and n.tenant and n.prefix == prefix}
        behind: dict[str, str] = {}
        for name in PATTERN_GROUPS:
            # one group a request: aiokafka 0.14 misreads a response describing two (buffer underrun)
            (response,) = await self.admin.describe_consumer_groups([name])
            for _, group, state, _, _, members, *_ in response.groups:
                if not members:
                    continue
                if state != "Stable":
                    behind[group] = state
                    continue
                assigned = {topic for m in members
                            for topic, _ in ConsumerProtocolMemberAssignment.decode(m[4]).assignment}
                wanted = {t for t, stream in streams.items() if stream in PATTERN_GROUPS[group]}
                if assigned != wanted:
                    behind[group] = (f"{len(wanted - assigned)} topics not assigned yet, "
                                     f"{len(assigned - wanted)} assigned but gone")
        return behind
