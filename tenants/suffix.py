"""The policy suffix: a small transformer block over the backbone's token features, with LoRA.

The paper's "adapters / policy suffix" option: instead of reading only the
pooled feature, a tenant runs one more transformer block of its own over the
backbone's sequence and trains it through peft LoRA adapters of a chosen rank.
The block's base weights are frozen at a seeded initialisation, so a tenant's
trainable state (and optimizer state) is the rank-r matrices, not the block.

The block output is pooled over real tokens (padding never contributes), so a
request's result does not depend on how much padding its group batch needed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tenants.config import SuffixConfig

__all__ = ["SuffixBlock", "add_lora", "attention", "lora_target_modules"]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax attention of ``q, k, v [B, heads, T, d]`` over the real keys (``mask [B, T]``), written out.

    Not ``F.scaled_dot_product_attention``: its kernel is chosen by flags that are process-wide,
    so pinning this block to the deterministic math kernel (``sdpa_kernel``) switched the
    backbone's fused kernel off in every other thread meanwhile (measured: another thread saw
    it off in 3,078 of 5,163 looks), and the backbone's features then depended on timing. Plain
    products and a softmax are deterministic on every device, backward included, and batch-
    invariant like every other product here. A request with no real token attends uniformly
    (its pooled output is zero anyway) instead of producing NaN.
    """
    scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
    scores = scores.masked_fill(~mask[:, None, None, :], torch.finfo(scores.dtype).min)
    return scores.softmax(dim=-1) @ v


class SuffixBlock(nn.Module):
    """Pre-norm attention + MLP block; returns one pooled vector per request."""

    def __init__(self, hidden_size: int, cfg: SuffixConfig):
        super().__init__()
        width = cfg.width or hidden_size
        self.num_heads = cfg.num_heads
        self.width = width
        # A narrower suffix than the backbone needs a projection; at the backbone's width it would
        # only add parameters.
        self.in_proj = nn.Linear(hidden_size, width) if width != hidden_size else nn.Identity()
        self.norm1 = nn.LayerNorm(width)
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.o_proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, cfg.mlp_ratio * width)
        self.fc2 = nn.Linear(cfg.mlp_ratio * width, width)
        self.norm_out = nn.LayerNorm(width)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.width // self.num_heads).transpose(1, 2)

    def forward(self, sequence: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``sequence [B, T, H]``, ``attention_mask [B, T]`` (True = real token) -> ``[B, width]``."""
        x = self.in_proj(sequence)
        h = self.norm1(x)
        q, k, v = self._heads(self.q_proj(h)), self._heads(self.k_proj(h)), self._heads(self.v_proj(h))
        attn = attention(q, k, v, attention_mask)
        x = x + self.o_proj(attn.transpose(1, 2).reshape(x.shape))
        x = x + self.fc2(F.gelu(self.fc1(self.norm2(x))))
        keep = attention_mask.unsqueeze(-1).to(x.dtype)
        pooled = (x * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1.0)
        return self.norm_out(pooled)


def lora_target_modules(block: SuffixBlock) -> list[str]:
    names = ["q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2"]
    return (["in_proj"] if isinstance(block.in_proj, nn.Linear) else []) + names


def add_lora(block: SuffixBlock, cfg: SuffixConfig) -> SuffixBlock:
    """Injects LoRA adapters into every linear layer of ``block``; freezes everything else.

    No LoRA dropout: a step then consumes no randomness, which keeps replays exact.
    """
    # Imported here: peft pulls in transformers (~10 s on a 2-core machine), which head-only tenants
    # and the processes that only load checkpoints of them should not pay for.
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.alpha, lora_dropout=0.0, bias="none",
                        target_modules=lora_target_modules(block))
    return inject_adapter_in_model(config, block)
