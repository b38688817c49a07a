"""Features by content (backbone/feature_cache.py): a hit is bit-identical to computing the row again in
any group, only forward inputs make the key, the size bound holds."""

from __future__ import annotations

import numpy as np
import torch

from backbone.feature_cache import FeatureCache
from backbone.inputs import VLARequest
from backbone.model import Backbone
from tests.vla import requests


def test_a_hit_equals_a_fresh_forward_in_another_group(backbones: dict[str, Backbone]) -> None:
    backbone = backbones["tiny"]
    prepared = [backbone.prepare(r) for r in requests(6, words=4)]
    cache = FeatureCache(backbone.backbone_id, 1 << 30)
    for p, feature in zip(prepared[:3], backbone.forward(prepared[:3]), strict=True):
        cache.put(p, feature)
    again = backbone.forward([prepared[1], prepared[4], prepared[5]])[0]  # other neighbours
    hit = cache.get(prepared[1])
    assert hit is not None and (cache.hits, len(cache)) == (1, 3)
    for name in ("sequence", "attention_mask", "pooled", "proprio", "task_id"):
        assert torch.equal(getattr(hit, name), getattr(again, name)), name
    assert cache.get(prepared[4]) is None and cache.misses == 1


def test_only_forward_inputs_make_the_key(backbones: dict[str, Backbone]) -> None:
    backbone = backbones["tiny"]
    image = np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    base = VLARequest("a", [image], "reach the red target", np.zeros(4, np.float32), task_id=1)
    other_proprio = VLARequest("b", [image], "reach the red target", np.ones(4, np.float32), task_id=2)
    other_text = VLARequest("a", [image], "reach the blue target", np.zeros(4, np.float32), task_id=1)
    p, q, r = (backbone.prepare(x) for x in (base, other_proprio, other_text))
    cache = FeatureCache(backbone.backbone_id, 1 << 30)
    assert cache.key(p) == cache.key(q) != cache.key(r)
    assert FeatureCache("another-backbone", 1 << 30).key(p) != cache.key(p)
    cache.put(p, backbone.forward([p])[0])
    hit = cache.get(q)  # same image and words, another tenant's proprio and task: its own come back
    assert torch.equal(hit.proprio, q.proprio.unsqueeze(0)) and int(hit.task_id) == 2


def test_least_recently_used_entries_go_beyond_the_size_bound(backbones: dict[str, Backbone]) -> None:
    backbone = backbones["tiny"]
    prepared = [backbone.prepare(r) for r in requests(4, words=4)]
    features = backbone.forward(prepared)
    one = sum(t.numel() * t.element_size() for t in (features[0].sequence, features[0].attention_mask,
                                                       features[0].pooled))
    cache = FeatureCache(backbone.backbone_id, 2 * one)
    for p, f in zip(prepared[:2], features[:2], strict=True):
        cache.put(p, f)
    assert cache.get(prepared[0]) is not None  # 0 is now the most recently used
    cache.put(prepared[2], features[2])
    assert len(cache) == 2 and cache.bytes <= 2 * one
    assert cache.get(prepared[1]) is None and cache.get(prepared[0]) is not None
    assert FeatureCache(backbone.backbone_id, 0).max_bytes == 0
