"""Topic names and idempotent provisioning.

Tenant-private streams are ``<prefix>.t.<tenant>.<stream>`` and shared ones
``<prefix>.<stream>`` (prefix ``nexus``). One topic per tenant and stream lets
Kafka's prefixed ACLs, quotas, retention, replay and deletion work per tenant.

Tenant ids follow ``infra.tenant_id`` (1-48 lowercase letters, digits, inner hyphens) and the
prefix has no dot either (``Settings.topic_prefix``), so a name splits on dots unambiguously.
This module is the only place that builds or parses topic names.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import for_code

from infra.connection import client_options
from infra.errors import TenantMismatch, TopicError
from infra.logging import get_logger
from infra.settings import Settings
from infra.tenant_id import validate_tenant_id

__all__ = [
    "SHARED_STREAMS",
    "TENANT_STREAMS",
    "TopicAdmin",
    "TopicName",
    "TopicSpec",
    "check_tenant",
    "parse_topic",
    "shared_topic",
    "sibling_topic",
    "tenant_stream_pattern",
    "tenant_topic",
    "validate_tenant_id",
]

log = get_logger("infra.topics")

_TOPIC_ALREADY_EXISTS = 36
_UNKNOWN_TOPIC = 3

DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class TopicSpec:
    """How one stream's topic is laid out. ``partitions=None`` takes settings.partitions."""

    stream: str
    partitions: int | None = None
    configs: dict[str, str] = field(default_factory=dict)
    doc: str = ""

    def partition_count(self, settings: Settings) -> int:
        return self.partitions or settings.partitions

    def topic_configs(self, settings: Settings) -> dict[str, str]:
        configs = {"retention.ms": str(settings.retention_ms), **self.configs}
        if self.stream == "features":
            configs["retention.ms"] = str(settings.features_retention_ms)
        if self.stream == "dlq":
            configs["retention.ms"] = str(settings.dlq_retention_ms)
        if configs.get("cleanup.policy") == "compact":
            configs.pop("retention.ms")
        return configs


_COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1"}

#: A tenant's private streams. gradient-jobs and features have ONE partition, so
#: a tenant's optimizer steps are totally ordered.
TENANT_STREAMS: tuple[TopicSpec, ...] = (
    TopicSpec("jobs", 1, doc="JobSubmitted (and cancellations) from the tenant"),
    TopicSpec("status", 1, doc="Job lifecycle: accepted, progress, completed, failed..."),
    TopicSpec("observations", None, {"retention.ms": str(DAY_MS)}, "Inference queue, by session"),
    TopicSpec("actions", None, {"retention.ms": str(DAY_MS)}, "Actions back to env sessions"),
    TopicSpec("rollouts", None, doc="RolloutRecords, by session"),
    TopicSpec("gradient-jobs", 1, doc="Training queue: minibatches for the backbone"),
    TopicSpec("features", 1, doc="FeatureBatches for the tenant's optimizer worker"),
    TopicSpec("policy-versions", 1, _COMPACT, "PolicyVersionPublished, the snapshot index"),
    # Co-partitioned with observations/actions/rollouts (same count, same session keys), so
    # the env worker that owns a session's partition also owns its actions.
    TopicSpec("sessions", None, _COMPACT, "EnvSession requests, closes and progress, by session"),
)

SHARED_STREAMS: tuple[TopicSpec, ...] = (
    TopicSpec("dlq", None, doc="Records that failed to decode or process, with reasons"),
    TopicSpec("health", None, {"retention.ms": str(DAY_MS)}, "Heartbeats of every role"),
    TopicSpec("usage", None, doc="UsageRecorded: device-seconds per tenant"),
    TopicSpec("tenants", 1, _COMPACT, "Tenant registry, keyed by tenant id"),
)


def tenant_topic(settings: Settings, tenant: str, stream: str) -> str:
    validate_tenant_id(tenant)
    if stream not in {s.stream for s in TENANT_STREAMS}:
        raise TopicError(f"unknown tenant stream {stream!r}")
    return f"{settings.topic_prefix}.t.{tenant}.{stream}"


def tenant_stream_pattern(settings: Settings, streams: str, tenants: str = r"[^.]+") -> str:
    """Regex of the topics of ``streams`` (one stream, or alternatives ``a|b``) of every tenant
    ``tenants`` matches (a regex; every tenant by default): what the shared roles subscribe to."""
    return rf"^{re.escape(settings.topic_prefix)}\.t\.(?:{tenants})\.(?:{streams})$"


@dataclass(frozen=True)
class TopicName:
    """A joynexus topic name taken apart; ``tenant`` is None for a shared stream."""

    prefix: str
    stream: str
    tenant: str | None = None


def parse_topic(topic: str) -> TopicName | None:
    """``<prefix>.t.<tenant>.<stream>`` or ``<prefix>.<stream>``; None for any other name."""
    parts = topic.split(".")
    if len(parts) == 4 and parts[1] == "t":
        return TopicName(parts[0], parts[3], parts[2])
    if len(parts) == 2:
        return TopicName(parts[0], parts[1])
    return None


def check_tenant(topic: str, claimed: str | None) -> str | None:
    """The tenant a record belongs to: the one its topic names (the broker's ACLs decide who may
    write there), never the one its body claims. A body that names another tenant raises
    ``TenantMismatch`` and is logged as a security event; a shared topic has no tenant (None)."""
    name = parse_topic(topic)
    if name is None or name.tenant is None:
        return None
    if claimed is not None and claimed != name.tenant:
        log.warning("security event: a record names another tenant than its topic",
                    security_event="tenant_mismatch", topic=topic, topic_tenant=name.tenant,
                    claimed_tenant=claimed)
        raise TenantMismatch(f"record on {topic} (tenant {name.tenant!r}) names tenant {claimed!r}")
    return name.tenant


def sibling_topic(topic: str, stream: str) -> str:
    """The same tenant's topic of another stream (a sessions partition's actions topic)."""
    name = parse_topic(topic)
    if name is None or name.tenant is None:
        raise TopicError(f"{topic!r} is not a tenant topic")
    return f"{name.prefix}.t.{name.tenant}.{stream}"


def shared_topic(settings: Settings, stream: str) -> str:
    if stream not in {s.stream for s in SHARED_STREAMS}:
        raise TopicError(f"unknown shared stream {stream!r}")
    return f"{settings.topic_prefix}.{stream}"


def tenant_prefix(settings: Settings, tenant: str) -> str:
    return f"{settings.topic_prefix}.t.{validate_tenant_id(tenant)}."


class TopicAdmin:
    """Creates, checks, lists and deletes joynexus topics. Use as an async context manager."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._admin = AIOKafkaAdminClient(
            **client_options(settings), client_id=f"{settings.client_id}-admin",
            request_timeout_ms=settings.request_timeout_ms,
        )

    async def __aenter__(self) -> TopicAdmin:
        await self._admin.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._admin.close()

    async def ensure_shared(self) -> list[str]:
        return await self._ensure({shared_topic(self.settings, s.stream): s for s in SHARED_STREAMS})

    async def ensure_tenant(self, tenant: str) -> list[str]:
        specs = {tenant_topic(self.settings, tenant, s.stream): s for s in TENANT_STREAMS}
        return await self._ensure(specs)

    async def ensure_topic(self, name: str, partitions: int, configs: dict[str, str] | None = None) -> None:
        """Provision one ad-hoc topic (tests, tools) with the same idempotence rules."""
        await self._ensure({name: TopicSpec(name, partitions, configs or {})})

    async def tenant_topics(self, tenant: str) -> list[str]:
        prefix = tenant_prefix(self.settings, tenant)
        return sorted(t for t in await self._admin.list_topics() if t.startswith(prefix))

    async def tenants(self) -> list[str]:
        prefix = f"{self.settings.topic_prefix}.t."
        names = {parse_topic(t) for t in await self._admin.list_topics() if t.startswith(prefix)}
        return sorted({n.tenant for n in names if n is not None and n.tenant})

    async def delete_tenant(self, tenant: str) -> list[str]:
        topics = await self.tenant_topics(tenant)
        await self.delete_topics(topics)
        if topics:
            log.info("deleted tenant topics", tenant=tenant, topics=topics)
        return topics

    async def delete_topics(self, topics: list[str]) -> None:
        """Delete topics (missing ones are fine); return once metadata no longer lists them."""
        if not topics:
            return
        response = await self._admin.delete_topics(topics)
        for name, code, *_ in response.topic_error_codes:
            if code not in (0, _UNKNOWN_TOPIC):
                raise TopicError(f"deleting {name}: {for_code(code).__name__}")
        await self._wait_listed(topics, present=False)

    async def _wait_listed(self, topics: Iterable[str], present: bool, timeout_s: float = 30.0) -> None:
        """Creation and deletion finish asynchronously on the broker (KRaft propagates
        them to the metadata cache); return once metadata shows the change."""
        wanted = set(topics)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            listed = set(await self._admin.list_topics())
            if (wanted <= listed) if present else not (wanted & listed):
                return
            if asyncio.get_running_loop().time() > deadline:
                state = "listed" if present else "gone"
                raise TopicError(f"topics not {state} {timeout_s:.0f}s after the request: {sorted(wanted)}")
            await asyncio.sleep(0.1)

    async def partitions(self, topic: str) -> int:
        (meta,) = await self._admin.describe_topics([topic])
        if meta["error_code"]:
            raise TopicError(f"{topic}: {for_code(meta['error_code']).__name__}")
        return len(meta["partitions"])

    async def _ensure(self, specs: dict[str, TopicSpec]) -> list[str]:
        existing = set(await self._admin.list_topics())
        missing = [n for n in specs if n not in existing]
        if missing:
            await self._create(missing, specs)
            await self._wait_listed(missing, present=True)
        for name in specs.keys() - set(missing):
            await self._check_existing(name, specs[name])
        if missing:
            log.info("created topics", topics=sorted(missing))
        return sorted(specs)

    async def _create(self, names: Iterable[str], specs: dict[str, TopicSpec]) -> None:
        response = await self._admin.create_topics([
            NewTopic(n, specs[n].partition_count(self.settings), 1,
                     topic_configs=specs[n].topic_configs(self.settings))
            for n in names
        ])
        for name, code, message in response.topic_errors:
            if code == _TOPIC_ALREADY_EXISTS:  # created concurrently by another process
                await self._check_existing(name, specs[name])
            elif code:
                raise TopicError(f"creating {name}: {for_code(code).__name__}: {message}")

    async def _check_existing(self, name: str, spec: TopicSpec) -> None:
        have = await self.partitions(name)
        want = spec.partition_count(self.settings)
        # Fixed counts are part of the design (one partition = total order); a
        # scalable topic may have been given more partitions by an operator.
        if (spec.partitions and have != want) or have < want:
            raise TopicError(f"{name} has {have} partitions, joynexus needs {want}")
        configs = spec.topic_configs(self.settings)
        (response,) = await self._admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name, configs)]
        )
        for code, message, *_ in response.resources:
            if code:
                raise TopicError(f"configuring {name}: {for_code(code).__name__}: {message}")
