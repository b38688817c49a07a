"""Tenant slots on real backbone features.

A grouped backbone forward followed by the group step gives the same tenant
state, bit for bit, as one forward per request followed by serial slot steps.
"""

from __future__ import annotations

import pytest
import torch

from backbone.feature import VLAFeature
from backbone.inputs import VLARequest
from backbone.model import Backbone
from tenants.config import HeadConfig, OptimConfig, SuffixConfig, TenantConfig
from tenants.group_step import group_train_step
from tenants.slot import TenantSlot
from tenants.targets import PPOTargets, SFTTargets
from tests.test_tenant_modules import assert_identical, snapshot
from tests.vla import requests

torch.set_num_threads(1)

PROPRIO = 5  # tests.vla's requests carry 5 proprio values


def slots_for(hidden: int) -> dict[str, TenantSlot]:
    def config(tenant: str, kind: str, suffix: SuffixConfig | None, seed: int) -> TenantConfig:
        head = HeadConfig(kind=kind, action_dim=7, chunk_len=4 if kind == "chunk_regression" else 1,
                          proprio_dim=PROPRIO, hidden=32)
        return TenantConfig(tenant, hidden, head=head, suffix=suffix, seed=seed, optim=OptimConfig(lr=1e-2))

    lora = SuffixConfig(width=32, num_heads=2, lora_rank=4)
    configs = [config("sft-head", "chunk_regression", None, 1),
               config("sft-suffix", "chunk_regression", lora, 2),
               config("ppo-head", "gaussian_actor_critic", None, 3),
               config("ppo-suffix", "gaussian_actor_critic", lora, 4)]
    return {c.tenant_id: TenantSlot(c).mount() for c in configs}


def run(backbone: Backbone, grouped: bool, steps: int = 3) -> dict[str, TenantSlot]:
    slots = slots_for(backbone.hidden_size)
    tenants = sorted(slots)
    for step in range(steps):
        reqs = requests(8, seed=200 + step, words=4)  # one bucket: one group forward
        batch = [VLARequest(tenants[i % 4], r.images, r.instruction, r.proprio) for i, r in enumerate(reqs)]
        prepared = [backbone.prepare(r) for r in batch]
        features = backbone.forward(prepared) if grouped else [backbone.forward([p])[0] for p in prepared]
        gen = torch.Generator().manual_seed(step)
        batches = {}
        for tenant in tenants:
            mine = VLAFeature.cat([f for f, r in zip(features, batch, strict=True) if r.tenant == tenant])
            slot = slots[tenant]
            if slot.config.head.kind == "gaussian_actor_critic":
                out = slot.act(mine)
                targets = PPOTargets(out.action, out.log_prob, torch.randn(2, generator=gen),
                                     torch.randn(2, generator=gen))
            else:
                targets = SFTTargets(torch.randn(2, 4, 7, generator=gen))
            batches[tenant] = (mine, targets)
        if grouped:
            results = group_train_step(slots, batches)
            assert all(r.ok for r in results.values()), results
        else:
            for tenant in reversed(tenants):
                slots[tenant].train_step(*batches[tenant])
    return slots


@pytest.mark.parametrize("name", ["tiny", "tiny-paligemma"])
def test_grouped_backbone_and_group_step_equal_serial_bit_for_bit(backbones: dict[str, Backbone],
                                                                   name: str) -> None:
    grouped = run(backbones[name], grouped=True)
    serial = run(backbones[name], grouped=False)
    for tenant in grouped:
        assert grouped[tenant].step == 3
        assert_identical(snapshot(grouped[tenant]), snapshot(serial[tenant]))
