"""Crash and replay through the whole service: a tenant's optimizer worker killed mid-job resumes
from its last published version and committed offset, and ends bit-identical to an uninterrupted
run of the same job (the architecture page's event-sourcing promise)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from consumers.service import Service
from infra.runtime.host import RoleHost
from infra.settings import Settings
from infra.topics import tenant_topic
from producers.client.sdk import Client
from tests.helpers import read_topic

RL: dict[str, Any] = {"iterations": 3, "episodes_per_iteration": 3, "minibatch_size": 10, "ppo_epochs": 3}


def _spec(tenant: str) -> dict[str, Any]:
    return {"kind": "rl", "tenant": tenant, "job_id": "recover", "seed": 5,
            "env": {"max_episode_steps": 12}, "rl": RL}


@pytest.fixture
async def service(settings: Settings, backbones, tmp_path) -> Service:
    # every feature tensor by reference: the claim-check path is part of the bit-equality below
    local = settings.model_copy(update={"home": tmp_path, "backbone": "tiny", "tensor_inline_max_bytes": 0})
    service = await Service.open(local, backbones["tiny"])
    yield service
    await service.close()


async def test_killed_optimizer_worker_resumes_bit_identical(service: Service, unique: str) -> None:
    settings = service.settings
    async with RoleHost(service.settings, service=service) as supervisor, Client(settings) as client:
        reference = await client.submit(_spec(f"ref-{unique}"))
        assert (await client.follow(reference, timeout_s=240)).phase == "completed"

        job = await client.submit(_spec(f"kill-{unique}"))
        host = supervisor.roles["optimizer"]
        killed_at: list[int] = []

        async def kill_mid_job() -> None:
            while len(killed_at) < 2:
                await asyncio.sleep(0.3)
                worker = host.live.get(job.tenant)
                if worker and worker.run_ is not None and worker.run_.steps > len(killed_at) * 12:
                    killed_at.append(worker.run_.steps)
                    host.workers[job.tenant].cancel()

        killer = asyncio.create_task(kill_mid_job())
        state = await client.follow(job, timeout_s=240)
        killer.cancel()
    assert state.phase == "completed", state.reason
    batches = [r.event for r in await read_topic(settings, tenant_topic(settings, job.tenant, "features"))]
    assert batches and all(t.ref is not None and not t.data for b in batches for t in b.features.values())
    assert killed_at, "the worker was never killed mid-job: the test proved nothing"
    store = service.store
    assert store.versions(reference.tenant) == store.versions(job.tenant) == [1, 2, 3, 4]
    for version in (2, 3, 4):
        a = store.load(reference.tenant, version).state
        b = store.load(job.tenant, version).state
        assert a.step == b.step
        assert all(torch.equal(a.model[k], b.model[k]) for k in a.model), f"version {version} differs"
        assert all(torch.equal(a.train[k], b.train[k]) for k in a.train), f"optimizer state {version} differs"
