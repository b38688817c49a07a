"""backbone-train on several instances: each input partition commits in its own transaction, so
two instances share the work, every gradient job becomes exactly one feature batch, and an
instance whose partition was taken over (a zombie: paused, then awake) cannot publish."""

from __future__ import annotations

from collections import Counter

import pytest
from aiokafka.structs import TopicPartition

from consumers.backbone_train import BackboneTrainRole
from consumers.service import Service
from infra.settings import Settings
from infra.topics import TopicAdmin, tenant_topic
from producers.dataset.feeder import DatasetFeeder, FeedPlan
from producers.dataset.format import Dataset
from producers.dataset.generate import generate_dataset
from schemas import events as ev
from tests.helpers import read_topic, running, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow]


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    path = tmp_path_factory.mktemp("bt-data") / "reach"
    generate_dataset("joynexus/Reach-v0", path, episodes=4, seed=2, image_size=32, max_episode_steps=10,
                     progress=False)
    return Dataset(path)


@pytest.fixture
async def service(settings: Settings, backbones, tmp_path) -> Service:
    local = settings.model_copy(update={"home": tmp_path, "backbone": "tiny", "train_max_batch_jobs": 4})
    service = await Service.open(local, backbones["tiny"])
    yield service
    await service.close()


async def topics(settings: Settings, tenants: list[str]) -> None:
    async with TopicAdmin(settings) as admin:
        await admin.ensure_shared()
        for tenant in tenants:
            await admin.ensure_tenant(tenant)


async def feed(settings: Settings, demos: Dataset, tenants: list[str]) -> int:
    total = 0
    for tenant in tenants:
        total += await DatasetFeeder(settings, demos, FeedPlan(tenant, "bt", batch_size=8, epochs=2)).run()
    return total


async def batches_of(settings: Settings, tenants: list[str]) -> Counter:
    seen: Counter = Counter()
    for tenant in tenants:
        for r in await read_topic(settings, tenant_topic(settings, tenant, "features")):
            if isinstance(r.event, ev.FeatureBatch):
                seen[(tenant, r.event.batch_id, r.event.sequence)] += 1
    return seen


async def test_two_instances_share_the_work_exactly_once(service: Service, demos: Dataset,
                                                         unique: str) -> None:
    settings = service.settings
    tenants = [f"bt{i}-{unique}" for i in range(4)]
    await topics(settings, tenants)
    a, b = BackboneTrainRole(service, "a"), BackboneTrainRole(service, "b")
    async with running(a), running(b):
        await wait_for(lambda: a.consumer.assignment() and b.consumer.assignment(), timeout_s=60,
                       what="both instances holding partitions")
        total = await feed(settings, demos, tenants)
        await wait_for(lambda: a.jobs + b.jobs >= total, timeout_s=240, what="every job forwarded")
        seen = await batches_of(settings, tenants)
    assert a.committed > 0 and b.committed > 0, (a.committed, b.committed)  # both did work
    assert len(seen) == total and set(seen.values()) == {1}  # every job once, none twice


async def test_a_zombie_instance_cannot_publish(service: Service, demos: Dataset, unique: str) -> None:
    tenant = f"zombie-{unique}"
    await topics(service.settings, [tenant])
    total = await feed(service.settings, demos, [tenant])
    tp = TopicPartition(tenant_topic(service.settings, tenant, "gradient-jobs"), 0)
    zombie = BackboneTrainRole(service, "zombie")
    await zombie.start()
    try:
        await wait_for(lambda: tp in zombie.consumer.assignment(), timeout_s=60,
                       what="the zombie's partition")
        batches: dict = {}
        while not batches.get(tp):
            batches = await zombie.consumer.getmany(tp, timeout_ms=1000)
        await zombie.producers.get(tp)  # it held the partition and had its producer...
        successor = BackboneTrainRole(service, "successor")
        await successor.producers.get(tp)  # ...until the new owner's producer fenced it
        await zombie._poll(batches)  # awake again: the forward runs, the commit must fail
        assert zombie.aborted == 1 and zombie.committed == 0
        assert await batches_of(service.settings, [tenant]) == Counter()  # nothing visible
    finally:
        await zombie.stop()
    async with running(successor):
        await wait_for(lambda: successor.jobs >= total, timeout_s=240, what="the successor's work")
    seen = await batches_of(service.settings, [tenant])
    assert len(seen) == total and set(seen.values()) == {1}
