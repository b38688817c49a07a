"""The shared backbone: presets, frozen read-only sharing, and grouped == serial."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from transformers import SiglipImageProcessor

from backbone import families
from backbone.feature import VLAFeature
from backbone.inputs import InvalidRequest, VLARequest, resize_images
from backbone.model import Backbone
from infra.errors import ConfigError
from tests.vla import requests

FAMILIES = ["tiny", "tiny-paligemma", "tiny-llava", "tiny-qwen25vl", "tiny-qwen3vl", "tiny-smolvlm"]


def test_tiny_presets_are_small_frozen_and_in_eval(backbones: dict[str, Backbone]) -> None:
    for name, backbone in backbones.items():
        assert backbone.num_parameters() < 1_000_000, name
        assert backbone.trainable_parameters() == [], name
        assert not backbone.model.training, name


def test_concurrent_cold_starts_build_a_preset_once(tmp_path: Path, backbones: dict[str, Backbone]) -> None:
    # Processes starting at once on a fresh home all ask for the same preset: one builds it under a
    # lock, the others wait and load it; nobody crashes on a half-built folder.
    import subprocess
    import sys

    code = ("import sys; from backbone.model import Backbone; "
            "print(Backbone.from_preset('tiny', sys.argv[1]).backbone_id)")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-500:] for _, err in outs]
    ids = {out.strip().splitlines()[-1] for out, _ in outs}
    assert ids == {backbones["tiny"].backbone_id}  # same seed, same files, same id
    folders = [d for d in tmp_path.iterdir() if d.is_dir()]
    assert len(folders) == 1 and not folders[0].name.startswith(".")  # no temporary folder left


def test_describe_matches_the_loaded_backbone(model_root: Path, backbones: dict[str, Backbone]) -> None:
    from backbone.info import describe

    for name, backbone in backbones.items():  # every family's config nests its width its own way
        assert describe(name, model_root, "cpu") == backbone.info, name


def test_preset_round_trips_through_save_pretrained(model_root: Path,
                                                    backbones: dict[str, Backbone]) -> None:
    from backbone.presets import get_preset, preset_dir

    again = Backbone.load(preset_dir(model_root, get_preset("tiny")))  # as any HF checkpoint
    assert again.weights_digest() == backbones["tiny"].weights_digest()
    assert again.backbone_id == backbones["tiny"].backbone_id
    prepared = [again.prepare(r) for r in requests(2, words=4)]
    for a, b in zip(again.forward(prepared), backbones["tiny"].forward(prepared), strict=True):
        assert torch.equal(a.sequence, b.sequence)


def test_a_bf16_preset_is_drawn_and_saved_in_bf16(tmp_path: Path, backbones: dict[str, Backbone]) -> None:
    # The GPU presets are bf16 (half the bytes to draw and write); on a CPU they are drawn there.
    from dataclasses import replace

    from safetensors import safe_open

    from backbone.model import build_preset
    from backbone.presets import get_preset

    build_preset(replace(get_preset("tiny"), weights_dtype="bfloat16"), tmp_path / "tiny-bf16")
    with safe_open(str(tmp_path / "tiny-bf16" / "model.safetensors"), "pt") as f:
        dtypes = {f.get_slice(name).get_dtype() for name in f.keys()}  # noqa: SIM118 - no dict
    assert dtypes == {"BF16"}
    loaded = Backbone.load(tmp_path / "tiny-bf16", "cpu", "float32")
    assert loaded.num_parameters() == backbones["tiny"].num_parameters()


def test_unknown_preset_and_bad_directory_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown backbone preset 'huge'"):
        Backbone.from_preset("huge", tmp_path)
    with pytest.raises(ConfigError, match="no config.json"):
        Backbone.load(tmp_path)


@pytest.mark.parametrize("cameras", [1, 2])
@pytest.mark.parametrize("name", FAMILIES)
def test_grouped_features_equal_serial_bit_for_bit(backbones: dict[str, Backbone], name: str,
                                                   cameras: int) -> None:
    backbone = backbones[name]
    prepared = [backbone.prepare(r) for r in requests(8, words=4, cameras=cameras)]
    assert len({p.key for p in prepared}) == 1  # one bucket
    grouped = backbone.forward(prepared)
    for p, g in zip(prepared, grouped, strict=True):
        (alone,) = backbone.forward([p])
        for field in ("sequence", "attention_mask", "pooled", "proprio", "task_id"):
            assert torch.equal(getattr(g, field), getattr(alone, field)), (name, field)


@pytest.mark.parametrize("cameras", [1, 2])
@pytest.mark.parametrize("name", FAMILIES)
def test_direct_pixels_equal_the_image_processors_own_call(backbones: dict[str, Backbone], name: str,
                                                            cameras: int, monkeypatch) -> None:
    """Every preset's processor (loaded back from its checkpoint) takes the direct path, and the
    direct path gives the bits its ``__call__`` gives, for images of any source size."""
    backbone = backbones[name]
    family, size = backbone.family, backbone.spec.image_size
    assert families.direct(family.image_processor), type(family.image_processor)
    rng = np.random.default_rng(cameras)
    cases = [resize_images([rng.integers(0, 256, (side, side + 8, 3), dtype=np.uint8)
                            for _ in range(cameras)], size, 4) for side in (24, size, 2 * size)]
    direct = [family.pixels(images) for images in cases]
    monkeypatch.setattr(families, "direct", lambda processor: False)
    for images, fast in zip(cases, direct, strict=True):
        called = family.pixels(images)
        assert fast.values.dtype == called.values.dtype == torch.float32
        assert torch.equal(fast.values, called.values), name
        assert fast.tokens_per_camera == called.tokens_per_camera
        assert (fast.grid_thw is None) == (called.grid_thw is None)
        assert fast.grid_thw is None or torch.equal(fast.grid_thw, called.grid_thw)


@pytest.mark.parametrize("side", [40, 56, 97])
def test_direct_pixels_of_a_resizing_processor(side: int) -> None:
    """The presets' SigLIP processors do not resize (images come at the backbone's size); a
    checkpoint's may: its resize, called directly, gives ``__call__``'s bits too."""
    processor = SiglipImageProcessor(size={"height": 56, "width": 56}, image_mean=[0.5] * 3,
                                     image_std=[0.5] * 3)
    images = [np.random.default_rng(side).integers(0, 256, (side, side, 3), dtype=np.uint8) for _ in range(2)]
    assert families.direct(processor)
    called = processor(images=images, return_tensors="pt")["pixel_values"]
    assert torch.equal(families.normalised(processor, images), called)


def test_padding_is_masked(backbones: dict[str, Backbone]) -> None:
    """The same request padded to two bucket lengths: real tokens agree within 1e-5."""
    backbone = backbones["tiny"]
    request = requests(1, words=3)[0]
    short = backbone.prepare(request)
    buckets = backbone.spec.token_buckets
    object.__setattr__(backbone.spec, "token_buckets", buckets[1:])  # force the next bucket
    try:
        long = backbone.prepare(request)
    finally:
        object.__setattr__(backbone.spec, "token_buckets", buckets)
    assert long.key.tokens > short.key.tokens
    (a,) = backbone.forward([short])
    (b,) = backbone.forward([long])
    n = short.key.tokens
    real = a.attention_mask[0]
    assert torch.allclose(a.sequence[0, real], b.sequence[0, :n][real], atol=1e-5, rtol=0)
    assert torch.allclose(a.pooled, b.pooled, atol=1e-5, rtol=0)


class Head(nn.Module):
    """A tenant head on pooled features, with a deterministic, per-tenant init."""

    def __init__(self, hidden: int, proprio: int, out: int, seed: int):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(hidden + proprio, 32), nn.GELU(), nn.Linear(32, out))
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)

    def forward(self, f: VLAFeature) -> torch.Tensor:
        return self.net(torch.cat([f.pooled, f.proprio], -1))


def _train(backbone: Backbone, batches: list[list[VLARequest]], grouped: bool, steps: int = 3):
    """Each tenant trains its own head with AdamW on its own samples, for `steps` steps."""
    tenants = sorted({r.tenant for r in batches[0]})
    heads = {t: Head(backbone.hidden_size, 5, 7, seed=i)
             for i, t in enumerate(tenants)}
    optims = {t: torch.optim.AdamW(heads[t].parameters(), lr=1e-2) for t in tenants}
    history = []
    for step in range(steps):
        batch = batches[step]
        prepared = [backbone.prepare(r) for r in batch]
        feats = backbone.forward(prepared) if grouped else [backbone.forward([p])[0] for p in prepared]
        target = torch.arange(7, dtype=torch.float32) / 7
        losses, grads = {}, {}
        for t in tenants:
            mine = VLAFeature.cat([f for f, r in zip(feats, batch, strict=True) if r.tenant == t])
            optims[t].zero_grad()
            loss = (heads[t](mine) - target).abs().mean()
            loss.backward()
            optims[t].step()
            losses[t] = loss.detach().clone()
            grads[t] = [p.grad.clone() for p in heads[t].parameters()]
        history.append((losses, grads))
    params = {t: [p.detach().clone() for p in heads[t].parameters()] for t in tenants}
    return history, params


@pytest.mark.parametrize("name", ["tiny", "tiny-paligemma"])
def test_grouped_training_equals_serial_bit_for_bit(backbones: dict[str, Backbone], name: str) -> None:
    backbone = backbones[name]
    # 4 tenants x 2 samples per step, 3 steps, every request in one bucket.
    batches = []
    for step in range(3):
        reqs = requests(8, seed=100 + step, words=4)
        batches.append([VLARequest(f"t{i % 4}", r.images, r.instruction, r.proprio)
                        for i, r in enumerate(reqs)])
    grouped_hist, grouped_params = _train(backbone, batches, grouped=True)
    serial_hist, serial_params = _train(backbone, batches, grouped=False)
    for (gl, gg), (sl, sg) in zip(grouped_hist, serial_hist, strict=True):
        for t in gl:
            assert torch.equal(gl[t], sl[t])
            assert all(torch.equal(a, b) for a, b in zip(gg[t], sg[t], strict=True))
    for t in grouped_params:
        assert all(torch.equal(a, b) for a, b in zip(grouped_params[t], serial_params[t], strict=True))


def test_mixed_workload_leaves_the_backbone_unchanged(backbones: dict[str, Backbone]) -> None:
    backbone = backbones["tiny"]
    before = backbone.weights_digest()
    batches = [requests(8, seed=s, words=4) for s in range(3)]
    _train(backbone, batches, grouped=True)  # heads train on its features, with backward
    for cams in (1, 2):
        backbone.forward([backbone.prepare(r) for r in requests(3, seed=9, cameras=cams)])
    assert backbone.weights_digest() == before
    assert backbone.trainable_parameters() == []


@pytest.mark.parametrize("bad, message", [
    (VLARequest("t", [np.zeros((8, 8), np.uint8)], "x"), "HxWx3 uint8"),
    (VLARequest("t", [np.zeros((8, 8, 3), np.float32)], "x"), "HxWx3 uint8"),
    (VLARequest("t", [], "x"), "non-empty"),
    (VLARequest("t", [np.zeros((8, 8, 3), np.uint8)] * 4, "x"), "at most 3"),
    (VLARequest("t", [np.zeros((8, 8, 3), np.uint8)], "cube " * 100), "at most 64"),
    (VLARequest("t", [np.zeros((8, 8, 3), np.uint8)], "x", np.array([np.nan])), "NaN"),
])
def test_invalid_requests_are_refused_clearly(backbones: dict[str, Backbone], bad: VLARequest,
                                              message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        backbones["tiny"].prepare(bad)


def test_cameras_and_lengths_bucket_apart(backbones: dict[str, Backbone]) -> None:
    backbone = backbones["tiny"]
    one = backbone.prepare(requests(1, cameras=1, words=3)[0])
    two = backbone.prepare(requests(1, cameras=2, words=3)[0])
    longer = backbone.prepare(requests(1, cameras=1, words=12)[0])
    assert len({one.key, two.key, longer.key}) == 3
    with pytest.raises(ValueError, match="share one bucket"):
        backbone.forward([one, two])


def test_mini_pretrained_has_real_weights_and_groups_exactly(model_root: Path) -> None:
    backbone = Backbone.from_preset("mini-pretrained", model_root)
    assert 25e6 < backbone.num_parameters() < 30e6  # EfficientNet-Lite0 4.7M + MiniLM-L6 22.7M
    assert backbone.trainable_parameters() == [] and not backbone.model.training
    rng = np.random.default_rng(0)
    image = [rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)]
    texts = ["pick up the red cube", "pick up the blue cube", "open the drawer slowly"]
    prepared = [backbone.prepare(VLARequest(f"t{i}", image, text)) for i, text in enumerate(texts)]
    assert len({p.key for p in prepared}) == 1
    grouped = backbone.forward(prepared)
    for p, g in zip(prepared, grouped, strict=True):
        assert torch.equal(g.sequence, backbone.forward([p])[0].sequence)
    # Real language weights: paraphrases sit closer than unrelated instructions.
    text_part = [g.sequence[0, 49:][g.attention_mask[0, 49:]].mean(0) for g in grouped]
    cos = torch.nn.functional.cosine_similarity
    assert cos(text_part[0], text_part[1], dim=0) > cos(text_part[0], text_part[2], dim=0)


def test_preset_sizes_match_their_classes() -> None:
    from backbone.model import preset_parameters

    sizes = {name: preset_parameters(name) for name in ("small", "gpu-1b", "gpu-2b", "gpu-4b")}
    assert 20e6 <= sizes["small"] <= 100e6
    assert 0.8e9 <= sizes["gpu-1b"] <= 1.2e9
    assert sizes["gpu-2b"] == pytest.approx(2.21e9, rel=0.01)  # Qwen2-VL-2B
    assert sizes["gpu-4b"] == pytest.approx(3.75e9, rel=0.01)  # Qwen2.5-VL-3B


@pytest.mark.parametrize("name", ["tiny", "tiny-paligemma", "tiny-smolvlm"])
def test_a_foreign_checkpoint_without_our_spec_loads(model_root: Path, backbones: dict[str, Backbone],
                                                     tmp_path: Path, name: str) -> None:
    """A plain HF directory (no joynexus_backbone.json): family, special tokens and
    resolution come from its own config and tokenizer."""
    import shutil

    from backbone.presets import get_preset, preset_dir

    foreign = tmp_path / name
    shutil.copytree(preset_dir(model_root, get_preset(name)), foreign)
    (foreign / "joynexus_backbone.json").unlink()
    backbone = Backbone.load(foreign)
    ours = backbones[name]
    assert backbone.spec.family == ours.spec.family
    assert backbone.spec.tokens.image == ours.spec.tokens.image
    if name != "tiny":  # SigLIP towers declare their resolution; Qwen-VL takes 224 by default
        assert backbone.spec.image_size == ours.spec.image_size
    request = requests(1, words=4)[0]
    (a,) = backbone.forward([backbone.prepare(request)])
    assert a.sequence.shape[-1] == ours.hidden_size and torch.isfinite(a.sequence).all()


@pytest.mark.parametrize("name", FAMILIES)
def test_remembered_instruction_ids_are_the_tokenizers(backbones: dict[str, Backbone], name: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Token ids are remembered per instruction (a session repeats its instruction every step): the
    same ids as the tokenizer gives, the same prepared row every time, and bounded."""
    backbone = backbones[name]
    request = requests(1, words=4, seed=3)[0]
    first, again = backbone.prepare(request), backbone.prepare(request)
    fresh = backbone.tokenizer(request.instruction, add_special_tokens=False)["input_ids"]
    assert list(backbone._tokenize(request.instruction)) == fresh
    assert torch.equal(first.input_ids, again.input_ids) and torch.equal(first.attention_mask,
                                                                           again.attention_mask)
    monkeypatch.setattr("backbone.model.INSTRUCTION_CACHE_ENTRIES", 2)
    for words in ("a", "b c", "d e f"):
        backbone._tokenize(words)
    assert len(backbone._instruction_ids) <= 2


@pytest.mark.parametrize("cameras", [1, 2])
@pytest.mark.parametrize("name", ["tiny", "tiny-qwen25vl", "tiny-qwen3vl"])
def test_remembered_mrope_positions_are_the_models_own(backbones: dict[str, Backbone], name: str,
                                                       cameras: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen-VL rows carry M-RoPE positions computed row by row and remembered by layout: the same ids
    as the model's get_rope_index gives the whole batch, the same features bit for bit as letting
    the model compute them, and bounded."""
    backbone = backbones[name]
    prepared = [backbone.prepare(r) for r in requests(12, seed=5, cameras=cameras)]
    key = max({p.key for p in prepared}, key=lambda k: sum(p.key == k for p in prepared))
    group = [p for p in prepared if p.key == key]
    assert len({tuple(p.attention_mask.tolist()) for p in group}) > 1  # rows of different lengths
    inputs = backbone.family.collate([p.pixels for p in group], torch.stack([p.input_ids for p in group]),
                                     torch.stack([p.attention_mask for p in group]).long())
    theirs, _ = backbone.model.model.get_rope_index(
        inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
        image_grid_thw=inputs["image_grid_thw"], attention_mask=inputs["attention_mask"])
    assert torch.equal(backbone.family.position_ids(backbone.model, inputs), theirs)
    assert torch.equal(backbone.family.position_ids(backbone.model, inputs), theirs)  # remembered
    remembered = backbone.forward(group)
    monkeypatch.setattr(backbone.family, "position_ids", lambda model, inputs: None)
    for ours, model_own in zip(remembered, backbone.forward(group), strict=True):
        assert torch.equal(ours.sequence, model_own.sequence) and torch.equal(ours.pooled, model_own.pooled)
    monkeypatch.undo()
    monkeypatch.setattr("backbone.families.POSITION_CACHE_ENTRIES", 2)
    backbone.family._positions.clear()
    backbone.forward(group)
    assert len(backbone.family._positions) <= 2
