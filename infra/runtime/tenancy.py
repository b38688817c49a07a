"""Tenant lifecycle on a secure broker: credentials, topics, ACLs, quotas; and removing all of it.

``create`` gives a tenant a SCRAM user named like the tenant, its topics, the ACLs of
``infra.acl_policy.tenant_acls`` (its jobs topic to write, its own topics and consumer groups to
read, nothing else) and per-user byte-rate quotas (``producer_byte_rate``, ``consumer_byte_rate``).
The password is returned once and stored nowhere (the broker keeps only a salted hash).
``delete`` removes the tenant's topics, ACLs, SCRAM credentials and quotas, its checkpoints, the
tensor-store blobs its feature batches referenced and its datasets, and marks it inactive in the
tenant registry.

``grant_service`` (re)keys the service principal with ``infra.acl_policy.service_acls``.
Everything here needs the broker's super user (``infra.connection.admin_settings``).
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from consumers.bus.replay import replay
from infra.acl_policy import service_acls, tenant_acls
from infra.connection import admin_settings, principal
from infra.errors import ConfigError
from infra.logging import get_logger
from infra.security_admin import SecurityAdmin
from infra.settings import Settings
from infra.topics import TopicAdmin, shared_topic, tenant_topic
from producers.producer import EventProducer
from schemas import events as ev

__all__ = ["TenantExists", "TenantInfo", "TenantManager", "new_password"]

log = get_logger("infra.tenancy")

class TenantExists(ConfigError):
    """``tenant create`` for a tenant that already has credentials."""


@dataclass(frozen=True)
class TenantInfo:
    tenant: str
    has_credentials: bool
    topics: list[str] = field(default_factory=list)
    acls: list[str] = field(default_factory=list)
    quotas: dict[str, float] = field(default_factory=dict)


def new_password() -> str:
    return secrets.token_urlsafe(24)


class TenantManager:
    """``async with TenantManager(settings) as tm``; ``settings`` carry the admin password."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.admin = admin_settings(settings)
        self._security = SecurityAdmin(self.admin)
        self._topics = TopicAdmin(self.admin)

    async def __aenter__(self) -> TenantManager:
        await self._security.__aenter__()
        await self._topics.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._topics.__aexit__(*exc)
        await self._security.__aexit__(*exc)

    @property
    def reserved(self) -> set[str]:
        return {self.settings.admin_username, self.settings.service_username}

    async def grant_service(self, password: str) -> None:
        """Create (or re-key) the service principal and its ACLs; idempotent."""
        await self._security.upsert_user(self.settings.service_username, password)
        await self._security.create_acls(service_acls(self.settings))  # re-creating is a no-op

    async def create(self, tenant: str, *, rotate: bool = False) -> str:
        """Provision ``tenant``; returns its new password (shown once, kept nowhere)."""
        tenant_topic(self.settings, tenant, "jobs")  # validates the id
        if tenant in self.reserved:
            raise ConfigError(f"{tenant!r} is a service principal's name, not a tenant id")
        if await self._security.users([tenant]) and not rotate:
            raise TenantExists(f"tenant {tenant!r} already exists; `tenant create --rotate` gives "
                               "it a new password, `tenant delete` removes it")
        topics = await self._topics.ensure_tenant(tenant)
        await self._security.create_acls(tenant_acls(self.settings, tenant))
        await self._security.set_user_quotas(tenant, {
            "producer_byte_rate": self.settings.tenant_produce_byte_rate,
            "consumer_byte_rate": self.settings.tenant_fetch_byte_rate})
        password = new_password()
        await self._security.upsert_user(tenant, password)  # last: usable only once complete
        await self._until_user(tenant, present=True)
        await self._register(tenant, topics, active=True)
        log.info("tenant created", tenant=tenant, topics=len(topics), rotated=rotate)
        return password

    async def delete(self, tenant: str) -> dict[str, int]:
        """Remove everything of ``tenant``; returns what went, by kind (idempotent)."""
        tenant_topic(self.settings, tenant, "jobs")
        if tenant in self.reserved:
            raise ConfigError(f"{tenant!r} is a service principal, not a tenant")
        gone = {"credentials": int(await self._security.delete_user(tenant))}
        await self._until_user(tenant, present=False)
        blobs = await self._tensor_blobs(tenant)  # read the features before their topic goes
        gone["topics"] = len(await self._topics.delete_tenant(tenant))
        gone["acls"] = await self._security.delete_acls(principal(tenant))
        had_quotas = bool(await self._security.user_quotas(tenant))
        await self._security.set_user_quotas(tenant, {"producer_byte_rate": None,
                                                      "consumer_byte_rate": None})
        gone["quotas"] = int(had_quotas)
        gone["tensor_blobs"] = sum(_unlink(p) for p in blobs)
        gone["checkpoint_dirs"] = _rmtree(self.settings.policy_dir / tenant)
        gone["dataset_dirs"] = _rmtree(self.settings.datasets_root / tenant)
        await self._register(tenant, [], active=False)
        log.info("tenant deleted", tenant=tenant, **gone)
        return gone

    async def _until_user(self, tenant: str, present: bool, timeout_s: float = 15.0) -> None:
        """A credential change reaches the brokers' metadata after the request returns (measured: a
        second ``create`` right after the first did not see the user on a loaded broker); return
        once the broker says what we just did, so the next call sees it too."""
        deadline = time.monotonic() + timeout_s
        while bool(await self._security.users([tenant])) != present:
            if time.monotonic() > deadline:
                raise ConfigError(f"the broker did not show tenant {tenant!r}'s credential "
                                  f"{'created' if present else 'deleted'} within {timeout_s:.0f} s")
            await asyncio.sleep(0.1)

    async def info(self, tenant: str) -> TenantInfo:
        users = await self._security.users([tenant])
        return TenantInfo(
            tenant, bool(users), await self._topics.tenant_topics(tenant),
            [str(b) for b in await self._security.acls(principal(tenant))],
            await self._security.user_quotas(tenant))

    async def list(self) -> list[TenantInfo]:
        """Tenants with credentials or topics (a half-deleted tenant shows up too)."""
        names = set(await self._security.users()) - self.reserved
        names |= set(await self._topics.tenants())
        return [await self.info(t) for t in sorted(names)]

    async def _tensor_blobs(self, tenant: str) -> list[Path]:
        """Tensor-store files the tenant's feature batches refer to (content-addressed blobs are
        named by sha256; a blob of bit-identical features of another tenant would be shared, and
        is then re-written by that tenant's next replay only if its producer runs again)."""
        topic = tenant_topic(self.settings, tenant, "features")
        if topic not in await self._topics.tenant_topics(tenant):
            return []
        paths = []
        async for record in replay(self.admin, topic):
            if isinstance(record.event, ev.FeatureBatch):
                for value in vars(record.event).values():
                    ref = getattr(value, "ref", None)
                    if ref is not None:
                        paths.append(self.settings.tensor_dir / ref.sha256[:2] / ref.sha256)
        return paths

    async def _register(self, tenant: str, topics: list[str], *, active: bool) -> None:
        await self._topics.ensure_shared()
        async with EventProducer(self.admin, client_id="joynexus-tenancy") as producer:
            await producer.send(shared_topic(self.settings, "tenants"), ev.TenantRegistered(
                envelope=ev.Envelope(tenant_id=tenant, producer_id="tenancy"),
                active=active, topics=tuple(topics)), key=tenant)


def _unlink(path: Path) -> int:
    try:
        path.unlink()
    except FileNotFoundError:
        return 0
    return 1


def _rmtree(path: Path) -> int:
    if not path.exists():
        return 0
    shutil.rmtree(path)
    return 1
