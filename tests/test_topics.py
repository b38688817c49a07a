"""Topic provisioning against the real broker."""

from __future__ import annotations

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from infra.errors import InvalidTenantId, TopicError
from infra.settings import Settings
from infra.topics import (
    TENANT_STREAMS,
    TopicAdmin,
    TopicName,
    parse_topic,
    shared_topic,
    sibling_topic,
    tenant_stream_pattern,
    tenant_topic,
    validate_tenant_id,
)

pytestmark = pytest.mark.broker


async def _configs(settings: Settings, topic: str) -> dict[str, str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap)
    await admin.start()
    try:
        (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        (_, _, _, _, entries), = response.resources
        return {name: value for name, value, *_ in entries}
    finally:
        await admin.close()


@pytest.mark.parametrize("bad", ["", "Acme", "a.b", "a_b", "a b", "-acme", "acme-", "x" * 49,
                                 "ümlaut", "a/b"])
def test_invalid_tenant_ids_are_refused(bad: str) -> None:
    with pytest.raises(InvalidTenantId, match="invalid tenant id"):
        validate_tenant_id(bad)


def test_topic_names_built_and_parsed_in_one_place() -> None:
    import re

    settings = Settings(topic_prefix="lab-1", _env_file=None)
    name = tenant_topic(settings, "acme", "sessions")
    assert parse_topic(name) == TopicName("lab-1", "sessions", "acme")
    assert parse_topic(shared_topic(settings, "health")) == TopicName("lab-1", "health")
    assert parse_topic("some.other.kind.of.topic") is None
    assert sibling_topic(name, "actions") == tenant_topic(settings, "acme", "actions")
    with pytest.raises(TopicError):
        sibling_topic(shared_topic(settings, "health"), "actions")
    pattern = re.compile(tenant_stream_pattern(settings, "sessions|actions", tenants="acme|bob"))
    assert pattern.match(name) and pattern.match(tenant_topic(settings, "bob", "actions"))
    assert not pattern.match(tenant_topic(settings, "carol", "actions"))
    assert not pattern.match(tenant_topic(settings, "acme", "rollouts"))


@pytest.mark.parametrize("good", ["acme", "a", "lab-7", "x" * 48, "0robot"])
def test_valid_tenant_ids(good: str) -> None:
    assert validate_tenant_id(good) == good


async def test_tenant_topics_are_idempotent_and_laid_out(settings: Settings, unique: str) -> None:
    tenant = f"t-{unique}"
    async with TopicAdmin(settings) as admin:
        first = await admin.ensure_tenant(tenant)
        second = await admin.ensure_tenant(tenant)  # idempotent: no error, same topics
        assert first == second == sorted(tenant_topic(settings, tenant, s.stream)
                                         for s in TENANT_STREAMS)
        assert await admin.tenant_topics(tenant) == first
        assert tenant in await admin.tenants()
        for stream in ("gradient-jobs", "features", "policy-versions", "jobs"):
            assert await admin.partitions(tenant_topic(settings, tenant, stream)) == 1
        assert await admin.partitions(tenant_topic(settings, tenant, "observations")) == \
            settings.partitions

    versions = await _configs(settings, tenant_topic(settings, tenant, "policy-versions"))
    assert versions["cleanup.policy"] == "compact"
    features = await _configs(settings, tenant_topic(settings, tenant, "features"))
    assert features["retention.ms"] == str(settings.features_retention_ms)
    assert features["cleanup.policy"] == "delete"


async def test_shared_topics(settings: Settings) -> None:
    async with TopicAdmin(settings) as admin:
        topics = await admin.ensure_shared()
        assert topics == ["nexus.dlq", "nexus.health", "nexus.tenants", "nexus.usage"]
        assert await admin.ensure_shared() == topics
        assert await admin.partitions("nexus.tenants") == 1
    assert (await _configs(settings, "nexus.tenants"))["cleanup.policy"] == "compact"


async def test_shared_topics_created_by_many_at_once(settings: Settings, unique: str) -> None:
    # A fresh prefix is a fresh broker as far as joynexus's topics go: six processes' worth of
    # admins racing to create the same shared topics all succeed, and the topics exist once.
    import asyncio

    fresh = settings.model_copy(update={"topic_prefix": f"cold-{unique}"})

    async def one() -> list[str]:
        async with TopicAdmin(fresh) as admin:
            return await admin.ensure_shared()

    results = await asyncio.gather(*(one() for _ in range(6)))
    assert all(r == results[0] for r in results) and len(results[0]) == 4
    async with TopicAdmin(fresh) as admin:
        assert await admin.partitions(shared_topic(fresh, "health")) == settings.partitions
        await admin.delete_topics(results[0])


async def test_wrong_partition_count_is_a_clear_error(settings: Settings, unique: str) -> None:
    tenant = f"w-{unique}"
    async with TopicAdmin(settings) as admin:
        # Someone created the features topic by hand with 4 partitions.
        await admin.ensure_topic(tenant_topic(settings, tenant, "features"), 4)
        with pytest.raises(TopicError, match="has 4 partitions, joynexus needs 1"):
            await admin.ensure_tenant(tenant)


async def test_delete_tenant_removes_only_its_topics(settings: Settings, unique: str) -> None:
    doomed, kept = f"d-{unique}", f"k-{unique}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_tenant(doomed)
        await admin.ensure_tenant(kept)
        deleted = await admin.delete_tenant(doomed)
        assert len(deleted) == len(TENANT_STREAMS)
        assert all(t.startswith(f"nexus.t.{doomed}.") for t in deleted)
        assert await admin.tenant_topics(doomed) == []
        assert len(await admin.tenant_topics(kept)) == len(TENANT_STREAMS)
        assert await admin.delete_tenant(doomed) == []  # idempotent
