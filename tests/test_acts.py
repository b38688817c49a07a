"""TickActs: the rows one group's features bring back act in one call, each getting its own action."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tenants.acts import TickActs
from tenants.policy import build_policy
from tests.test_tenant_modules import make_feature, tenant_config


async def test_rows_woken_in_one_tick_act_together_and_each_gets_its_own_action() -> None:
    policy = build_policy(tenant_config("a", kind="gaussian_actor_critic"), init_seed=1)
    rows = make_feature(torch.Generator().manual_seed(3), batch=8).split([1] * 8)
    acts, features = TickActs(), asyncio.get_running_loop().create_future()

    async def answer(i: int):  # as the inference role: wait for the group's features, then act
        await features
        return await acts.act(policy, rows[i], torch.Generator().manual_seed(i), False)

    tasks = [asyncio.create_task(answer(i)) for i in range(8)]
    await asyncio.sleep(0)
    features.set_result(None)  # the batcher resolves a whole group in one step
    outs = await asyncio.gather(*tasks)
    assert (acts.calls, acts.rows) == (1, 8)
    for i, out in enumerate(outs):
        (alone,) = policy.act_each([rows[i]], [torch.Generator().manual_seed(i)])
        assert torch.equal(out.action, alone.action) and torch.equal(out.log_prob, alone.log_prob)
    # another policy, or deterministic rows, in the same tick: separate calls
    other = build_policy(tenant_config("b", kind="gaussian_actor_critic"), init_seed=2)
    await asyncio.gather(acts.act(policy, rows[0], torch.Generator(), False),
                         acts.act(other, rows[1], torch.Generator(), False),
                         acts.act(policy, rows[2], torch.Generator(), True))
    assert (acts.calls, acts.rows) == (4, 11)


async def test_a_policy_that_raises_fails_every_row_of_its_call_and_no_other() -> None:
    good = build_policy(tenant_config("a"), init_seed=1)
    bad = build_policy(tenant_config("b"), init_seed=1)
    bad.head.net[1].weight.data = torch.zeros(3, 3)  # wrong shape: the head's matmul raises
    rows = make_feature(torch.Generator().manual_seed(3), batch=3).split([1] * 3)
    acts = TickActs()
    results = await asyncio.gather(acts.act(bad, rows[0], torch.Generator(), True),
                                   acts.act(bad, rows[1], torch.Generator(), True),
                                   acts.act(good, rows[2], torch.Generator(), True), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results[:2])
    assert isinstance(results[2], torch.Tensor) and results[2].shape[0] == 1
    with pytest.raises(RuntimeError):  # nothing stays queued: the next call runs anew and fails again
        await acts.act(bad, rows[0], torch.Generator(), True)


@pytest.mark.parametrize("kind,lora_rank", [("gaussian_actor_critic", 4), ("chunk_regression", 0)])
def test_rows_act_on_the_device_of_the_modules_not_of_the_features(kind: str, lora_rank: int) -> None:
    # Features leave the backbone on the CPU; on a GPU machine the tenant's modules are on the GPU
    # (this failed there until 2026-12-04). The meta device stands in for it: it checks devices
    # and computes nothing.
    policy = build_policy(tenant_config("a", kind=kind, lora_rank=lora_rank), init_seed=1).to("meta")
    rows = make_feature(torch.Generator().manual_seed(3), batch=2).split([1, 1])
    outs = policy.act_each(rows, [torch.Generator().manual_seed(i) for i in range(2)])
    assert all((o.action if kind == "gaussian_actor_critic" else o).device.type == "meta" for o in outs)
