"""Features by content (backbone/feature_cache.py): a hit is bit-identical to computing the row again in
any group, only forward inputs of the raw request make the key, the size bound holds, and what
inference computed when acting is, key and bits, what backbone-train computes for the rollout's
gradient job."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from backbone.batcher import BatcherConfig, GroupBatcher
from backbone.feature_cache import FeatureCache
from backbone.gate import DeviceGate
from backbone.grouped import forward_grouped_on
from backbone.inputs import InvalidRequest, VLARequest
from backbone.model import Backbone
from consumers.bus.episodes import Episode
from consumers.convert import gradient_job_requests, observation_request
from consumers.rollout import iteration_job
from infra.settings import Settings
from schemas import events as ev
from schemas.codec import Codec
from schemas.jobspec import JobSpec
from schemas.tensors import from_numpy, to_numpy
from tests.service_helpers import assert_same_state, running_stack
from tests.test_backbone import FAMILIES
from tests.vla import requests


def test_a_hit_equals_a_fresh_forward_in_another_group(backbones: dict[str, Backbone]) -> None:
    backbone = backbones["tiny"]
    raw = requests(6, words=4)
    prepared = [backbone.prepare(r) for r in raw]
    cache = FeatureCache(backbone.backbone_id, 1 << 30)
    for r, feature in zip(raw[:3], backbone.forward(prepared[:3]), strict=True):
        cache.put(cache.key(r), feature)
    again = backbone.forward([prepared[1], prepared[4], prepared[5]])[0]  # other neighbours
    hit = cache.get(cache.key(raw[1]), raw[1])
    assert hit is not None and (cache.hits, len(cache)) == (1, 3)
    for name in ("sequence", "attention_mask", "pooled", "proprio", "task_id"):
        assert torch.equal(getattr(hit, name), getattr(again, name)), name
    assert cache.get(cache.key(raw[4]), raw[4]) is None and cache.misses == 1


def test_only_forward_inputs_make_the_key(backbones: dict[str, Backbone]) -> None:
    backbone = backbones["tiny"]
    image = np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    base = VLARequest("a", [image], "reach the red target", np.zeros(4, np.float32), task_id=1)
    other_proprio = VLARequest("b", [image], "reach the red target", np.ones(4, np.float32), task_id=2)
    other_text = VLARequest("a", [image], "reach the blue target", np.zeros(4, np.float32), task_id=1)
    other_image = VLARequest("a", [image[::-1].copy()], "reach the red target", np.zeros(4, np.float32))
    as_float = VLARequest("a", [image.astype(np.float32)], "reach the red target", np.zeros(4, np.float32))
    p, q = backbone.prepare(base), backbone.prepare(other_proprio)
    cache = FeatureCache(backbone.backbone_id, 1 << 30)
    assert cache.key(base) == cache.key(other_proprio) != cache.key(other_text)
    assert len({cache.key(x) for x in (base, other_image, as_float)}) == 3  # bytes, dtype: all count
    assert FeatureCache("another-backbone", 1 << 30).key(base) != cache.key(base)
    cache.put(cache.key(base), backbone.forward([p])[0])
    # same image and words, another tenant's proprio and task: its own come back
    hit = cache.get(cache.key(other_proprio), other_proprio)
    assert torch.equal(hit.proprio, q.proprio.unsqueeze(0)) and int(hit.task_id) == 2
    # per tenant (the service's default): b never hits a's entry, a's own repeat does
    mine = FeatureCache(backbone.backbone_id, 1 << 30, per_tenant=True)
    mine.put(mine.key(base), backbone.forward([p])[0])
    assert mine.get(mine.key(other_proprio), other_proprio) is None
    assert mine.key(other_proprio) != mine.key(base)
    again = VLARequest("a", [image], "reach the red target", np.ones(4, np.float32), task_id=1)
    assert mine.get(mine.key(again), again) is not None
    with pytest.raises(InvalidRequest):  # a malformed request gets a clear error, not a key
        cache.key(VLARequest("a", ["not an image"], "reach", None))


def test_least_recently_used_entries_go_beyond_the_size_bound(backbones: dict[str, Backbone]) -> None:
    backbone = backbones["tiny"]
    raw = requests(4, words=4)
    features = backbone.forward([backbone.prepare(r) for r in raw])
    one = sum(t.numel() * t.element_size() for t in (features[0].sequence, features[0].attention_mask,
                                                       features[0].pooled))
    cache = FeatureCache(backbone.backbone_id, 2 * one)
    for r, f in zip(raw[:2], features[:2], strict=True):
        cache.put(cache.key(r), f)
    assert cache.get(cache.key(raw[0]), raw[0]) is not None  # 0 is now the most recently used
    cache.put(cache.key(raw[2]), features[2])
    assert len(cache) == 2 and cache.bytes <= 2 * one
    assert cache.get(cache.key(raw[1]), raw[1]) is None and cache.get(cache.key(raw[0]), raw[0]) is not None
    assert FeatureCache(backbone.backbone_id, 0).max_bytes == 0


def _rollout(n: int, seed: int = 0) -> list[ev.RolloutRecord]:
    """``n`` steps of three episodes with Reach-sized images and instructions of two bucket lengths."""
    rng = np.random.default_rng(seed)
    texts = ["reach the red target", "reach the small blue target next to the green block on the left"]
    records = []
    for i in range(n):
        episode, step = i % 3, i // 3
        obs = ev.Observation(envelope=ev.Envelope(tenant_id="t"), session_id="s", episode_id=f"s/{episode}",
                             step=step, instruction=texts[episode % 2],
                             image=from_numpy(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)),
                             proprio=from_numpy(rng.standard_normal(4).astype(np.float32)))
        records.append(ev.RolloutRecord(
            envelope=ev.Envelope(tenant_id="t"), session_id="s", episode_id=obs.episode_id, step=step,
            reset_seed=episode, observation=obs, action=from_numpy(np.zeros(2, np.float32)), reward=0.0,
            terminated=False, truncated=i >= n - 3, success=False, policy_version=1, log_prob=0.0, value=0.0))
    return records


@pytest.mark.parametrize("name", FAMILIES)
async def test_inference_features_are_the_bits_training_computes(backbones: dict[str, Backbone],
                                                                 name: str) -> None:
    """What makes sharing the cache between inference and backbone-train safe: the same observation,
    prepared from its Observation (inference, groups of up to 3, flushed as they come) and from the
    rollout's GradientJob (training, one forward with other rows), has the same key and the same
    bits. A device process that restarts with an empty cache therefore trains on the same features."""
    backbone = backbones[name]
    records = _rollout(15)
    cache = FeatureCache(backbone.backbone_id, 1 << 30)
    async with GroupBatcher(backbone, BatcherConfig(target_batch=3, max_wait_ms=1), cache=cache) as batcher:
        acted = await asyncio.gather(*(batcher.submit(observation_request(r.observation, False))
                                       for r in records))
    assert max(g.size for g in batcher.records) > 1 and len(cache) == len(records)

    spec = JobSpec.parse(json.dumps({"kind": "rl", "tenant": "t", "job_id": "j", "env": {},
                                     "rl": {"minibatch_size": len(records), "ppo_epochs": 1}}))
    episodes = [Episode(f"s/{e}", [r for r in records if r.episode_id == f"s/{e}"]) for e in range(3)]
    job = iteration_job(spec, 0, episodes, "test")
    job = Codec().decode(Codec().encode(job))  # as backbone-train reads it
    rows = gradient_job_requests(job)
    prepared = [backbone.prepare(r) for r in rows]
    others = [backbone.prepare(r) for r in requests(7, words=4)]  # other neighbours in the forward
    trained, _ = await forward_grouped_on(DeviceGate(), "train", backbone, prepared + others)
    by_image = {r.observation.image.data: feature for r, feature in zip(records, acted, strict=True)}
    for row, image, feature in zip(rows, to_numpy(job.images), trained[:len(prepared)], strict=True):
        acted_row = by_image[image.tobytes()]
        hit = cache.get(cache.key(row), row)
        assert hit is not None, "the training row's key differs from the inference row's"
        for field in ("sequence", "attention_mask", "pooled"):
            assert torch.equal(getattr(hit, field), getattr(feature, field)), (name, field)
            assert torch.equal(getattr(acted_row, field), getattr(feature, field)), (name, field)


@pytest.mark.broker
@pytest.mark.slow
async def test_rl_checkpoints_are_bit_identical_with_inference_features_shared_or_not(
        settings: Settings, model_root: Path, tmp_path: Path, unique: str) -> None:
    """The same RL job on a service without any feature cache, and on one where backbone-train reuses
    what inference computed when acting: every checkpoint (modules and optimizer state) is the same,
    bit for bit, and with sharing the training service forwards none of the rollout's rows."""
    rl = {"iterations": 2, "episodes_per_iteration": 3, "minibatch_size": 16, "ppo_epochs": 3}
    configs = {"off": {"train_feature_cache_mb": 0.0, "feature_cache_from_inference": False},
               "shared": {"feature_cache_from_inference": True}}
    states, rows = {}, {}
    for name, overrides in configs.items():
        async with running_stack(settings, model_root, tmp_path / name, **overrides) as stack:
            tenant = f"reuse-{name}-{unique}"
            await stack.ensure_tenant(tenant)
            train = stack.supervisor.roles["backbone-train"]
            spec = stack.rl_spec(tenant, f"job-reuse-{unique}", seed=3, env={"max_episode_steps": 12}, rl=rl)
            await stack.run(spec)
            states[name] = [stack.store.load(tenant, v).state for v in stack.store.versions(tenant)]
            rows[name] = (train.rows_by_tenant[tenant], train.rows, train.rows_requested)
    # Without a cache, only the epochs that share a poll share a forward. Only this tenant's rows are
    # compared: the backbone-train group is shared by the suite's modules, and in the full suite either
    # stack may also re-run gradient jobs earlier tests left uncommitted (2,976 vs 216 requested once;
    # on a slow VM the second stack forwarded 92 such rows of other tenants).
    assert 0 < rows["off"][0] <= rows["off"][1] <= rows["off"][2] and rows["shared"][2] > 0, rows
    assert rows["shared"][0] == 0, f"training forwarded rows inference had computed: {rows}"
    assert len(states["off"]) == len(states["shared"]) == 3
    for version, (a, b) in enumerate(zip(states["off"], states["shared"], strict=True), start=1):
        assert_same_state(a, b, f"version {version} with the shared cache")
