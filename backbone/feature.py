"""VLAFeature: what the shared backbone hands to each tenant's modules.

The shared prefix (backbone hidden states over image + instruction tokens) plus
the tenant-specific remainder the heads consume (proprioception, task id).
Batch-first; one row per request. ``split`` and ``cat`` move between a group's
batch and per-request features without copying more than slicing does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["VLAFeature"]


@dataclass(frozen=True)
class VLAFeature:
    sequence: torch.Tensor  # [B, T, H] last hidden states of the backbone
    attention_mask: torch.Tensor  # [B, T] bool, True where a token is real (not padding)
    pooled: torch.Tensor  # [B, H] mean of `sequence` over real tokens
    proprio: torch.Tensor  # [B, P] float32 robot state (P may be 0)
    task_id: torch.Tensor  # [B] int64, -1 when the request has none

    def __post_init__(self) -> None:
        b = self.sequence.shape[0]
        for name in ("attention_mask", "pooled", "proprio", "task_id"):
            if getattr(self, name).shape[0] != b:
                raise ValueError(f"VLAFeature.{name} has batch {getattr(self, name).shape[0]}, "
                                 f"sequence has {b}")

    @property
    def batch_size(self) -> int:
        return self.sequence.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.sequence.shape[-1]

    def split(self, sizes: Sequence[int]) -> list[VLAFeature]:
        """Per-request (or per-tenant) slices of a group's batch, in order."""
        parts = [torch.split(t, list(sizes)) for t in
                 (self.sequence, self.attention_mask, self.pooled, self.proprio, self.task_id)]
        return [VLAFeature(*fields) for fields in zip(*parts, strict=True)]

    @staticmethod
    def cat(features: Sequence[VLAFeature]) -> VLAFeature:
        """One batch from features of equal sequence length and hidden size."""
        return VLAFeature(*(torch.cat([getattr(f, n) for f in features]) for n in
                            ("sequence", "attention_mask", "pooled", "proprio", "task_id")))

    def to(self, device: torch.device | str) -> VLAFeature:
        """The same rows on ``device`` (no copy where they already are)."""
        return VLAFeature(*(t.to(device) for t in
                            (self.sequence, self.attention_mask, self.pooled, self.proprio,
                             self.task_id)))

    def detach(self) -> VLAFeature:
        return VLAFeature(*(t.detach() for t in
                            (self.sequence, self.attention_mask, self.pooled, self.proprio,
                             self.task_id)))
