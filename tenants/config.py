"""What a tenant's modules and optimizer look like: plain frozen dataclasses.

A ``TenantConfig`` is everything needed to rebuild a tenant's slot from
scratch; it travels inside every checkpoint's metadata (``to_dict`` /
``from_dict``), so a checkpoint is loadable without outside knowledge.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from infra.errors import ConfigError
from infra.tenant_id import validate_tenant_id

__all__ = [
    "HEAD_KINDS",
    "HeadConfig",
    "OptimConfig",
    "PPOConfig",
    "SuffixConfig",
    "TenantConfig",
    "validate_tenant_id",
]

HEAD_KINDS = ("chunk_regression", "gaussian_actor_critic")

# Tenant ids (infra.tenant_id) also name policy-store folders; the rule keeps them safe as paths.


def _positive(owner: str, **values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ConfigError(f"{owner}.{name} must be > 0, got {value!r}")


@dataclass(frozen=True)
class HeadConfig:
    """The action head: what it predicts and how wide it is."""

    kind: Literal["chunk_regression", "gaussian_actor_critic"] = "chunk_regression"
    action_dim: int = 7
    chunk_len: int = 8  # actions predicted per call (OFT's parallel-decoded chunk)
    proprio_dim: int = 0  # width of VLAFeature.proprio this tenant expects (0: none)
    hidden: int = 256
    depth: int = 2  # hidden layers of each MLP
    init_log_std: float = -0.5  # gaussian_actor_critic only

    def __post_init__(self) -> None:
        if self.kind not in HEAD_KINDS:
            raise ConfigError(f"HeadConfig.kind must be one of {HEAD_KINDS}, got {self.kind!r}")
        _positive("HeadConfig", action_dim=self.action_dim, chunk_len=self.chunk_len,
                  hidden=self.hidden, depth=self.depth)
        if self.proprio_dim < 0:
            raise ConfigError(f"HeadConfig.proprio_dim must be >= 0, got {self.proprio_dim}")


@dataclass(frozen=True)
class SuffixConfig:
    """A tenant's policy suffix: one transformer block over the backbone's tokens, trained through LoRA.

    The block's own weights are frozen at a seeded initialisation (``base_seed``,
    the same for every tenant unless changed); only the LoRA adapters train.
    """

    width: int | None = None  # None: the backbone's hidden size (no input projection)
    num_heads: int = 4
    mlp_ratio: int = 4
    lora_rank: int = 16
    lora_alpha: float | None = None  # None: 2 * rank
    base_seed: int = 0

    def __post_init__(self) -> None:
        _positive("SuffixConfig", num_heads=self.num_heads, mlp_ratio=self.mlp_ratio,
                  lora_rank=self.lora_rank)
        if self.width is not None:
            _positive("SuffixConfig", width=self.width)
            if self.width % self.num_heads:
                raise ConfigError(f"SuffixConfig.width {self.width} is not divisible by "
                                  f"num_heads {self.num_heads}")

    @property
    def alpha(self) -> float:
        return 2.0 * self.lora_rank if self.lora_alpha is None else self.lora_alpha


@dataclass(frozen=True)
class OptimConfig:
    """AdamW, linear warmup then cosine decay to ``min_lr_ratio * lr``, gradient-norm clipping."""

    lr: float = 1e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0
    decay_steps: int | None = None  # steps of cosine decay after warmup; None: constant after warmup
    min_lr_ratio: float = 0.1
    grad_clip: float | None = 1.0  # max global L2 norm; None: no clipping

    def __post_init__(self) -> None:
        _positive("OptimConfig", lr=self.lr, eps=self.eps)
        if self.warmup_steps < 0 or (self.decay_steps is not None and self.decay_steps <= 0):
            raise ConfigError("OptimConfig: warmup_steps must be >= 0 and decay_steps > 0 or None")
        if self.grad_clip is not None:
            _positive("OptimConfig", grad_clip=self.grad_clip)
        # JSON gives lists back; the optimizer and equality want the tuple
        object.__setattr__(self, "betas", tuple(self.betas))


@dataclass(frozen=True)
class PPOConfig:
    """Clipped-surrogate PPO: loss = policy + value_coef * value - entropy_coef * entropy."""

    clip_eps: float = 0.2
    value_coef: float = 0.5
    entropy_coef: float = 0.0


@dataclass(frozen=True)
class TenantConfig:
    tenant_id: str
    hidden_size: int  # H of the backbone's VLAFeature
    head: HeadConfig = field(default_factory=HeadConfig)
    suffix: SuffixConfig | None = None  # None: the head reads VLAFeature.pooled
    optim: OptimConfig = field(default_factory=OptimConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    seed: int = 0  # seeds the slot's generator, from which module init and sampling draw

    def __post_init__(self) -> None:
        validate_tenant_id(self.tenant_id)
        _positive("TenantConfig", hidden_size=self.hidden_size)
        width = self.suffix_width
        if self.suffix is not None and width % self.suffix.num_heads:
            raise ConfigError(f"suffix width {width} is not divisible by num_heads {self.suffix.num_heads}")

    @property
    def suffix_width(self) -> int:
        if self.suffix is None or self.suffix.width is None:
            return self.hidden_size
        return self.suffix.width

    def to_dict(self) -> dict[str, Any]:
        """JSON-native (tuples become lists), so a dict read back from a checkpoint compares equal."""
        return json.loads(json.dumps(asdict(self)))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TenantConfig:
        data = dict(data)
        try:
            nested = {"head": HeadConfig, "optim": OptimConfig, "ppo": PPOConfig, "suffix": SuffixConfig}
            for name, kind in nested.items():
                if data.get(name) is not None:
                    data[name] = kind(**data[name])
            return cls(**data)
        except TypeError as exc:  # unknown or missing fields
            raise ConfigError(f"not a TenantConfig: {exc}") from exc
