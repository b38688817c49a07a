"""The policy suffix's frozen base is one copy per process, shared by every tenant's slot:
same values as an own copy (bit for bit), never moved or overwritten under another tenant,
and freed when the last tenant using it is gone."""

from __future__ import annotations

import gc

import pytest
import torch

from backbone.feature import VLAFeature
from infra.errors import ConfigError
from tenants.config import HeadConfig, SuffixConfig, TenantConfig
from tenants.shared_base import live_bases
from tenants.slot import TenantSlot
from tenants.suffix import SuffixBlock
from tenants.targets import SFTTargets

torch.set_num_threads(1)
H, CHUNK, ACT, PROPRIO = 64, 2, 3, 4


def config(tenant: str, seed: int, base_seed: int = 0, rank: int = 4) -> TenantConfig:
    head = HeadConfig(kind="chunk_regression", action_dim=ACT, chunk_len=CHUNK, proprio_dim=PROPRIO,
                      hidden=32)
    suffix = SuffixConfig(num_heads=4, lora_rank=rank, base_seed=base_seed)
    return TenantConfig(tenant, H, head=head, suffix=suffix, seed=seed)


def batch(seed: int) -> tuple[VLAFeature, SFTTargets]:
    g = torch.Generator().manual_seed(seed)
    seq = torch.randn(3, 5, H, generator=g)
    feature = VLAFeature(seq, torch.ones(3, 5, dtype=torch.bool), seq.mean(1),
                         torch.randn(3, PROPRIO, generator=g), torch.zeros(3, dtype=torch.long))
    return feature, SFTTargets(torch.randn(3, CHUNK, ACT, generator=g))


def frozen(slot: TenantSlot) -> dict[str, torch.Tensor]:
    params = dict(slot.policy.named_parameters())
    return {n: params[n] for n in slot.policy.shared_parameter_names()}


def test_tenants_share_one_base_with_the_values_an_own_copy_would_have() -> None:
    a, b = TenantSlot(config("a", 1)).mount("cpu"), TenantSlot(config("b", 2, rank=8)).mount("cpu")
    fa, fb = frozen(a), frozen(b)
    assert fa and fa.keys() == fb.keys()
    assert all(fa[n] is fb[n] for n in fa)  # one tensor, not equal copies
    torch.manual_seed(0)
    own = dict(SuffixBlock(H, config("x", 0).suffix).named_parameters())
    for name, tensor in fa.items():
        assert torch.equal(tensor, own[name.removeprefix("suffix.").replace(".base_layer", "")]), name
        assert not tensor.requires_grad
    trainable = {n for n, p in a.policy.named_parameters() if p.requires_grad}
    assert trainable and not trainable & fa.keys()
    other = TenantSlot(config("c", 1, base_seed=5))
    assert not any(frozen(other)[n] is fa[n] for n in fa)  # another base seed: another base


def test_moving_one_tenant_never_moves_the_base_under_another() -> None:
    a, b = TenantSlot(config("a", 1)).mount("cpu"), TenantSlot(config("b", 2)).mount("cpu")
    before = {n: t.clone() for n, t in frozen(a).items()}
    b.policy.to(torch.float64)  # the CPU stand-in for "b moved to another device"
    assert all(t.dtype == torch.float64 for t in frozen(b).values())
    assert all(t.dtype == torch.float32 for t in frozen(a).values())
    a.train_step(*batch(0))  # a still works on its device/dtype
    assert all(torch.equal(frozen(a)[n], before[n]) for n in before)  # steps never touch the base
    b.policy.to(torch.float32)
    assert all(frozen(b)[n] is frozen(a)[n] for n in before)  # back on a's copy


def test_sharing_changes_no_result_a_slot_stepped_twice_equals_its_reload() -> None:
    a = TenantSlot(config("a", 1)).mount("cpu")
    for s in range(3):
        a.train_step(*batch(s))
    state = a.state()
    again = TenantSlot.from_state(state).mount("cpu")
    for slot in (a, again):
        slot.train_step(*batch(9))
    assert all(torch.equal(a.state().model[k], again.state().model[k]) for k in state.model)


def test_a_state_with_another_base_is_refused_and_the_shared_base_is_untouched() -> None:
    a, b = TenantSlot(config("a", 1)), TenantSlot(config("b", 2))
    state = b.state()
    name = next(iter(b.policy.shared_parameter_names()))
    poisoned = {**state.model, name: state.model[name] + 1.0}
    before = frozen(a)[name].clone()
    with pytest.raises(ConfigError, match="shared frozen suffix base"):
        b.policy.load_state_dict(poisoned)
    assert torch.equal(frozen(a)[name], before)


def test_memory_counts_the_shared_base_apart_and_it_is_freed_with_its_last_tenant() -> None:
    gc.collect()
    key = config("z", 0, base_seed=123).suffix
    slots = [TenantSlot(config(f"t{i}", i, base_seed=123)).mount("cpu") for i in range(3)]
    for slot in slots:
        slot.train_step(*batch(1))
    memory = slots[0].memory()
    base_bytes = sum(t.numel() * t.element_size() for t in frozen(slots[0]).values())
    assert memory.shared_param_bytes == base_bytes > 0
    assert memory.own_bytes == memory.total_bytes - base_bytes
    assert memory.own_bytes < memory.total_bytes / 2  # the base dominates a suffix slot
    ours = [b for b in live_bases() if b.key[-1] == key.base_seed]
    assert len(ours) == 1 and ours[0].nbytes == base_bytes
    del slots, slot, memory, ours
    gc.collect()
    assert not [b for b in live_bases() if b.key[-1] == key.base_seed]
