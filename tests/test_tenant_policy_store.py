"""The policy store: exact save -> load -> continue, metadata, integrity checks, atomic writes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import safetensors.torch
import torch

import tenants.policy_store as policy_store
from infra.durable import canonical_json
from tenants.errors import CheckpointCorrupt, CheckpointError, CheckpointNotFound, NonFiniteLoss
from tenants.policy_store import META_FILE, MODEL_FILE, TRAIN_FILE, PolicyStore
from tenants.slot import TenantSlot
from tenants.targets import SFTTargets
from tests.test_tenant_modules import (
    assert_identical,
    make_feature,
    ppo_targets,
    sft_targets,
    snapshot,
    tenant_config,
)

torch.set_num_threads(1)


def train(slot: TenantSlot, gen: torch.Generator, steps: int) -> list[dict[str, float]]:
    """Steps whose data come from ``gen`` and, for PPO, whose actions the slot samples (its RNG)."""
    out = []
    for _ in range(steps):
        feature = make_feature(gen)
        if slot.config.head.kind == "gaussian_actor_critic":
            out.append(slot.train_step(feature, ppo_targets(slot, feature, gen)))
        else:
            out.append(slot.train_step(feature, sft_targets(gen)))
    return out


CONFIGS = {
    "ppo-suffix": tenant_config("ppo-suffix", kind="gaussian_actor_critic", lora_rank=4, seed=5),
    "sft-scheduled": tenant_config("sft-scheduled", warmup_steps=2, decay_steps=5, seed=6),
}


@pytest.mark.parametrize("tenant", sorted(CONFIGS))
def test_save_load_continue_equals_training_without_the_round_trip(tmp_path: Path, tenant: str) -> None:
    torch.use_deterministic_algorithms(True)
    try:
        straight = TenantSlot(CONFIGS[tenant]).mount()
        straight_metrics = train(straight, torch.Generator().manual_seed(0), 6)

        first = TenantSlot(CONFIGS[tenant]).mount()
        gen = torch.Generator().manual_seed(0)
        metrics = train(first, gen, 3)
        store = PolicyStore(tmp_path)
        store.save(first, source_offsets={f"nexus.t.{tenant}.features:0": 3})
        del first  # the process "crashes"; a new one restores from disk
        resumed = store.restore(tenant).mount()
        assert (resumed.step, resumed.version) == (3, 1)
        metrics += train(resumed, gen, 3)
    finally:
        torch.use_deterministic_algorithms(False)

    assert metrics == straight_metrics
    assert_identical(snapshot(resumed) | {"version": 0}, snapshot(straight))


def test_metadata_versions_and_listing(tmp_path: Path) -> None:
    store = PolicyStore(tmp_path)
    slot = TenantSlot(tenant_config("acme")).mount()
    gen = torch.Generator().manual_seed(0)
    train(slot, gen, 2)
    first = store.save(slot, source_offsets={"nexus.t.acme.features:0": 2}, metrics={"loss": 0.5})
    train(slot, gen, 1)
    second = store.save(slot, source_offsets={"nexus.t.acme.features:0": 3})
    assert (first.meta.version, first.meta.parent_version, first.meta.step) == (1, None, 2)
    assert (second.meta.version, second.meta.parent_version, second.meta.step) == (2, 1, 3)
    assert slot.version == 2
    assert store.versions("acme") == [1, 2] and store.latest_version("acme") == 2
    (tmp_path / "lost+found").mkdir()
    assert store.tenants() == ["acme"] and store.versions("nobody") == []
    assert [m.version for m in store.list("acme")] == [1, 2]

    loaded = store.load("acme")
    assert loaded.meta == second.meta and loaded.ref == second.ref
    assert loaded.meta.source_offsets == {"nexus.t.acme.features:0": 3}
    assert store.load("acme", 1).meta.metrics == {"loss": 0.5}
    assert loaded.meta.config == slot.config.to_dict()
    for name in (MODEL_FILE, TRAIN_FILE):
        data = (loaded.path / name).read_bytes()
        digest = {"sha256": hashlib.sha256(data).hexdigest(), "size_bytes": len(data)}
        assert loaded.meta.files[name] == digest
    meta_bytes = (loaded.path / META_FILE).read_bytes()
    assert loaded.ref.sha256 == hashlib.sha256(meta_bytes).hexdigest()
    assert loaded.ref.uri == (loaded.path / META_FILE).as_uri()
    # no pickle: tensors are plain safetensors, everything else JSON
    assert "optimizer.exp_avg.head.net.1.weight" in safetensors.torch.load(
        (loaded.path / TRAIN_FILE).read_bytes())
    json.loads(meta_bytes)


def _saved(tmp_path: Path) -> tuple[PolicyStore, Path]:
    store = PolicyStore(tmp_path)
    slot = TenantSlot(tenant_config("acme", lora_rank=4)).mount()
    train(slot, torch.Generator().manual_seed(0), 2)
    return store, store.save(slot, source_offsets={}).path


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("name", "damage", "message"), [
    (MODEL_FILE, lambda p: _flip_byte(p, -3), "sha256 .* does not match metadata"),
    (TRAIN_FILE, lambda p: p.write_bytes(p.read_bytes()[:1000]), "1000 bytes, metadata says .*truncated"),
    (MODEL_FILE, lambda p: p.unlink(), "file is missing"),
    (META_FILE, lambda p: p.write_bytes(p.read_bytes()[:200]), "not a valid checkpoint metadata file"),
    (META_FILE, lambda p: p.write_text(p.read_text().replace('"step": 2', '"step": 9')),
     "content does not match its checksum"),
])
def test_a_damaged_checkpoint_is_refused_naming_the_file(tmp_path: Path, name: str, damage,
                                                         message: str) -> None:
    store, path = _saved(tmp_path)
    damage(path / name)
    with pytest.raises(CheckpointCorrupt, match=message) as caught:
        store.restore("acme")
    assert str(caught.value).startswith(str(path / name))


def test_a_file_that_matches_its_checksum_but_is_not_safetensors_is_refused(tmp_path: Path) -> None:
    # Someone rewrote the file and its metadata consistently: the parse still refuses it.
    store, path = _saved(tmp_path)
    garbage = b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header!!}"
    (path / MODEL_FILE).write_bytes(garbage)
    body = json.loads((path / META_FILE).read_bytes())
    body.pop("checksum")
    body["files"][MODEL_FILE] = {"sha256": hashlib.sha256(garbage).hexdigest(), "size_bytes": len(garbage)}
    (path / META_FILE).write_bytes(json.dumps(
        {**body, "checksum": hashlib.sha256(canonical_json(body)).hexdigest()}).encode())
    with pytest.raises(CheckpointCorrupt, match="not a readable safetensors file") as caught:
        store.load("acme")
    assert str(path / MODEL_FILE) in str(caught.value)


def test_the_expected_sha256_of_an_event_pins_the_checkpoint(tmp_path: Path) -> None:
    store, _ = _saved(tmp_path)
    ref = store.load("acme").ref
    assert store.load("acme", 1, expected_sha256=ref.sha256).meta.version == 1
    with pytest.raises(CheckpointCorrupt, match="is not the expected"):
        store.load("acme", 1, expected_sha256="0" * 64)


def test_missing_tenants_and_versions(tmp_path: Path) -> None:
    store, _ = _saved(tmp_path)
    with pytest.raises(CheckpointNotFound, match="no checkpoint of tenant other"):
        store.load("other")
    with pytest.raises(CheckpointNotFound, match="no version 7 of tenant acme"):
        store.load("acme", 7)


def test_a_crash_mid_write_leaves_no_visible_checkpoint(tmp_path: Path, monkeypatch) -> None:
    store, _ = _saved(tmp_path)
    slot = store.restore("acme").mount()
    train(slot, torch.Generator().manual_seed(1), 1)
    real_write = policy_store.write_synced

    def write_then_die(path: Path, data: bytes) -> None:
        if path.name == TRAIN_FILE:
            real_write(path, data[: len(data) // 2])
            raise OSError(28, "No space left on device")
        real_write(path, data)

    monkeypatch.setattr(policy_store, "write_synced", write_then_die)
    with pytest.raises(CheckpointError, match="could not write checkpoint"):
        store.save(slot, source_offsets={})
    assert store.versions("acme") == [1] and store.load("acme").meta.version == 1
    assert slot.version == 1
    assert not list((tmp_path / "acme").glob(".tmp-*"))  # cleaned up after the failure

    # a process killed outright leaves its temp directory; it stays invisible until removed
    stale = tmp_path / "acme" / ".tmp-killed"
    stale.mkdir()
    (stale / MODEL_FILE).write_bytes(b"half")
    assert store.versions("acme") == [1] and store.latest_version("acme") == 1
    assert store.remove_incomplete() == [stale] and not stale.exists()


def test_replaying_a_save_is_idempotent_and_a_conflicting_one_an_error(tmp_path: Path) -> None:
    store = PolicyStore(tmp_path)
    config = tenant_config("acme", kind="gaussian_actor_critic")
    first = TenantSlot(config).mount()
    train(first, torch.Generator().manual_seed(0), 2)
    saved = store.save(first, source_offsets={"t:0": 2})
    # a replay after a crash recomputes the same steps and saves the same version again
    replay = TenantSlot(config).mount()
    train(replay, torch.Generator().manual_seed(0), 2)
    again = store.save(replay, source_offsets={"t:0": 2})
    assert again.meta == saved.meta and replay.version == 1 and store.versions("acme") == [1]
    # different tensors under the same version are never silently replaced
    other = TenantSlot(config).mount()
    train(other, torch.Generator().manual_seed(1), 2)
    with pytest.raises(CheckpointError, match="version 1 of tenant acme already exists with different"):
        store.save(other, source_offsets={"t:0": 2})
    assert other.version == 0


def test_a_failed_slot_is_not_saved(tmp_path: Path) -> None:
    slot = TenantSlot(tenant_config("acme")).mount()
    feature = make_feature(torch.Generator().manual_seed(0))
    with pytest.raises(NonFiniteLoss):
        slot.train_step(feature, SFTTargets(torch.full((4, 3, 2), float("inf"))))
    with pytest.raises(CheckpointError, match="refusing to save the failed slot"):
        PolicyStore(tmp_path).save(slot, source_offsets={})


def test_loading_a_checkpoint_brings_a_failed_slot_back(tmp_path: Path) -> None:
    store, _ = _saved(tmp_path)
    slot = store.restore("acme").mount()
    gen = torch.Generator().manual_seed(3)
    with pytest.raises(NonFiniteLoss):
        slot.train_step(make_feature(gen), SFTTargets(torch.full((4, 3, 2), float("nan"))))
    slot.load_state(store.load("acme").state)
    assert not slot.failed and slot.step == 2
    train(slot, gen, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_slot_trained_on_cuda_restores_and_continues_exactly(tmp_path: Path) -> None:
    config = tenant_config("gpu", kind="gaussian_actor_critic", lora_rank=4)
    straight = TenantSlot(config).mount("cuda")
    straight_metrics = train(straight, torch.Generator().manual_seed(0), 4)
    slot = TenantSlot(config).mount("cuda")
    gen = torch.Generator().manual_seed(0)
    metrics = train(slot, gen, 2)
    assert all(p.device.type == "cuda" for p in slot.policy.parameters())
    assert all(v.device.type == "cuda" for s in slot.optimizer.state.values() for k, v in s.items()
               if k != "step")
    store = PolicyStore(tmp_path)
    store.save(slot, source_offsets={})
    resumed = store.restore("gpu").mount("cuda")
    metrics += train(resumed, gen, 2)
    assert metrics == straight_metrics
    for a, b in zip(resumed.policy.parameters(), straight.policy.parameters(), strict=True):
        assert torch.equal(a, b)
