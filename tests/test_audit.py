"""``audit verify`` against the real broker: every policy version of an RL and an SFT tenant is
re-derived from the logged feature batches and equals the store bit for bit; a checkpoint whose
weights were altered and re-signed (so the store's own checksums accept it) fails, by version."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import pytest_asyncio
import safetensors.torch

from consumers.audit import audit_tenant
from infra.durable import checksummed_json, sha256_hex
from producers.dataset.generate import generate_dataset
from tenants.policy_store import META_FILE, MODEL_FILE, _parse_meta
from tests.service_helpers import Stack, running_stack

pytestmark = [pytest.mark.broker, pytest.mark.slow]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(settings, model_root, tmp_path_factory) -> AsyncIterator[Stack]:
    home = tmp_path_factory.mktemp("audit-home")
    async with running_stack(settings, model_root, home, check_restarts=False) as s:
        yield s


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def trained(stack: Stack, tmp_path_factory) -> dict[str, str]:
    """One RL and one SFT tenant, trained at once (their batches share backbone forwards)."""
    demos = tmp_path_factory.mktemp("audit-demos") / "reach"
    await asyncio.to_thread(generate_dataset, "joynexus/Reach-v0", demos, episodes=4, seed=3,
                            image_size=32, max_episode_steps=15, progress=False)
    rl = await stack.client.submit(stack.rl_spec("audit-rl", "rl-1"))
    sft = await stack.client.submit({
        "kind": "sft", "tenant": "audit-sft", "job_id": "sft-1", "dataset": {"path": str(demos)},
        "sft": {"epochs": 2, "batch_size": 16, "publish_every": 3}})
    for job in (rl, sft):
        await stack.follow(job)
    return {"rl": "audit-rl", "sft": "audit-sft"}


def resign(store_root: Path, tenant: str, version: int) -> None:
    """Alter one weight of a stored version and re-sign its metadata, as someone with write access
    to the store could: the store's sha256 checks then accept the altered file."""
    folder = store_root / tenant / f"v{version:08d}"
    tensors = safetensors.torch.load((folder / MODEL_FILE).read_bytes())
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] += 1e-3
    data = safetensors.torch.save(tensors)
    (folder / MODEL_FILE).write_bytes(data)
    meta = _parse_meta(folder / META_FILE, (folder / META_FILE).read_bytes())
    files = {**meta.files, MODEL_FILE: {"sha256": sha256_hex(data), "size_bytes": len(data)}}
    (folder / META_FILE).write_bytes(checksummed_json(asdict(replace(meta, files=files))))


async def test_audit_re_derives_every_version_bit_for_bit(stack: Stack, trained: dict[str, str]) -> None:
    for kind, tenant in trained.items():
        results = await audit_tenant(stack.settings, tenant)
        print(kind, [(r.version, r.how, r.offset_range, r.ok, r.detail) for r in results])
        assert [r.version for r in results] == stack.store.versions(tenant)
        assert all(r.ok for r in results), [(r.version, r.detail) for r in results]
        assert results[0].how == "initial" and all(r.how == "derived" for r in results[1:])
        assert all(r.offsets for r in results[1:])  # each derived version names its batches
        # consecutive versions fold consecutive, non-overlapping offset ranges
        ranges = [(r.offsets[0], r.offsets[-1]) for r in results[1:]]
        assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False)), ranges
    assert len(stack.store.versions(trained["sft"])) >= 3


async def test_audit_names_a_version_whose_weights_were_altered_and_re_signed(
        stack: Stack, trained: dict[str, str]) -> None:
    tenant = trained["rl"]
    resign(stack.store.root, tenant, 2)
    stack.store.load(tenant, 2)  # the store's own checks accept the re-signed checkpoint
    results = {r.version: r for r in await audit_tenant(stack.settings, tenant)}
    assert not results[2].ok and "model tensor" in results[2].detail, results[2]
    assert results[1].ok and results[3].ok  # the fold does not read stored weights: 3 still proves

    env = {**os.environ, "JOYNEXUS_HOME": str(stack.settings.home),
           "JOYNEXUS_BOOTSTRAP_SERVERS": stack.settings.bootstrap}
    cli = [sys.executable, "-m", "infra", "audit", "verify", "--tenant", tenant]
    failed = await asyncio.to_thread(subprocess.run, cli, env=env, capture_output=True, text=True,
                                     timeout=300)
    assert failed.returncode == 1, failed.stdout + failed.stderr[-2000:]
    assert "audit FAILED for version(s) [2]" in failed.stdout, failed.stdout
    passed = await asyncio.to_thread(subprocess.run, [*cli, "--version", "3"], env=env,
                                     capture_output=True, text=True, timeout=300)
    assert passed.returncode == 0 and "audit passed" in passed.stdout, passed.stdout + passed.stderr[-2000:]
