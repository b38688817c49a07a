"""Named backbone presets: real transformers VLM architectures with random weights.

A preset is a plain dataclass; ``hf_config`` turns it into the family's
transformers config. Presets are built once (seeded), saved with
``save_pretrained`` and then loaded like any local checkpoint, so presets and
real checkpoints take the same code path. Sizes (parameters, measured with
``joynexus backbone presets``):

* ``tiny``            Qwen2-VL, ~0.2M: unit tests
* ``tiny-paligemma``  PaliGemma (SigLIP + Gemma), ~0.13M: the second family in tests
* ``tiny-llava``      LLaVA-style (SigLIP + Qwen2), ~0.2M
* ``tiny-qwen25vl``, ``tiny-qwen3vl``, ``tiny-smolvlm``  the other supported families, tiny
* ``small``           Qwen2-VL, ~40M: the CPU demo
* ``gpu-1b``, ``gpu-2b``, ``gpu-4b``  shaped like StarVLA's Qwen-VL backbones
  (``gpu-2b`` is Qwen2-VL-2B's config, 2.21B; ``gpu-4b`` Qwen2.5-VL-3B's, 3.75B);
  built on the meta device for sizing anywhere, materialised only on a GPU.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from transformers import (
    Idefics3Config,
    LlavaConfig,
    PaliGemmaConfig,
    PretrainedConfig,
    Qwen2_5_VLConfig,
    Qwen2VLConfig,
    Qwen3VLConfig,
)

from infra.errors import ConfigError

__all__ = ["PRESETS", "Preset", "SpecialTokens", "hf_config", "get_preset"]


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of the multimodal special tokens, placed at the top of the vocabulary."""

    pad: int = 0
    bos: int = 1
    eos: int = 2
    image: int = 3
    vision_start: int = 4
    vision_end: int = 5

    @staticmethod
    def names() -> tuple[str, ...]:
        return ("<pad>", "<bos>", "<eos>", "<image>", "<vision_start>", "<vision_end>")


@dataclass(frozen=True)
class Preset:
    name: str
    family: str  # qwen2_vl | qwen2_5_vl | paligemma | llava
    image_size: int  # square input resolution after normalisation
    vocab_size: int
    tokenizer_vocab: int  # BPE vocabulary trained locally (<= vocab_size)
    text: dict[str, Any]
    vision: dict[str, Any]
    seed: int = 0
    max_cameras: int = 3
    token_buckets: tuple[int, ...] = (8, 16, 32, 64)
    tie_embeddings: bool = False  # the real 1-4B Qwen-VL models tie lm_head to the embeddings
    # The dtype the random weights are drawn and saved in. The GPU presets are bf16, as they run:
    # drawn in fp32, a 3.75B model is 15 GB to initialise and write before its first use.
    weights_dtype: str = "float32"
    doc: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _qwen_text(hidden: int, layers: int, heads: int, kv: int, inter: int, vocab: int) -> dict:
    head_dim = hidden // heads
    # M-RoPE splits head_dim/2 rotary frequencies over (time, height, width) as Qwen does: 1/4, 3/8, 3/8.
    half = head_dim // 2
    section = [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2]
    return dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0,
                                 "mrope_section": section},
                pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _siglip(hidden: int, layers: int, heads: int, inter: int, image: int, patch: int = 14) -> dict:
    return dict(model_type="siglip_vision_model", hidden_size=hidden, intermediate_size=inter,
                num_hidden_layers=layers, num_attention_heads=heads, image_size=image, patch_size=patch,
                vision_use_head=False)


PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("tiny", "qwen2_vl", 56, 512, 512,
           _qwen_text(64, 2, 4, 2, 128, 512),
           dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                spatial_merge_size=2, temporal_patch_size=2),
           doc="Qwen2-VL, < 1M parameters, for tests"),
    Preset("tiny-paligemma", "paligemma", 56, 512, 512,
           dict(model_type="gemma", vocab_size=512, hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                max_position_embeddings=4096, pad_token_id=0, bos_token_id=1, eos_token_id=2),
           _siglip(32, 1, 2, 64, 56), doc="PaliGemma (SigLIP + Gemma), < 1M parameters"),
    Preset("tiny-llava", "llava", 56, 512, 512,
           dict(model_type="qwen2", vocab_size=512, hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=4096, pad_token_id=0, bos_token_id=1, eos_token_id=2),
           _siglip(32, 1, 2, 64, 56), doc="LLaVA-style SigLIP + Qwen2, < 1M parameters"),
    Preset("tiny-qwen25vl", "qwen2_5_vl", 56, 512, 512,
           _qwen_text(64, 2, 4, 2, 128, 512),
           dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                fullatt_block_indexes=[1]),
           doc="Qwen2.5-VL (windowed vision attention), < 1M parameters"),
    Preset("tiny-qwen3vl", "qwen3_vl", 64, 512, 512,
           {**_qwen_text(64, 2, 4, 2, 128, 512), "head_dim": 16,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5_000_000.0,
                                "mrope_section": [2, 3, 3], "mrope_interleaved": True}},
           dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
                deepstack_visual_indexes=[1]),
           doc="Qwen3-VL (DeepStack), < 1M parameters; image size a multiple of 32"),
    Preset("tiny-smolvlm", "idefics3", 64, 512, 512,
           dict(model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=4096, pad_token_id=0, bos_token_id=1, eos_token_id=2),
           dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                image_size=64, patch_size=16),
           doc="SmolVLM / Idefics3 (SigLIP + pixel shuffle + Llama), < 1M parameters"),
    Preset("small", "qwen2_vl", 112, 8192, 4096,
           _qwen_text(512, 8, 8, 2, 1536, 8192),
           dict(depth=4, embed_dim=256, hidden_size=512, num_heads=4, mlp_ratio=4, patch_size=14,
                spatial_merge_size=2, temporal_patch_size=2),
           doc="Qwen2-VL, ~40M parameters, the CPU demo"),
    Preset("gpu-1b", "qwen2_vl", 224, 151936, 8192,
           _qwen_text(1024, 24, 16, 2, 5504, 151936),
           dict(depth=24, embed_dim=1024, hidden_size=1024, num_heads=16, mlp_ratio=4, patch_size=14,
                spatial_merge_size=2, temporal_patch_size=2),
           tie_embeddings=True, weights_dtype="bfloat16",
           doc="Qwen2-VL family scaled to ~1B"),
    Preset("gpu-2b", "qwen2_vl", 224, 151936, 8192,
           _qwen_text(1536, 28, 12, 2, 8960, 151936),
           dict(depth=32, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4, patch_size=14,
                spatial_merge_size=2, temporal_patch_size=2),
           tie_embeddings=True, weights_dtype="bfloat16",
           doc="Qwen2-VL-2B's configuration (2.2B)"),
    Preset("gpu-4b", "qwen2_5_vl", 224, 151936, 8192,
           _qwen_text(2048, 36, 16, 2, 11008, 151936),
           dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                fullatt_block_indexes=[7, 15, 23, 31]),
           tie_embeddings=True, weights_dtype="bfloat16",
           doc="Qwen2.5-VL-3B's configuration (3.75B), the 4B class"),
]}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown backbone preset {name!r}; choose from {sorted(PRESETS)} "
                          "or give a checkpoint directory") from None


def hf_config(preset: Preset, tokens: SpecialTokens = SpecialTokens()) -> PretrainedConfig:
    """The transformers config of a preset (random weights are built from it)."""
    if preset.family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        cls = {"qwen2_vl": Qwen2VLConfig, "qwen2_5_vl": Qwen2_5_VLConfig,
               "qwen3_vl": Qwen3VLConfig}[preset.family]
        return cls(text_config=preset.text, vision_config=preset.vision, image_token_id=tokens.image,
                   video_token_id=tokens.image, vision_start_token_id=tokens.vision_start,
                   vision_end_token_id=tokens.vision_end, tie_word_embeddings=preset.tie_embeddings)
    if preset.family == "paligemma":
        config = PaliGemmaConfig(text_config=preset.text, vision_config=preset.vision,
                                 image_token_id=tokens.image, projection_dim=preset.text["hidden_size"])
        config.text_config.vocab_size = preset.vocab_size  # PaliGemmaConfig resets it
        return config
    if preset.family == "llava":
        patches = (preset.image_size // preset.vision["patch_size"]) ** 2
        return LlavaConfig(text_config=preset.text, vision_config=preset.vision,
                           image_token_index=tokens.image, image_seq_length=patches,
                           vision_feature_select_strategy="full", vision_feature_layer=-1)
    if preset.family == "idefics3":
        return Idefics3Config(text_config=preset.text, vision_config=preset.vision,
                              image_token_id=tokens.image, scale_factor=2, pad_token_id=tokens.pad)
    raise ConfigError(f"preset {preset.name}: unknown family {preset.family!r}")


def preset_dir(root: str | Path, preset: Preset) -> Path:
    """Where a preset is built: the name plus a digest of its definition, so a changed
    preset (or a different tokens layout) is built afresh instead of loading a stale one."""
    definition = json.dumps([asdict(preset), asdict(SpecialTokens())], sort_keys=True, default=str)
    return Path(root) / f"{preset.name}-{hashlib.sha256(definition.encode()).hexdigest()[:10]}"
