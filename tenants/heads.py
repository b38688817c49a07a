"""Action heads: what turns a tenant's feature vector into actions.

* ``ChunkRegressionHead``: OFT-style parallel decoding of a whole action chunk
  ``[B, chunk, action_dim]`` in one pass, trained with L1 (SFT).
* ``GaussianActorCritic``: a diagonal Gaussian over the action chunk with a
  state-independent log-std, plus a value head, for PPO.

Both compute every row independently (LayerNorm, no batch statistics), so a
sample's output does not depend on which other samples share its batch.
Sampling draws only from a ``torch.Generator`` the caller passes (the slot's).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from tenants.config import HeadConfig

__all__ = ["ActorOutput", "ChunkRegressionHead", "GaussianActorCritic", "mlp"]

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def mlp(in_dim: int, hidden: int, depth: int, out_dim: int) -> nn.Sequential:
    """LayerNorm on the input (backbone features are not unit-scaled), then ``depth`` GELU layers."""
    layers: list[nn.Module] = [nn.LayerNorm(in_dim), nn.Linear(in_dim, hidden), nn.GELU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(hidden, hidden), nn.GELU()]
    layers.append(nn.Linear(hidden, out_dim))
    return nn.Sequential(*layers)


class ChunkRegressionHead(nn.Module):
    def __init__(self, in_dim: int, cfg: HeadConfig):
        super().__init__()
        self.chunk_len, self.action_dim = cfg.chunk_len, cfg.action_dim
        self.net = mlp(in_dim, cfg.hidden, cfg.depth, cfg.chunk_len * cfg.action_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).view(x.shape[0], self.chunk_len, self.action_dim)


@dataclass(frozen=True)
class ActorOutput:
    action: torch.Tensor  # [B, chunk, action_dim]
    log_prob: torch.Tensor  # [B], summed over the chunk and action dims
    entropy: torch.Tensor  # [B]
    value: torch.Tensor  # [B]


class GaussianActorCritic(nn.Module):
    # Bounds keep exp(log_std) from collapsing to 0 (log_prob -> inf) or exploding early in PPO.
    LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0

    def __init__(self, in_dim: int, cfg: HeadConfig):
        super().__init__()
        self.chunk_len, self.action_dim = cfg.chunk_len, cfg.action_dim
        self.actor = mlp(in_dim, cfg.hidden, cfg.depth, cfg.chunk_len * cfg.action_dim)
        self.critic = mlp(in_dim, cfg.hidden, cfg.depth, 1)
        self.log_std = nn.Parameter(torch.full((cfg.chunk_len, cfg.action_dim), cfg.init_log_std))
        # A near-zero initial mean keeps the first rollouts close to the initial std's exploration
        # (the usual PPO practice; CleanRL scales the last actor layer by 0.01).
        with torch.no_grad():
            self.actor[-1].weight.mul_(0.01)
            self.actor[-1].bias.zero_()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Mean ``[B, chunk, A]``, log-std ``[chunk, A]``, value ``[B]``."""
        mean = self.actor(x).view(x.shape[0], self.chunk_len, self.action_dim)
        log_std = self.log_std.clamp(self.LOG_STD_MIN, self.LOG_STD_MAX)
        return mean, log_std, self.critic(x).squeeze(-1)

    @staticmethod
    def log_prob(mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        z = (action - mean) * torch.exp(-log_std)
        return (-0.5 * z.square() - log_std - _HALF_LOG_2PI).sum(dim=(-2, -1))

    @staticmethod
    def entropy(log_std: torch.Tensor, batch: int) -> torch.Tensor:
        return (0.5 + _HALF_LOG_2PI + log_std).sum().expand(batch)

    def evaluate(self, x: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Log-prob of given actions, entropy and value: what the PPO loss needs."""
        mean, log_std, value = self(x)
        return self.log_prob(mean, log_std, action), self.entropy(log_std, x.shape[0]), value

    def act(self, x: torch.Tensor, generator: torch.Generator, deterministic: bool = False) -> ActorOutput:
        mean, log_std, value = self(x)
        # Noise comes from the caller's CPU generator, then moves: the same draws on every device.
        noise = None if deterministic else torch.randn(mean.shape, generator=generator, dtype=mean.dtype)
        return self._sampled(mean, log_std, value, noise)

    def act_each(self, x: torch.Tensor, generators: Sequence[torch.Generator],
                 deterministic: bool = False) -> ActorOutput:
        """``act`` with row i's noise drawn from ``generators[i]``: the draws ``act`` makes for that
        row alone. Rows past the generators are padding and get no noise."""
        mean, log_std, value = self(x)
        noise = None
        if not deterministic:
            row = (1, *mean.shape[1:])
            draws = [torch.randn(row, generator=g, dtype=mean.dtype) for g in generators]
            draws.append(torch.zeros((mean.shape[0] - len(generators), *mean.shape[1:]), dtype=mean.dtype))
            noise = torch.cat(draws)
        return self._sampled(mean, log_std, value, noise)

    def _sampled(self, mean: torch.Tensor, log_std: torch.Tensor, value: torch.Tensor,
                 noise: torch.Tensor | None) -> ActorOutput:
        action = mean if noise is None else mean + noise.to(mean.device) * torch.exp(log_std)
        return ActorOutput(action, self.log_prob(mean, log_std, action),
                           self.entropy(log_std, mean.shape[0]), value)
