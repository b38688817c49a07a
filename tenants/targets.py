"""What a tenant trains on, next to its VLAFeature, and the checks that it fits the tenant's config.

``SFTTargets`` are demonstration action chunks; ``PPOTargets`` a PPO minibatch
whose advantages and returns the rollout role computed (GAE, normalisation).
``check_batch`` refuses a batch that does not fit before anything is changed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from backbone.feature import VLAFeature
from tenants.config import TenantConfig
from tenants.errors import InvalidBatch

__all__ = ["PPOTargets", "SFTTargets", "Targets", "check_batch", "check_feature"]


@dataclass(frozen=True)
class SFTTargets:
    actions: torch.Tensor  # [B, chunk, action_dim]

    def to(self, device: torch.device | str) -> SFTTargets:
        return SFTTargets(self.actions.detach().to(device))


@dataclass(frozen=True)
class PPOTargets:
    actions: torch.Tensor  # [B, chunk, action_dim], as sampled by the rollout policy
    old_log_probs: torch.Tensor  # [B] log-prob of `actions` under the rollout policy
    advantages: torch.Tensor  # [B]
    returns: torch.Tensor  # [B] value targets

    def to(self, device: torch.device | str) -> PPOTargets:
        return PPOTargets(*(getattr(self, f.name).detach().to(device) for f in fields(self)))


Targets = SFTTargets | PPOTargets


def _shape(name: str, tensor: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != expected:
        raise InvalidBatch(f"{name} has shape {tuple(tensor.shape)}, expected {expected}")
    if not tensor.is_floating_point():
        raise InvalidBatch(f"{name} must be floating point, got {tensor.dtype}")


def check_feature(config: TenantConfig, feature: VLAFeature) -> None:
    """Raises InvalidBatch naming the first thing in ``feature`` that does not fit ``config``."""
    if feature.batch_size == 0:
        raise InvalidBatch("empty batch")
    if feature.hidden_size != config.hidden_size:
        raise InvalidBatch(f"features have hidden size {feature.hidden_size}, "
                           f"tenant {config.tenant_id} expects {config.hidden_size}")
    if feature.proprio.shape[-1] != config.head.proprio_dim:
        raise InvalidBatch(f"proprio has width {feature.proprio.shape[-1]}, "
                           f"expected {config.head.proprio_dim}")
    if config.suffix is not None and not bool(feature.attention_mask.any(dim=1).all()):
        raise InvalidBatch("a request has no real token in attention_mask")


def check_batch(config: TenantConfig, feature: VLAFeature, targets: Targets) -> None:
    """Raises InvalidBatch naming the first thing that does not fit ``config``."""
    check_feature(config, feature)
    if not isinstance(targets, SFTTargets | PPOTargets):
        raise InvalidBatch(f"unknown targets type {type(targets).__name__}")
    b, head = feature.batch_size, config.head
    _shape("actions", targets.actions, (b, head.chunk_len, head.action_dim))
    if isinstance(targets, PPOTargets):
        if head.kind != "gaussian_actor_critic":
            raise InvalidBatch(f"PPO targets need a gaussian_actor_critic head, tenant has {head.kind}")
        for name in ("old_log_probs", "advantages", "returns"):
            _shape(name, getattr(targets, name), (b,))
