"""A tenant's action modules as one ``nn.Module``: optional policy suffix, then the head.

``build_policy`` creates it from a config and seeds, leaving the process's
global RNG as it found it (``infra.reproducible.seeded``): the same config and
seed give bit-identical modules in any process, in any order, from any thread.

A suffix's frozen base is not the tenant's own: its parameters are the
process-wide copy of ``tenants/shared_base.py`` (one per configuration and
device), registered in the tenant's module tree under the usual names, so
``state_dict`` and checkpoints are unchanged. Moving a policy (``.to``,
``mount``/``unmount``) moves its own parameters and points the shared ones at
the copy for the new device; it never moves the copy other tenants use.
Loading a state whose base values differ from the shared copy is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from backbone.feature import VLAFeature
from infra.errors import ConfigError
from infra.reproducible import seeded
from tenants.config import TenantConfig
from tenants.heads import ActorOutput, ChunkRegressionHead, GaussianActorCritic
from tenants.losses import Metrics, l1_chunk_loss, ppo_loss
from tenants.shared_base import SharedSuffixBase, shared_suffix_base
from tenants.suffix import SuffixBlock, add_lora
from tenants.targets import PPOTargets, Targets

__all__ = ["ACT_ROWS", "TenantPolicy", "build_policy"]

#: Rows of every ``TenantPolicy.act_each`` computation (more rows: several of this many). On this
#: workplace's CPUs (MKL strict mode, ``infra.reproducible``) a row of the demo's heads computed
#: with 4 to 32 rows equals it computed with 32, and 1 to 3 rows take other kernels; a fixed count
#: does not rely on that. 32 rows of the demo's Gaussian head: 0.31 ms, one row 0.19 ms
#: (2026-12-03, one thread), so a group of 8 costs 1/5 of acting row by row.
ACT_ROWS = 32


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
        # features leave the backbone on the CPU (split per row, cached); the modules may be on a GPU
        feature = feature.to(next(self.head.parameters()).device)
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


    def act_each(self, features: Sequence[VLAFeature], generators: Sequence[torch.Generator],
                 deterministic: bool = False) -> list[ActorOutput | torch.Tensor]:
        """One action per feature (of one row each; row i's noise from ``generators[i]``), computed
        ``ACT_ROWS`` rows at a time whatever their number: the rows are padded with copies of the
        first. One shape always means one kernel path, so a row's action depends on that row alone,
        not on how many acted with it (alone, in a group, after a crash). ``act`` on one row is
        another path (a matrix-vector product: other last bits)."""
        out: list[ActorOutput | torch.Tensor] = []
        for start in range(0, len(features), ACT_ROWS):
            rows, gens = features[start:start + ACT_ROWS], generators[start:start + ACT_ROWS]
            x = self.encode(_padded(rows, self.suffix is not None))
            if isinstance(self.head, GaussianActorCritic):
                o = self.head.act_each(x, gens, deterministic)
                out += [ActorOutput(*(t[i:i + 1] for t in (o.action, o.log_prob, o.entropy, o.value)))
                        for i in range(len(rows))]
            else:
                chunk = self.head(x)
                out += [chunk[i:i + 1] for i in range(len(rows))]
        return out


def _padded(rows: Sequence[VLAFeature], needs_sequence: bool) -> VLAFeature:
    """``ACT_ROWS`` rows: ``rows``, then copies of the first. Without a suffix only the pooled
    vector and proprio are read, so the sequences (large at the bigger presets) are not copied."""
    fill = [rows[0]] * (ACT_ROWS - len(rows))
    if needs_sequence:
        return VLAFeature.cat([*rows, *fill])
    pooled = torch.cat([f.pooled for f in (*rows, *fill)])
    proprio = torch.cat([f.proprio for f in (*rows, *fill)])
    empty = pooled[:, None, :0]  # [ACT_ROWS, 1, 0]: a sequence no one reads
    return VLAFeature(empty, torch.ones(ACT_ROWS, 1, dtype=torch.bool), pooled, proprio,
                      torch.cat([f.task_id for f in (*rows, *fill)]))


def build_policy(config: TenantConfig, init_seed: int) -> TenantPolicy:
    """Modules on CPU, float32: the suffix base from ``suffix.base_seed``, head and LoRA from ``init_seed``.

    The base seed is shared so every tenant's frozen suffix base is identical, and it IS shared: the
    block is built on the meta device and its parameters are the process's copy (``shared_base``),
    whose values are those an own block would get. The head and adapters are the tenant's own.
    """
    suffix, base, places = None, None, []
    if config.suffix is not None:  # draws nothing: the base seeds itself, the block is on meta
        base = shared_suffix_base(config.hidden_size, config.suffix)
        with torch.device("meta"):
            suffix = SuffixBlock(config.hidden_size, config.suffix)
        for name in base.params:
            owner, _, leaf = name.rpartition(".")
            module = suffix.get_submodule(owner)
            module._parameters[leaf] = base.params[name]
            places.append((module, leaf, name))
    with seeded(init_seed):
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
