"""The training objectives: L1 on action chunks (SFT) and clipped-surrogate PPO.

Each returns the scalar loss and detached metric tensors; nothing here draws
random numbers or reads batch statistics beyond the means of the loss itself.
"""

from __future__ import annotations

import torch

from tenants.config import PPOConfig
from tenants.targets import PPOTargets

__all__ = ["l1_chunk_loss", "ppo_loss"]

Metrics = dict[str, torch.Tensor]


def l1_chunk_loss(predicted: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, Metrics]:
    """Mean absolute error over ``[B, chunk, action_dim]`` (OpenVLA-OFT's objective)."""
    loss = (predicted - actions).abs().mean()
    return loss, {"l1": loss.detach()}


def ppo_loss(log_prob: torch.Tensor, entropy: torch.Tensor, value: torch.Tensor,
             targets: PPOTargets, cfg: PPOConfig) -> tuple[torch.Tensor, Metrics]:
    log_ratio = log_prob - targets.old_log_probs
    ratio = torch.exp(log_ratio)
    unclipped = ratio * targets.advantages
    clipped = ratio.clamp(1.0 - cfg.clip_eps, 1.0 + cfg.clip_eps) * targets.advantages
    policy_loss = -torch.minimum(unclipped, clipped).mean()
    value_loss = 0.5 * (targets.returns - value).square().mean()
    mean_entropy = entropy.mean()
    loss = policy_loss + cfg.value_coef * value_loss - cfg.entropy_coef * mean_entropy
    with torch.no_grad():
        metrics = {
            "policy_loss": policy_loss.detach(),
            "value_loss": value_loss.detach(),
            "entropy": mean_entropy.detach(),
            # k3 estimator of KL(old || new) (Schulman): unbiased and never negative
            "approx_kl": ((ratio - 1.0) - log_ratio).mean(),
            "clip_fraction": ((ratio - 1.0).abs() > cfg.clip_eps).float().mean(),
        }
    return loss, metrics
