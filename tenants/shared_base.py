"""One copy per process (and device) of the policy suffix's frozen base, shared by every tenant's slot.

A suffix block's base weights are a pure function of (backbone hidden size,
suffix width, heads, MLP ratio, ``base_seed``): seeded, frozen, identical for
every tenant with that configuration. At the 2B preset they are 108 of a
suffix tenant's 122 MiB. ``shared_suffix_base(config, device, dtype)``
returns the block's parameters for that key from a process-wide registry,
built once from the seed (the same construction as an unshared block, so the
values are bit-identical to it) and kept as long as some policy holds them
(weak references: the last tenant to leave frees them).

Guarantees: the tensors are frozen (``requires_grad=False``) and nothing in
joynexus writes to them; a checkpoint whose base values differ from the shared
ones is refused (``tenants/policy.py`` checks on load) instead of overwriting
every tenant's base. Thread-safe: slots are built in worker threads.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from infra.reproducible import seeded
from tenants.config import SuffixConfig

__all__ = ["SharedSuffixBase", "base_key", "live_bases", "shared_suffix_base"]

_lock = threading.Lock()
_registry: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def base_key(hidden_size: int, cfg: SuffixConfig) -> tuple:
    """What determines the base values (LoRA rank and alpha do not)."""
    return (hidden_size, cfg.width or hidden_size, cfg.num_heads, cfg.mlp_ratio, cfg.base_seed)


@dataclass(eq=False)
class SharedSuffixBase:
    """The frozen parameters of one suffix configuration on one device, by the block's own names."""

    key: tuple
    device: torch.device
    dtype: torch.dtype
    params: dict[str, nn.Parameter]

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params.values())


def _build(hidden_size: int, cfg: SuffixConfig, device: torch.device, dtype: torch.dtype) -> dict:
    from tenants.suffix import SuffixBlock  # here: suffix.py imports this module

    with seeded(cfg.base_seed):
        block = SuffixBlock(hidden_size, cfg)  # on the CPU in float32, exactly as an unshared block
    return {name: nn.Parameter(p.detach().to(device, dtype), requires_grad=False)
            for name, p in block.named_parameters()}


def shared_suffix_base(hidden_size: int, cfg: SuffixConfig, device: torch.device | str = "cpu",
                       dtype: torch.dtype = torch.float32) -> SharedSuffixBase:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = base_key(hidden_size, cfg)
    with _lock:
        base = _registry.get((key, device, dtype))
        if base is None:
            base = SharedSuffixBase(key, device, dtype, _build(hidden_size, cfg, device, dtype))
            _registry[(key, device, dtype)] = base
        return base


def live_bases() -> list[SharedSuffixBase]:
    """The bases this process holds now (for memory reports and tests)."""
    with _lock:
        return list(_registry.values())
