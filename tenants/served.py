"""A tenant's policy served outside the service: the backbone plus the tenant's modules, read-only.

It acts as the inference role does (``TenantPolicy.act_each``, at one fixed shape), so its heads
compute what the service's do, not the other kernel path of a one-row product."""

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
        (out,) = self.slot.policy.act_each([feature], [torch.Generator().manual_seed(seed)], deterministic)
        action = out.action if isinstance(out, ActorOutput) else out
        return action[0].cpu().numpy()

    def prepare_batch(self, images: np.ndarray, instructions: Sequence[str], proprio: np.ndarray) -> list:
        """Backbone inputs for a batch of samples (``images`` uint8 ``[B, cameras, H, W, 3]``)."""
        return [
            self.backbone.prepare(VLARequest(self.slot.tenant_id, list(imgs), text, state))
            for imgs, text, state in zip(images, instructions, proprio, strict=True)
        ]

    @torch.no_grad()
    def act_features(self, features: Sequence[VLAFeature]) -> np.ndarray:
        """Deterministic action chunks ``[B, chunk, action_dim]`` from per-sample features."""
        outs = self.slot.policy.act_each(features, [torch.Generator() for _ in features], True)
        return torch.cat([o.action if isinstance(o, ActorOutput) else o for o in outs]).cpu().numpy()
