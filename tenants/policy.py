"""A tenant's action modules as one ``nn.Module``: optional policy suffix, then the head.

``build_policy`` creates it from a config and seeds, without touching the
process's global RNG (it runs under ``torch.random.fork_rng``): the same
config and seed give bit-identical modules in any process, in any order.

A suffix's frozen base is not the tenant's own: its parameters are the
process-wide copy of ``tenants/shared_base.py`` (one per configuration and
device), registered in the tenant's module tree under the usual names, so
``state_dict`` and checkpoints are unchanged. Moving a policy (``.to``,
``mount``/``unmount``) moves its own parameters and points the shared ones at
the copy for the new device; it never moves the copy other tenants use.
Loading a state whose base values differ from the shared copy is refused.
"""

from __future__ import annotations

import torch
from torch import nn

from backbone.feature import VLAFeature
from infra.errors import ConfigError
from tenants.config import TenantConfig
from tenants.heads import ActorOutput, ChunkRegressionHead, GaussianActorCritic
from tenants.losses import Metrics, l1_chunk_loss, ppo_loss
from tenants.shared_base import SharedSuffixBase, shared_suffix_base
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
        # (module, parameter name in it, name in the shared base): the suffix's frozen base, not owned
        self._shared: list[tuple[nn.Module, str, str]] = []
        self._base: SharedSuffixBase | None = None  # holds the shared copy alive while this policy uses it
        self.register_load_state_dict_pre_hook(_refuse_other_base)

    def attach_shared_base(self, base: SharedSuffixBase, places: list[tuple[nn.Module, str, str]]) -> None:
        self._base, self._shared = base, places

    def shared_parameter_names(self) -> list[str]:
        """Full names (as in ``state_dict``) of the parameters that are the process's shared copy."""
        shared = {id(m._parameters[leaf]) for m, leaf, _ in self._shared}
        return [n for n, p in self.named_parameters(remove_duplicate=False) if id(p) in shared]

    def _apply(self, fn, recurse=True):
        # Module.to() would move the shared tensors in place (under every tenant); hide them, move
        # what is this tenant's own, then point the shared places at the copy for the new device/dtype.
        if not self._shared:
            return super()._apply(fn, recurse)
        for module, leaf, _ in self._shared:
            module._parameters[leaf] = None
        try:
            result = super()._apply(fn, recurse)
        finally:
            ref = next(self.head.parameters())
            cfg = self.config
            self._base = shared_suffix_base(cfg.hidden_size, cfg.suffix, ref.device, ref.dtype)
            for module, leaf, name in self._shared:
                module._parameters[leaf] = self._base.params[name]
        return result

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

    The base seed is shared so every tenant's frozen suffix base is identical, and it IS shared: the
    block is built on the meta device and its parameters are the process's copy (``shared_base``),
    whose values are those an own block would get. The head and adapters are the tenant's own.
    """
    with torch.random.fork_rng(devices=[]):
        suffix, base, places = None, None, []
        if config.suffix is not None:
            base = shared_suffix_base(config.hidden_size, config.suffix)
            with torch.device("meta"):
                suffix = SuffixBlock(config.hidden_size, config.suffix)
            for name in base.params:
                owner, _, leaf = name.rpartition(".")
                module = suffix.get_submodule(owner)
                module._parameters[leaf] = base.params[name]
                places.append((module, leaf, name))
        torch.manual_seed(init_seed)
        kind = GaussianActorCritic if config.head.kind == "gaussian_actor_critic" else ChunkRegressionHead
        head = kind(config.suffix_width + config.head.proprio_dim, config.head)
        if suffix is not None:
            add_lora(suffix, config.suffix)
    policy = TenantPolicy(config, suffix, head)
    if base is not None:
        policy.attach_shared_base(base, places)
    return policy


def _refuse_other_base(module: TenantPolicy, state_dict, prefix, *_args) -> None:
    """A state whose frozen base differs from the shared copy would overwrite every tenant's base."""
    if not module._shared:
        return
    own = dict(module.named_parameters(remove_duplicate=False))
    for name in module.shared_parameter_names():
        incoming = state_dict.get(prefix + name)
        mine = own[name]
        if incoming is not None and not torch.equal(incoming.to(mine.device, mine.dtype), mine):
            raise ConfigError(f"tenant {module.config.tenant_id}: {name} differs from the shared frozen "
                              f"suffix base (base_seed {module.config.suffix.base_seed}); refusing to load")
