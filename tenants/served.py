"""A tenant's policy served outside the service: the backbone plus the tenant's modules, read-only."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from backbone.feature import VLAFeature
from backbone.inputs import VLARequest
from tenants.heads import ActorOutput
from tenants.slot import TenantSlot

__all__ = ["ServedPolicy"]


class ServedPolicy:
    def __init__(self, backbone, slot: TenantSlot):
        self.backbone = backbone
        self.slot = slot
        slot.policy.eval()

    @property
    def version(self) -> int:
        return self.slot.version

    @torch.no_grad()
    def act(
        self,
        images: Sequence[np.ndarray],
        instruction: str,
        proprio: np.ndarray | None = None,
        deterministic: bool = True,
        seed: int = 0,
    ) -> np.ndarray:
        """The action chunk ``[chunk, action_dim]`` for one observation."""
        request = VLARequest(self.slot.tenant_id, list(images), instruction, proprio)
        (feature,) = self.backbone.forward([self.backbone.prepare(request)])
        out = self.slot.policy.act(feature, torch.Generator().manual_seed(seed), deterministic)
        action = out.action if isinstance(out, ActorOutput) else out
        return action[0].cpu().numpy()

    @torch.no_grad()
    def act_batch(self, images: np.ndarray, instructions: Sequence[str], proprio: np.ndarray) -> np.ndarray:
        """Deterministic action chunks ``[B, chunk, action_dim]`` for a batch of samples
        (``images`` uint8 ``[B, cameras, H, W, 3]``): one backbone forward per bucket."""
        prepared = [
            self.backbone.prepare(
                VLARequest(self.slot.tenant_id, list(images[i]), instructions[i], proprio[i])
            )
            for i in range(len(instructions))
        ]
        rows: dict[int, VLAFeature] = {}
        for key in sorted({p.key for p in prepared}):
            members = [i for i, p in enumerate(prepared) if p.key == key]
            for i, feature in zip(
                members, self.backbone.forward([prepared[i] for i in members]), strict=True
            ):
                rows[i] = feature
        feature = VLAFeature.cat([rows[i] for i in range(len(prepared))])
        out = self.slot.policy.act(feature, torch.Generator(), True)
        action = out.action if isinstance(out, ActorOutput) else out
        return action.cpu().numpy()
