"""What a tenant sends to the backbone, and how requests are normalised and bucketed.

Normalisation (per request, independent of any other request):

* every camera image is resized to the backbone's square resolution (bilinear);
* the instruction is tokenised and right-padded to the smallest token bucket
  that holds it (``Preset.token_buckets``, e.g. 8/16/32/64); longer ones are
  refused, never silently cut;
* image tokens go first, then the instruction, then padding (masked).

**Compatibility rule.** Two requests may share one backbone forward when they
have the same bucket key: the same number of cameras and the same padded
token length. Rows of one bucket then have identical shapes, so the grouped
forward computes, row for row, what a forward of that request alone computes:
bit-identical on CPU for our presets (tested). Proprioception and task id are
not part of the key: they do not go through the backbone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from infra.errors import JoynexusError

__all__ = ["BucketKey", "InvalidRequest", "Pixels", "Prepared", "VLARequest", "resize_images"]


class InvalidRequest(JoynexusError):
    """A request the backbone cannot take; it fails alone, its group-mates go on."""


@dataclass(frozen=True)
class VLARequest:
    tenant: str
    images: Sequence[np.ndarray]  # one HxWx3 uint8 array per camera, any resolution
    instruction: str
    proprio: np.ndarray | None = None  # float vector, any length
    task_id: int = -1


@dataclass(frozen=True)
class Pixels:
    """One request's images, as the family's vision tower takes them."""

    values: torch.Tensor  # qwen: [patches, patch_dim]; others: [cameras, 3, H, W]
    grid_thw: torch.Tensor | None  # qwen only: [cameras, 3]
    tokens_per_camera: tuple[int, ...]


@dataclass(frozen=True, order=True)
class BucketKey:
    cameras: int
    tokens: int  # padded row length, image tokens included


@dataclass(frozen=True)
class Prepared:
    """A normalised request, ready to be collated with others of its bucket."""

    tenant: str
    key: BucketKey
    pixels: Pixels = field(compare=False)
    input_ids: torch.Tensor = field(compare=False)  # [T]
    attention_mask: torch.Tensor = field(compare=False)  # [T] bool
    proprio: torch.Tensor = field(compare=False)  # [P] float32
    task_id: int = -1


def resize_images(images: Sequence[np.ndarray], size: int, max_cameras: int) -> list[np.ndarray]:
    if not isinstance(images, (list, tuple)) or not images:
        raise InvalidRequest("images must be a non-empty list with one HxWx3 array per camera")
    if len(images) > max_cameras:
        raise InvalidRequest(f"{len(images)} cameras; this backbone takes at most {max_cameras}")
    out = []
    for i, image in enumerate(images):
        image = np.asarray(image)
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
            raise InvalidRequest(f"camera {i}: expected an HxWx3 uint8 image, got "
                                 f"{image.dtype}{list(image.shape)}")
        if image.shape[:2] != (size, size):
            image = np.array(Image.fromarray(image).resize((size, size), Image.Resampling.BILINEAR))
        out.append(np.array(image, copy=True))  # writable: torch refuses read-only buffers
    return out


def proprio_tensor(proprio: np.ndarray | None) -> torch.Tensor:
    if proprio is None:
        return torch.zeros(0, dtype=torch.float32)
    array = np.asarray(proprio, dtype=np.float32).reshape(-1)
    if not np.isfinite(array).all():
        raise InvalidRequest("proprio contains NaN or Inf")
    return torch.from_numpy(array.copy())


def pad_instruction(ids: list[int], buckets: Sequence[int], pad: int) -> tuple[list[int], list[bool]]:
    for size in buckets:
        if len(ids) <= size:
            return ids + [pad] * (size - len(ids)), [True] * len(ids) + [False] * (size - len(ids))
    raise InvalidRequest(f"instruction has {len(ids)} tokens; this backbone takes at most {buckets[-1]}")
