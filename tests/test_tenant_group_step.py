"""The group training step: a group's features split per tenant, one update per slot, failures isolated."""

from __future__ import annotations

import pytest
import torch

from backbone.feature import VLAFeature
from tenants.group_step import StepResult, group_train_step, split_group
from tenants.slot import TenantSlot
from tenants.targets import SFTTargets, Targets
from tests.test_tenant_modules import (
    assert_identical,
    make_feature,
    ppo_targets,
    sft_targets,
    snapshot,
    tenant_config,
)

torch.set_num_threads(1)

PPO = "gaussian_actor_critic"


@pytest.fixture(autouse=True)
def deterministic_algorithms():
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


def make_slots(*tenants: str) -> dict[str, TenantSlot]:
    configs = {
        "alpha": tenant_config("alpha", lora_rank=4, seed=1),
        "beta": tenant_config("beta", kind=PPO, seed=2),
        "gamma": tenant_config("gamma", kind=PPO, lora_rank=8, seed=3),
        "bad": tenant_config("bad", seed=4),
    }
    return {t: TenantSlot(configs[t]).mount() for t in tenants}


def data_generators() -> dict[str, torch.Generator]:
    tenants = ("alpha", "beta", "gamma", "bad")
    return {t: torch.Generator().manual_seed(100 + i) for i, t in enumerate(tenants)}


def group_batches(slots: dict[str, TenantSlot], gens: dict[str, torch.Generator],
                  poison: set[str] = frozenset()) -> dict[str, tuple[VLAFeature, Targets]]:
    """One group forward's worth of features (concatenated, then split back) and each tenant's targets.

    Every tenant draws from its own generator, so adding or removing a tenant changes no one else's data.
    """
    sizes = {t: 2 + i for i, t in enumerate(slots)}
    group = VLAFeature.cat([make_feature(gens[t], sizes[t]) for t in slots])
    features = split_group(group, sizes)
    batches: dict[str, tuple[VLAFeature, Targets]] = {}
    for tenant, slot in slots.items():
        feature = features[tenant]
        if slot.config.head.kind == PPO:
            targets = ppo_targets(slot, feature, gens[tenant])
        else:
            targets = sft_targets(gens[tenant], feature.batch_size)
        if tenant in poison:
            targets = SFTTargets(torch.full_like(targets.actions, float("nan")))
        batches[tenant] = (feature, targets)
    return batches


def run(tenants: tuple[str, ...], steps: int = 4, poison_from: int | None = None):
    slots = make_slots(*tenants)
    gens = data_generators()
    history: list[dict[str, StepResult]] = []
    for step in range(steps):
        poison = {"bad"} if poison_from is not None and step >= poison_from else set()
        history.append(group_train_step(slots, group_batches(slots, gens, poison)))
    return slots, history


def test_split_group_returns_each_tenants_rows_in_order() -> None:
    group = make_feature(torch.Generator().manual_seed(0), batch=5)
    parts = split_group(group, {"b": 2, "a": 3})
    assert list(parts) == ["b", "a"]
    assert torch.equal(parts["b"].sequence, group.sequence[:2])
    assert torch.equal(parts["a"].proprio, group.proprio[2:])


def test_the_group_step_equals_stepping_each_slot_alone() -> None:
    tenants = ("alpha", "beta", "gamma")
    grouped, history = run(tenants, steps=3)
    serial = make_slots(*tenants)
    gens = data_generators()
    for step in range(3):
        batches = group_batches(serial, gens)
        for tenant in reversed(tenants):  # another order, one slot at a time
            assert serial[tenant].train_step(*batches[tenant]) == history[step][tenant].metrics
    for tenant in tenants:
        assert_identical(snapshot(grouped[tenant]), snapshot(serial[tenant]))


def test_a_tenant_with_a_nan_loss_is_stopped_alone_and_the_others_do_not_notice() -> None:
    clean_slots, clean = run(("alpha", "beta", "gamma"))
    slots, poisoned = run(("alpha", "beta", "gamma", "bad"), poison_from=2)

    for step in range(4):
        for tenant in ("alpha", "beta", "gamma"):
            assert poisoned[step][tenant] == clean[step][tenant]
            assert poisoned[step][tenant].ok
    for tenant in ("alpha", "beta", "gamma"):
        assert_identical(snapshot(slots[tenant]), snapshot(clean_slots[tenant]))

    assert poisoned[1]["bad"].ok
    stopped = poisoned[2]["bad"]
    assert stopped == StepResult("bad", 2, {}, error="loss is nan at step 2", slot_failed=True)
    assert poisoned[3]["bad"].error == "loss is nan at step 2"  # refused, same reason
    assert slots["bad"].failure == "loss is nan at step 2" and slots["bad"].step == 2


def test_an_exception_in_one_tenant_marks_only_that_slot_failed() -> None:
    slots = make_slots("alpha", "beta", "bad")
    clean = make_slots("alpha", "beta")
    gens = {t: torch.Generator().manual_seed(i) for i, t in enumerate(("alpha", "beta", "bad"))}
    clean_gens = {t: torch.Generator().manual_seed(i) for i, t in enumerate(("alpha", "beta", "bad"))}

    def explode(*_: object) -> None:
        raise RuntimeError("device lost")

    slots["bad"].policy.head.register_forward_hook(explode)
    results = group_train_step(slots, group_batches(slots, gens))
    expected = group_train_step(clean, group_batches(clean, clean_gens))
    assert results["bad"].error == "RuntimeError: device lost" and results["bad"].slot_failed
    assert {t: results[t] for t in ("alpha", "beta")} == expected
    for tenant in ("alpha", "beta"):
        assert_identical(snapshot(slots[tenant]), snapshot(clean[tenant]))


def test_a_refused_batch_or_a_missing_slot_is_reported_without_failing_anything() -> None:
    slots = make_slots("alpha", "bad")
    batches = group_batches(slots, {t: torch.Generator().manual_seed(0) for t in ("alpha", "bad")})
    feature, _ = batches["bad"]
    batches["bad"] = (feature, SFTTargets(torch.zeros(feature.batch_size, 1, 1)))
    batches["nobody"] = batches["alpha"]
    results = group_train_step(slots, batches)
    assert results["alpha"].ok and results["alpha"].step == 1
    assert results["bad"].error.startswith("InvalidBatch: actions has shape")
    assert not results["bad"].slot_failed and not slots["bad"].failed and slots["bad"].step == 0
    assert results["nobody"].error == "no slot mounted for tenant nobody"
