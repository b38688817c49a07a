"""A tenant's action modules as one ``nn.Module``: optional policy suffix, then the head.

``build_policy`` creates it from a config and seeds, without touching the
process's global RNG (it runs under ``torch.random.fork_rng``): the same
config and seed give bit-identical modules in any process, in any order.
"""

from __future__ import annotations

import torch
from torch import nn

from backbone.feature import VLAFeature
from tenants.config import TenantConfig
from tenants.heads import ActorOutput, ChunkRegressionHead, GaussianActorCritic
from tenants.losses import Metrics, l1_chunk_loss, ppo_loss
from tenants.suffix import SuffixBlock, add_lora
from tenants.targets import PPOTargets, Targets

__all__ = ["TenantPolicy", "build_policy"]


class TenantPolicy(nn.Module):
    def __init__(self, config: TenantConfig, suffix: SuffixBlock | None,
                 head: ChunkRegressionHead | GaussianActorCritic):
        super().__init__()
        self.config = config
        self.suffix = suffix
        self.head = head

    def encode(self, feature: VLAFeature) -> torch.Tensor:
        """The head's input ``[B, width + proprio_dim]``: suffix output (or pooled) and proprio."""
        if self.suffix is not None:
            x = self.suffix(feature.sequence, feature.attention_mask)
        else:
            x = feature.pooled
        return torch.cat([x, feature.proprio.to(x.dtype)], dim=-1)

    def loss(self, feature: VLAFeature, targets: Targets) -> tuple[torch.Tensor, Metrics]:
        x = self.encode(feature)
        if isinstance(targets, PPOTargets):
            log_prob, entropy, value = self.head.evaluate(x, targets.actions)
            return ppo_loss(log_prob, entropy, value, targets, self.config.ppo)
        # SFT: the regression head's chunk, or the actor's mean (behaviour cloning before RL)
        predicted = self.head(x) if isinstance(self.head, ChunkRegressionHead) else self.head(x)[0]
        return l1_chunk_loss(predicted, targets.actions)

    def act(self, feature: VLAFeature, generator: torch.Generator,
            deterministic: bool = False) -> ActorOutput | torch.Tensor:
        """Actions for rollouts: an ``ActorOutput`` (Gaussian head) or the predicted chunk."""
        x = self.encode(feature)
        if isinstance(self.head, GaussianActorCritic):
            return self.head.act(x, generator, deterministic)
        return self.head(x)


def build_policy(config: TenantConfig, init_seed: int) -> TenantPolicy:
    """Modules on CPU, float32: the suffix base from ``suffix.base_seed``, head and LoRA from ``init_seed``.

    The base seed is shared so every tenant's frozen suffix base is identical (it could be shared); the
    head and adapters are the tenant's own.
    """
    with torch.random.fork_rng(devices=[]):
        suffix = None
        if config.suffix is not None:
            torch.manual_seed(config.suffix.base_seed)
            suffix = SuffixBlock(config.hidden_size, config.suffix)
        torch.manual_seed(init_seed)
        kind = GaussianActorCritic if config.head.kind == "gaussian_actor_critic" else ChunkRegressionHead
        head = kind(config.suffix_width + config.head.proprio_dim, config.head)
        if suffix is not None:
            add_lora(suffix, config.suffix)
    return TenantPolicy(config, suffix, head)
