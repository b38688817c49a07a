"""How each VLM family wants its inputs: pixels, image tokens, extra masks.

Every family lays a row out as ``[image tokens of each camera] [instruction
tokens] [padding]``. Padding is always on the right and masked, so a token
never attends to padding before it (causal or prefix-LM alike), and a row
means the same thing whatever batch it travels in.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import Qwen2VLImageProcessor, SiglipImageProcessor

from backbone.inputs import Pixels, pad_instruction
from backbone.presets import SpecialTokens
from infra.errors import ConfigError

__all__ = ["FAMILIES", "Family", "Pixels", "family_for"]


class Family:
    """Base: SigLIP-style towers (PaliGemma, LLaVA): one fixed-size image, N patch tokens."""

    name = "siglip"

    def __init__(self, image_processor, tokens: SpecialTokens, patch_size: int):
        self.image_processor = image_processor
        self.tokens = tokens
        self.patch_size = patch_size

    @classmethod
    def default_processor(cls, image_size: int, vision: dict):
        return SiglipImageProcessor(size={"height": image_size, "width": image_size},
                                    do_resize=False)

    def pixels(self, images: Sequence[np.ndarray]) -> Pixels:
        values = self.image_processor(images=list(images), return_tensors="pt")["pixel_values"]
        per_camera = (values.shape[-1] // self.patch_size) * (values.shape[-2] // self.patch_size)
        return Pixels(values, None, (per_camera,) * len(images))

    def row(self, pixels: Pixels, instruction_ids: Sequence[int]) -> list[int]:
        return [self.tokens.image] * sum(pixels.tokens_per_camera) + [self.tokens.bos, *instruction_ids]

    def layout(self, pixels: Pixels, ids: list[int], buckets: Sequence[int]) -> tuple[list[int], list[bool]]:
        """The full row (image tokens, instruction, right padding) and its mask."""
        padded, mask = pad_instruction(ids, buckets, self.tokens.pad)
        row = self.row(pixels, padded)
        return row, [True] * (len(row) - len(padded)) + mask

    def hidden_states(self, model, kwargs: dict) -> torch.Tensor:
        return model.model(**kwargs).last_hidden_state

    def collate(self, pixels: Sequence[Pixels], input_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        return dict(input_ids=input_ids, attention_mask=attention_mask,
                    pixel_values=torch.cat([p.values for p in pixels]))


class PaliGemma(Family):
    name = "paligemma"

    def collate(self, pixels, input_ids, attention_mask):
        # token_type_ids = 0 everywhere: the whole row is prefix (image + instruction),
        # attended bidirectionally; there is no suffix to generate.
        return {**super().collate(pixels, input_ids, attention_mask),
                "token_type_ids": torch.zeros_like(input_ids)}


class Llava(Family):
    name = "llava"

    def row(self, pixels, instruction_ids):
        return [self.tokens.image] * sum(pixels.tokens_per_camera) + list(instruction_ids)


class Qwen2VL(Family):
    """Qwen2-VL / Qwen2.5-VL: flattened patches, a (t, h, w) grid per image, M-RoPE."""

    name = "qwen2_vl"

    @classmethod
    def default_processor(cls, image_size: int, vision: dict):
        patch, merge = vision.get("patch_size", 14), vision.get("spatial_merge_size", 2)
        if image_size % (patch * merge):
            raise ConfigError(f"Qwen-VL image size must be a multiple of {patch * merge}, got {image_size}")
        return Qwen2VLImageProcessor(min_pixels=image_size ** 2, max_pixels=image_size ** 2,
                                     patch_size=patch, merge_size=merge,
                                     temporal_patch_size=vision.get("temporal_patch_size", 2))

    def pixels(self, images):
        out = self.image_processor(images=list(images), return_tensors="pt")
        merge = self.image_processor.merge_size ** 2
        counts = tuple(int(n) // merge for n in out["image_grid_thw"].prod(-1))
        return Pixels(out["pixel_values"], out["image_grid_thw"], counts)

    def row(self, pixels, instruction_ids):
        t = self.tokens
        row: list[int] = []
        for n in pixels.tokens_per_camera:
            row += [t.vision_start, *([t.image] * n), t.vision_end]
        return row + list(instruction_ids)

    def collate(self, pixels, input_ids, attention_mask):
        return dict(input_ids=input_ids, attention_mask=attention_mask,
                    pixel_values=torch.cat([p.values for p in pixels]),
                    image_grid_thw=torch.cat([p.grid_thw for p in pixels]),
                    mm_token_type_ids=(input_ids == self.tokens.image).long())


class Idefics3(Family):
    """SmolVLM / Idefics3: SigLIP tiles, pixel shuffle (scale factor s), image tokens = patches / s^2.

    Image splitting is off: each camera is one tile at the backbone's resolution."""

    name = "idefics3"

    def __init__(self, image_processor, tokens, patch_size, scale_factor: int = 2):
        super().__init__(image_processor, tokens, patch_size)
        self.scale_factor = scale_factor

    @classmethod
    def default_processor(cls, image_size: int, vision: dict):
        return SiglipImageProcessor(size={"height": image_size, "width": image_size}, do_resize=False,
                                    image_mean=[0.5] * 3, image_std=[0.5] * 3)

    def pixels(self, images):
        pixels = super().pixels(images)
        per_camera = pixels.tokens_per_camera[0] // self.scale_factor ** 2
        return Pixels(pixels.values, None, (per_camera,) * len(images))

    def row(self, pixels, instruction_ids):
        return [self.tokens.image] * sum(pixels.tokens_per_camera) + [self.tokens.bos, *instruction_ids]

    def collate(self, pixels, input_ids, attention_mask):
        values = torch.stack([p.values for p in pixels])  # [B, cameras, 3, H, W]
        return dict(input_ids=input_ids, attention_mask=attention_mask, pixel_values=values,
                    pixel_attention_mask=torch.ones(values.shape[:2] + values.shape[-2:], dtype=torch.bool))


FAMILIES: dict[str, type[Family]] = {
    "qwen2_vl": Qwen2VL, "qwen2_5_vl": Qwen2VL, "qwen3_vl": Qwen2VL,
    "paligemma": PaliGemma, "llava": Llava, "idefics3": Idefics3, "smolvlm": Idefics3,
}


def family_for(model_type: str) -> type[Family]:
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise ConfigError(f"unsupported backbone family {model_type!r}; supported: {sorted(FAMILIES)}") \
            from None
