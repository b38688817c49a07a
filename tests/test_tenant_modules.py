"""Tenant action modules: configs, heads, the LoRA policy suffix, losses and the LR schedule.

Also holds the small factories the other ``test_tenant_*`` files import (tiny
dims, features from a fixed generator; no backbone needed).
"""

from __future__ import annotations

import math
import threading

import pytest
import torch

from backbone.feature import VLAFeature
from infra.errors import ConfigError, InvalidTenantId
from tenants.config import HeadConfig, OptimConfig, PPOConfig, SuffixConfig, TenantConfig
from tenants.heads import GaussianActorCritic
from tenants.losses import ppo_loss
from tenants.optim import learning_rate
from tenants.policy import build_policy
from tenants.slot import TenantSlot
from tenants.targets import PPOTargets, SFTTargets

torch.set_num_threads(1)

H, T, P = 32, 6, 3  # backbone hidden size, tokens, proprio width
ACTION_DIM, CHUNK = 2, 3


# ---- factories shared by the tenant tests -------------------------------------------------------

def tenant_config(tenant: str, *, kind: str = "chunk_regression", lora_rank: int | None = None,
                  seed: int = 0, chunk: int = CHUNK, **optim: object) -> TenantConfig:
    suffix = SuffixConfig(width=16, num_heads=2, lora_rank=lora_rank) if lora_rank else None
    head = HeadConfig(kind=kind, action_dim=ACTION_DIM, chunk_len=chunk, proprio_dim=P, hidden=16)
    return TenantConfig(tenant, H, head=head, suffix=suffix, seed=seed,
                        optim=OptimConfig(**{"lr": 1e-2, **optim}))


def make_feature(gen: torch.Generator, batch: int = 4) -> VLAFeature:
    """Right-padded features of varied lengths, pooled over real tokens as the backbone does."""
    sequence = torch.randn(batch, T, H, generator=gen)
    lengths = torch.randint(1, T + 1, (batch,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    pooled = (sequence * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    return VLAFeature(sequence, mask, pooled, torch.randn(batch, P, generator=gen),
                      torch.zeros(batch, dtype=torch.long))


def sft_targets(gen: torch.Generator, batch: int = 4, chunk: int = CHUNK) -> SFTTargets:
    return SFTTargets(torch.randn(batch, chunk, ACTION_DIM, generator=gen))


def ppo_targets(slot: TenantSlot, feature: VLAFeature, gen: torch.Generator) -> PPOTargets:
    """Actions sampled by the slot itself (advancing its generator), advantages/returns from ``gen``."""
    out = slot.act(feature)
    b = feature.batch_size
    return PPOTargets(out.action, out.log_prob, torch.randn(b, generator=gen), torch.randn(b, generator=gen))


def snapshot(slot: TenantSlot) -> dict[str, torch.Tensor | int | None]:
    """Everything a step could touch: parameters, gradients, optimizer state, RNG, counters."""
    snap: dict[str, torch.Tensor | int | None] = {"step": slot.step, "version": slot.version,
                                                  "rng": slot.generator.get_state().clone()}
    for name, p in slot.policy.named_parameters():
        snap[f"param.{name}"] = p.detach().clone()
        snap[f"grad.{name}"] = None if p.grad is None else p.grad.clone()
    for index, state in slot.optimizer.state_dict()["state"].items():
        for key, value in state.items():
            snap[f"optim.{index}.{key}"] = value.clone()
    return snap


def assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


# ---- configs -----------------------------------------------------------------------------------

def test_config_round_trips_through_a_dict() -> None:
    config = tenant_config("acme", kind="gaussian_actor_critic", lora_rank=8, warmup_steps=3)
    assert TenantConfig.from_dict(config.to_dict()) == config
    assert TenantConfig.from_dict(config.to_dict()).optim.betas == (0.9, 0.999)


@pytest.mark.parametrize("tenant", ["Acme", "a.b", "a_b", "", "-a", "x" * 49])
def test_bad_tenant_ids_are_refused(tenant: str) -> None:
    with pytest.raises(InvalidTenantId):
        TenantConfig(tenant, H)


def test_bad_configs_are_refused() -> None:
    with pytest.raises(ConfigError, match="action_dim"):
        HeadConfig(action_dim=0)
    with pytest.raises(ConfigError, match="kind"):
        HeadConfig(kind="diffusion")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="divisible"):
        TenantConfig("a", 30, suffix=SuffixConfig(num_heads=4))
    with pytest.raises(ConfigError, match="not a TenantConfig"):
        TenantConfig.from_dict({**tenant_config("a").to_dict(), "colour": "red"})


# ---- heads -------------------------------------------------------------------------------------

def test_gaussian_log_prob_and_entropy_match_torch_distributions() -> None:
    gen = torch.Generator().manual_seed(1)
    mean = torch.randn(5, CHUNK, ACTION_DIM, generator=gen)
    log_std = torch.randn(CHUNK, ACTION_DIM, generator=gen) * 0.3
    action = torch.randn(5, CHUNK, ACTION_DIM, generator=gen)
    normal = torch.distributions.Normal(mean, log_std.exp())
    expected = normal.log_prob(action).sum(dim=(-2, -1))
    torch.testing.assert_close(GaussianActorCritic.log_prob(mean, log_std, action), expected)
    torch.testing.assert_close(GaussianActorCritic.entropy(log_std, 5), normal.entropy().sum(dim=(-2, -1)))


@pytest.mark.parametrize("kind", ["chunk_regression", "gaussian_actor_critic"])
@pytest.mark.parametrize("lora_rank", [None, 4])
def test_a_row_does_not_depend_on_the_other_rows_of_its_batch(kind: str, lora_rank: int | None) -> None:
    # No batch statistics anywhere: changing rows 1.. must leave row 0's output bit-identical.
    policy = build_policy(tenant_config("a", kind=kind, lora_rank=lora_rank), init_seed=3)
    gen = torch.Generator().manual_seed(2)
    feature = make_feature(gen)
    other = make_feature(gen)
    mixed = VLAFeature.cat([feature.split([1, 3])[0], other.split([1, 3])[1]])
    with torch.no_grad():
        a = policy.act(feature, torch.Generator(), deterministic=True)
        b = policy.act(mixed, torch.Generator(), deterministic=True)
    a, b = (a, b) if kind == "chunk_regression" else (a.action, b.action)
    assert a.shape == (4, CHUNK, ACTION_DIM)
    assert torch.equal(a[0], b[0])
    assert not torch.equal(a[1:], b[1:])


@pytest.mark.parametrize("kind", ["chunk_regression", "gaussian_actor_critic"])
@pytest.mark.parametrize("lora_rank", [None, 4])
@pytest.mark.parametrize("deterministic", [False, True])
def test_act_each_gives_a_row_the_same_action_whichever_rows_act_with_it(kind: str, lora_rank: int | None,
                                                                         deterministic: bool) -> None:
    """What the inference role relies on: a row's action alone, among 7 others, or in the second
    chunk of 40 rows (shuffled) is the same, bit for bit, and its noise comes from its own generator."""
    policy = build_policy(tenant_config("a", kind=kind, lora_rank=lora_rank), init_seed=3)
    rows = make_feature(torch.Generator().manual_seed(6), batch=40).split([1] * 40)
    seeds = list(range(100, 140))

    def actions(order: list[int]) -> dict[int, torch.Tensor]:
        with torch.no_grad():
            outs = policy.act_each([rows[i] for i in order],
                                   [torch.Generator().manual_seed(seeds[i]) for i in order], deterministic)
        return {i: (o if kind == "chunk_regression" else torch.cat([o.action.flatten(), o.log_prob, o.value]))
                for i, o in zip(order, outs, strict=True)}

    alone = {i: actions([i])[i] for i in range(40)}
    order = torch.randperm(40, generator=torch.Generator().manual_seed(1)).tolist()
    for got in (actions(list(range(8))), actions(order)):
        for i, value in got.items():
            assert torch.equal(value, alone[i]), i
    if kind == "gaussian_actor_critic" and not deterministic:
        with torch.no_grad():
            (out,) = policy.act_each([rows[0]], [torch.Generator().manual_seed(seeds[0])])
            (mean,) = policy.act_each([rows[0]], [torch.Generator()], deterministic=True)
        noise = torch.randn((1, CHUNK, ACTION_DIM), generator=torch.Generator().manual_seed(seeds[0]))
        torch.testing.assert_close(out.action, mean.action + noise * policy.head.log_std.exp())


def test_suffix_ignores_padded_tokens() -> None:
    policy = build_policy(tenant_config("a", lora_rank=4), init_seed=0)
    feature = make_feature(torch.Generator().manual_seed(4))
    assert not feature.attention_mask.all()
    noisy = feature.sequence.masked_fill(~feature.attention_mask[..., None], 1e3)
    changed = VLAFeature(noisy, feature.attention_mask, feature.pooled, feature.proprio, feature.task_id)
    with torch.no_grad():
        assert torch.equal(policy.encode(feature), policy.encode(changed))


def test_a_suffix_forward_leaves_the_process_wide_attention_kernel_flags_alone() -> None:
    """torch's attention kernel flags are process-wide: a suffix that pinned its own attention to
    the math kernel switched the backbone's fused kernel off in every other thread meanwhile, so
    shared features depended on timing. Every torch call inside a suffix forward must see the
    flags as the process set them."""
    from torch.overrides import TorchFunctionMode

    class Flags(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: set[tuple[bool, bool]] = set()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.add((torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()))
            return func(*args, **(kwargs or {}))

    policy = build_policy(tenant_config("a", lora_rank=4), init_seed=0)
    feature = make_feature(torch.Generator().manual_seed(4))
    before = (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled())
    with torch.no_grad(), Flags() as mode:
        policy.encode(feature)
    assert mode.seen == {before}


def test_the_suffix_attention_is_the_math_kernels() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tenants.suffix import attention

    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 2, 7, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 4:] = False
    with sdpa_kernel(SDPBackend.MATH):
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
    assert torch.allclose(attention(q, k, v, mask), expected, rtol=0, atol=1e-12)


def test_suffix_trains_only_lora_adapters_of_the_chosen_rank() -> None:
    for rank in (4, 8):
        policy = build_policy(tenant_config("a", lora_rank=rank), init_seed=0)
        trainable = {n: p for n, p in policy.suffix.named_parameters() if p.requires_grad}
        frozen = {n for n, p in policy.suffix.named_parameters() if not p.requires_grad}
        assert trainable and all("lora_" in n for n in trainable)
        assert any(n.endswith("q_proj.base_layer.weight") for n in frozen)
        # in_proj 32->16, q/k/v/o 16->16, fc1 16->64, fc2 64->16: r * (in + out) each
        assert sum(p.numel() for p in trainable.values()) == rank * (48 + 4 * 32 + 80 + 80)
        assert all(p.requires_grad for p in policy.head.parameters())


def test_building_is_deterministic_and_leaves_the_global_rng_alone() -> None:
    config = tenant_config("a", kind="gaussian_actor_critic", lora_rank=4)
    before = torch.get_rng_state()
    a, b, c = (build_policy(config, seed) for seed in (7, 7, 8))
    assert torch.equal(torch.get_rng_state(), before)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        if "base_layer" in name or "norm" in name:  # the shared frozen base comes from base_seed
            assert torch.equal(pa, pc), name
    assert not torch.equal(a.head.actor[1].weight, c.head.actor[1].weight)


def test_policies_built_in_threads_at_once_equal_the_same_builds_alone() -> None:
    """Where roles share a process, the master builds a tenant's first version while inference and
    the optimizer rebuild other tenants' slots in worker threads. Each build seeds the process's
    global generator; without one lock over seed-then-draw their draws interleaved (1,464 of
    1,600 builds differed, 8 threads)."""
    configs = [tenant_config(f"t{i}", kind=kind, lora_rank=rank, seed=i)
               for i, (kind, rank) in enumerate([("gaussian_actor_critic", 4), ("chunk_regression", None),
                                                  ("gaussian_actor_critic", None), ("chunk_regression", 2)])]
    alone = [{k: v.clone() for k, v in build_policy(c, 100 + i).state_dict().items()}
             for i, c in enumerate(configs)]
    differing: list[tuple[int, int]] = []

    def build(i: int) -> None:
        for attempt in range(40):
            state = build_policy(configs[i], 100 + i).state_dict()
            if any(not torch.equal(state[k], alone[i][k]) for k in state):
                differing.append((i, attempt))

    threads = [threading.Thread(target=build, args=(i,)) for i in range(len(configs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not differing, f"{len(differing)} of {40 * len(configs)} builds differ from alone: {differing[:5]}"


def test_sampling_draws_only_from_the_given_generator() -> None:
    policy = build_policy(tenant_config("a", kind="gaussian_actor_critic"), init_seed=0)
    feature = make_feature(torch.Generator().manual_seed(5))
    before = torch.get_rng_state()
    with torch.no_grad():
        a = policy.act(feature, torch.Generator().manual_seed(9))
        b = policy.act(feature, torch.Generator().manual_seed(9))
        c = policy.act(feature, torch.Generator().manual_seed(10))
        mean = policy.act(feature, torch.Generator(), deterministic=True)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(a.action, b.action) and torch.equal(a.log_prob, b.log_prob)
    assert not torch.equal(a.action, c.action)
    assert torch.equal(mean.action, policy.head(policy.encode(feature))[0])
    assert a.log_prob.shape == a.entropy.shape == a.value.shape == (4,)


# ---- losses and schedule -----------------------------------------------------------------------

def test_ppo_loss_at_the_rollout_policy() -> None:
    gen = torch.Generator().manual_seed(6)
    log_prob = torch.randn(8, generator=gen)
    adv, ret, value = (torch.randn(8, generator=gen) for _ in range(3))
    entropy = torch.full((8,), 1.5)
    targets = PPOTargets(torch.zeros(8, 1, 1), log_prob.clone(), adv, ret)
    cfg = PPOConfig(value_coef=0.5, entropy_coef=0.01)
    loss, metrics = ppo_loss(log_prob, entropy, value, targets, cfg)
    value_loss = 0.5 * (ret - value).square().mean()
    torch.testing.assert_close(loss, -adv.mean() + 0.5 * value_loss - 0.01 * 1.5)
    assert metrics["approx_kl"] == 0 and metrics["clip_fraction"] == 0
    # a ratio far above 1 + eps with positive advantages is clipped: no gradient through the ratio
    pushed = (log_prob + 1.0).requires_grad_()
    favoured = PPOTargets(targets.actions, log_prob, adv.abs(), ret)
    loss, metrics = ppo_loss(pushed, entropy, value, favoured, cfg)
    loss.backward()
    assert metrics["clip_fraction"] == 1 and torch.count_nonzero(pushed.grad) == 0


def test_learning_rate_schedule() -> None:
    cfg = OptimConfig(lr=1.0, warmup_steps=4, decay_steps=10, min_lr_ratio=0.1)
    assert [learning_rate(cfg, s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert learning_rate(cfg, 4) == 1.0
    assert math.isclose(learning_rate(cfg, 9), 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert learning_rate(cfg, 14) == learning_rate(cfg, 1000) == pytest.approx(0.1)
    assert learning_rate(OptimConfig(lr=0.5), 123) == 0.5


def test_sft_trains_the_actor_mean_of_a_gaussian_head() -> None:
    slot = TenantSlot(tenant_config("a", kind="gaussian_actor_critic")).mount()
    gen = torch.Generator().manual_seed(0)
    feature, targets = make_feature(gen), sft_targets(gen)
    losses = [slot.train_step(feature, targets)["l1"] for _ in range(30)]
    assert losses[-1] < losses[0] * 0.7
