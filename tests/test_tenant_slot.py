"""TenantSlot: isolation between tenants, the NaN/Inf guard, memory accounting, mount/unmount."""

from __future__ import annotations

import pytest
import torch

from infra.errors import ConfigError
from tenants.errors import InvalidBatch, NonFiniteLoss, SlotFailed, SlotNotMounted
from tenants.slot import TenantSlot
from tenants.targets import SFTTargets
from tests.test_tenant_modules import (
    assert_identical,
    make_feature,
    ppo_targets,
    sft_targets,
    snapshot,
    tenant_config,
)

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def deterministic_algorithms():
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


def four_slots() -> dict[str, TenantSlot]:
    """SFT and PPO tenants, with and without a LoRA suffix, one with an LR schedule."""
    ppo = "gaussian_actor_critic"
    configs = [
        tenant_config("sft-suffix", lora_rank=4, seed=1),
        tenant_config("ppo", kind=ppo, seed=2, chunk=1),
        tenant_config("ppo-suffix", kind=ppo, lora_rank=8, seed=3),
        tenant_config("sft", seed=4, warmup_steps=2, decay_steps=4),
    ]
    return {c.tenant_id: TenantSlot(c).mount() for c in configs}


def step_once(slot: TenantSlot, gen: torch.Generator) -> dict[str, float]:
    feature = make_feature(gen)
    if slot.config.head.kind == "gaussian_actor_critic":
        return slot.train_step(feature, ppo_targets(slot, feature, gen))
    return slot.train_step(feature, sft_targets(gen, chunk=slot.config.head.chunk_len))


def test_a_step_of_one_tenant_leaves_every_other_slot_bit_identical() -> None:
    slots = four_slots()
    gen = torch.Generator().manual_seed(0)
    for _ in range(4):
        for tenant, slot in slots.items():
            others = {t: snapshot(s) for t, s in slots.items() if t != tenant}
            mine = snapshot(slot)
            step_once(slot, gen)
            for other, before in others.items():
                assert_identical(before, snapshot(slots[other]))
            after = snapshot(slot)  # the check can fail: the stepping slot itself did change
            assert after["step"] == mine["step"] + 1
            assert any(not torch.equal(mine[k], after[k]) for k in mine if k.startswith("param."))
    # every slot has gradients and optimizer state by now, so the comparisons above covered them
    assert all(s.memory().grad_bytes and s.memory().optimizer_bytes for s in slots.values())


def test_the_order_slots_step_in_does_not_change_any_result() -> None:
    def run(order: list[str]) -> dict[str, dict]:
        slots = four_slots()
        gens = {t: torch.Generator().manual_seed(i) for i, t in enumerate(sorted(slots))}
        for _ in range(3):
            for tenant in order:
                step_once(slots[tenant], gens[tenant])
        return {t: snapshot(s) for t, s in slots.items()}

    forward = run(["sft-suffix", "ppo", "ppo-suffix", "sft"])
    backward = run(["sft", "ppo-suffix", "ppo", "sft-suffix"])
    for tenant in forward:
        assert_identical(forward[tenant], backward[tenant])


def test_a_step_never_touches_the_global_rng() -> None:
    slots = four_slots()
    gen = torch.Generator().manual_seed(0)
    before = torch.get_rng_state()
    for slot in slots.values():
        step_once(slot, gen)
    assert torch.equal(torch.get_rng_state(), before)


def test_memory_accounting_counts_parameters_gradients_and_optimizer_state() -> None:
    slot = TenantSlot(tenant_config("a", lora_rank=4)).mount()
    params = list(slot.policy.parameters())
    trainable = [p for p in params if p.requires_grad]
    fresh = slot.memory()
    assert fresh.param_bytes == 4 * sum(p.numel() for p in params)
    assert fresh.trainable_param_bytes == 4 * sum(p.numel() for p in trainable)
    assert fresh.param_bytes > fresh.trainable_param_bytes  # the frozen suffix base
    assert fresh.grad_bytes == fresh.optimizer_bytes == 0
    step_once(slot, torch.Generator().manual_seed(0))
    used = slot.memory()
    assert used.grad_bytes == used.trainable_param_bytes
    # AdamW: exp_avg + exp_avg_sq per trainable tensor, plus a float32 step counter each
    assert used.optimizer_bytes == 2 * used.trainable_param_bytes + 4 * len(trainable)
    assert used.total_bytes == used.param_bytes + used.grad_bytes + used.optimizer_bytes


def test_a_nan_loss_skips_the_update_and_marks_only_that_slot_failed() -> None:
    slot = TenantSlot(tenant_config("a", lora_rank=4)).mount()
    gen = torch.Generator().manual_seed(0)
    step_once(slot, gen)
    before = snapshot(slot)
    feature, targets = make_feature(gen), sft_targets(gen)
    poisoned = SFTTargets(targets.actions.clone().index_fill_(0, torch.tensor([1]), float("nan")))
    with pytest.raises(NonFiniteLoss, match="loss is nan at step 1"):
        slot.train_step(feature, poisoned)
    assert slot.failed and slot.failure == "loss is nan at step 1"
    after = snapshot(slot)
    for key in before:
        if key.startswith(("param.", "optim.", "rng", "step")):
            assert torch.equal(before[key], after[key]) if isinstance(before[key], torch.Tensor) \
                else before[key] == after[key], key
    assert slot.memory().grad_bytes == 0  # the poisoned gradients were dropped
    with pytest.raises(SlotFailed, match="loss is nan"):
        slot.train_step(feature, targets)


def test_an_infinite_gradient_skips_the_update() -> None:
    slot = TenantSlot(tenant_config("a")).mount()
    gen = torch.Generator().manual_seed(0)
    step_once(slot, gen)
    before = {n: p.detach().clone() for n, p in slot.policy.named_parameters()}
    optim_before = snapshot(slot)
    slot.policy.head.net[1].weight.register_hook(lambda grad: grad * float("inf"))
    with pytest.raises(NonFiniteLoss, match="gradient norm is (inf|nan) at step 1"):
        step_once(slot, gen)
    for name, p in slot.policy.named_parameters():
        assert torch.equal(p, before[name]), name
    assert all(torch.equal(v, snapshot(slot)[k]) for k, v in optim_before.items()
               if k.startswith("optim."))
    assert slot.step == 1 and slot.failed


def test_a_batch_that_does_not_fit_is_refused_before_anything_changes() -> None:
    slot = TenantSlot(tenant_config("a")).mount()
    gen = torch.Generator().manual_seed(0)
    step_once(slot, gen)
    before = snapshot(slot)
    feature = make_feature(gen)
    with pytest.raises(InvalidBatch, match=r"actions has shape \(4, 2, 2\), expected \(4, 3, 2\)"):
        slot.train_step(feature, SFTTargets(torch.zeros(4, 2, 2)))
    with pytest.raises(InvalidBatch, match="PPO targets need a gaussian_actor_critic head"):
        ppo_slot = TenantSlot(tenant_config("b", kind="gaussian_actor_critic")).mount()
        slot.train_step(feature, ppo_targets(ppo_slot, feature, gen))
    assert_identical(before, snapshot(slot))
    assert not slot.failed
    step_once(slot, gen)


def test_unmount_and_mount_again_continues_exactly() -> None:
    a = TenantSlot(tenant_config("a", kind="gaussian_actor_critic", lora_rank=4)).mount()
    b = TenantSlot(tenant_config("a", kind="gaussian_actor_critic", lora_rank=4)).mount()
    gen_a, gen_b = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    for i in range(4):
        if i == 2:
            b.unmount()
            assert not b.mounted and b.memory().grad_bytes == 0
            with pytest.raises(SlotNotMounted):
                b.act(make_feature(torch.Generator()))
            b.mount("cpu")
        assert step_once(a, gen_a) == step_once(b, gen_b)
    assert_identical(snapshot(a), snapshot(b))


def test_gradients_are_clipped_to_the_configured_norm() -> None:
    slot = TenantSlot(tenant_config("a", grad_clip=1e-3)).mount()
    metrics = step_once(slot, torch.Generator().manual_seed(0))
    assert metrics["grad_norm"] > 1e-3  # reported before clipping
    clipped = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in slot.policy.parameters()]))
    assert clipped <= 1e-3 * (1 + 1e-5)


def test_load_state_refuses_another_tenants_state() -> None:
    a = TenantSlot(tenant_config("a"))
    with pytest.raises(ConfigError, match="different config"):
        a.load_state(TenantSlot(tenant_config("b")).state())


def test_a_state_saved_without_the_fused_optimizer_continues_with_the_per_tensor_loop() -> None:
    """Slots step with the fused AdamW; a checkpoint written before (groups without ``fused``)
    resumes with the algorithm it was trained with, so its run continues bit for bit."""
    config = tenant_config("older", kind="gaussian_actor_critic", seed=5)
    assert [g["fused"] for g in TenantSlot(config).optimizer.param_groups] == [True, True]

    def per_tensor() -> TenantSlot:
        slot = TenantSlot(config).mount()
        for group in slot.optimizer.param_groups:
            group["fused"] = None  # what torch's AdamW defaulted to on the CPU
        return slot

    straight, gen_a = per_tensor(), torch.Generator().manual_seed(0)
    for _ in range(4):
        step_once(straight, gen_a)
    first, gen_b = per_tensor(), torch.Generator().manual_seed(0)
    for _ in range(2):
        step_once(first, gen_b)
    resumed = TenantSlot.from_state(first.state()).mount()
    assert [g["fused"] for g in resumed.optimizer.param_groups] == [None, None]
    assert all(s["step"].device.type == "cpu" for s in resumed.optimizer.state.values())
    for _ in range(2):
        step_once(resumed, gen_b)
    assert_identical(snapshot(straight), snapshot(resumed))
    fused, gen_c = TenantSlot(config).mount(), torch.Generator().manual_seed(0)
    for _ in range(4):
        step_once(fused, gen_c)
    assert any(not torch.equal(a, b) for a, b in  # the check can fail: the two algorithms round apart
               zip(fused.policy.parameters(), straight.policy.parameters(), strict=True))
