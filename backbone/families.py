"""How each VLM family wants its inputs: pixels, image tokens, extra masks.

Every family lays a row out as ``[image tokens of each camera] [instruction
tokens] [padding]``. Padding is always on the right and masked, so a token
never attends to padding before it (causal or prefix-LM alike), and a row
means the same thing whatever batch it travels in.

Pixels come from the checkpoint's own image processor. When it is a torchvision
one with no crop or pad (every preset's), its resize, rescale-and-normalise and
(Qwen-VL) patchify are called on the request's cameras stacked, without its
``__call__``, whose per-image checks and conversions cost more than the arithmetic
(``pixels`` of one 56 px camera: 0.65 ms through it, 0.25 ms without, on the CPU VM this
was measured on): the same methods on the same values, so the same bits
(``tests/test_backbone.py`` compares the two).
Any other processor is called as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import Qwen2VLImageProcessor, SiglipImageProcessor
from transformers.image_processing_backends import TorchvisionBackend

from backbone.inputs import Pixels, pad_instruction
from backbone.presets import SpecialTokens
from infra.errors import ConfigError

__all__ = ["FAMILIES", "Family", "Pixels", "direct", "family_for", "normalised"]

POSITION_CACHE_ENTRIES = 4096  # row layouts whose M-RoPE positions are remembered


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
        if direct(self.image_processor):
            values = normalised(self.image_processor, images)
        else:
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

    def position_ids(self, model, inputs: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """Position ids for the collated ``inputs`` (on the CPU), or None: the model's own."""
        return None


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

    def __init__(self, image_processor, tokens, patch_size):
        super().__init__(image_processor, tokens, patch_size)
        # Threads may race to fill an entry, with the same value.
        self._positions: dict[tuple[bytes, bytes, bytes], torch.Tensor] = {}

    @classmethod
    def default_processor(cls, image_size: int, vision: dict):
        patch, merge = vision.get("patch_size", 14), vision.get("spatial_merge_size", 2)
        if image_size % (patch * merge):
            raise ConfigError(f"Qwen-VL image size must be a multiple of {patch * merge}, got {image_size}")
        return Qwen2VLImageProcessor(min_pixels=image_size ** 2, max_pixels=image_size ** 2,
                                     patch_size=patch, merge_size=merge,
                                     temporal_patch_size=vision.get("temporal_patch_size", 2))

    def pixels(self, images):
        processor = self.image_processor
        if direct(processor):
            patch, merge = processor.patch_size, processor.merge_size
            patches, grid_h, grid_w = processor.patchify(
                normalised(processor, images, factor=patch * merge), patch_size=patch, merge_size=merge,
                temporal_patch_size=processor.temporal_patch_size)
            values = patches.reshape(-1, patches.shape[-1])
            grid_thw = torch.tensor([[1, grid_h, grid_w]] * len(images), dtype=torch.long)
        else:
            out = processor(images=list(images), return_tensors="pt")
            values, grid_thw = out["pixel_values"], out["image_grid_thw"]
        counts = tuple(int(n) // processor.merge_size ** 2 for n in grid_thw.prod(-1))
        return Pixels(values, grid_thw, counts)

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

    def position_ids(self, model, inputs):
        """M-RoPE positions ``[3, B, T]``, each row's from the model's own ``get_rope_index`` on that
        row alone, remembered by the row's layout. Left to the model, ``get_rope_index`` walks every
        row of every forward in Python (a fifth of the ``tiny`` preset's forward on the CPU VM, and
        host time on a GPU); a row's positions depend only on its tokens, mask and image grids (the
        model computes them row by row too), and a session's rows repeat one layout."""
        ids, mask, grids = inputs["input_ids"], inputs["attention_mask"], inputs["image_grid_thw"]
        cameras = (ids == self.tokens.vision_start).sum(-1).tolist()
        rows, start = [], 0
        for i, n in enumerate(cameras):
            grid = grids[start:start + n]
            start += n
            key = (ids[i].numpy().tobytes(), mask[i].numpy().tobytes(), grid.numpy().tobytes())
            row = self._positions.get(key)
            if row is None:
                if len(self._positions) >= POSITION_CACHE_ENTRIES:
                    self._positions.clear()
                row, _ = model.model.get_rope_index(
                    ids[i:i + 1], mm_token_type_ids=inputs["mm_token_type_ids"][i:i + 1],
                    image_grid_thw=grid, attention_mask=mask[i:i + 1])
                self._positions[key] = row
            rows.append(row)
        return torch.cat(rows, dim=1)


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


def direct(processor) -> bool:
    """Whether ``normalised`` computes what this processor's ``__call__`` computes."""
    return (isinstance(processor, TorchvisionBackend) and not getattr(processor, "do_center_crop", False)
            and not getattr(processor, "do_pad", False))


def normalised(processor, images: Sequence[np.ndarray], **resize_kwargs) -> torch.Tensor:
    """``[cameras, 3, H, W]`` float32: the processor's resize (if it resizes) and fused
    rescale-and-normalise on the stacked cameras, which ``resize_images`` made HxWx3 uint8 of
    one size (so ``do_convert_rgb`` has nothing to convert)."""
    batch = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()
    if processor.do_resize:
        batch = processor.resize(batch, size=processor.size, resample=processor.resample, **resize_kwargs)
    mean, std = (tuple(v) if isinstance(v, list) else v for v in (processor.image_mean, processor.image_std))
    return processor.rescale_and_normalize(batch, processor.do_rescale, processor.rescale_factor,
                                           processor.do_normalize, mean, std)  # tuples: it is lru_cached


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
