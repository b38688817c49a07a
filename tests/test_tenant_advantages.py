"""GAE against hand-computed episodes and its limiting cases; normalisation; minibatch order."""

from __future__ import annotations

import numpy as np
import pytest

from tenants.advantages import gae, normalize_advantages, ppo_minibatches

REWARDS = np.array([1.0, 0.0, 2.0])
VALUES = np.array([0.5, 1.0, 1.5])
GAMMA, LAM = 0.9, 0.8  # gamma * lam = 0.72

# By hand: delta_t = r_t + gamma * V_{t+1} - V_t, A_t = delta_t + gamma * lam * A_{t+1}, returns = A + V.
# deltas of steps 0 and 1 are 1 + 0.9*1.0 - 0.5 = 1.4 and 0 + 0.9*1.5 - 1.0 = 0.35 in every case.
CASES = {
    # terminated: V_3 = 0, delta_2 = 2 - 1.5 = 0.5
    "terminated": (True, None, [1.9112, 0.71, 0.5]),
    # truncated, no bootstrap: V_3 = values[-1] = 1.5, delta_2 = 2 + 1.35 - 1.5 = 1.85
    "truncated": (False, None, [2.61104, 1.682, 1.85]),
    # truncated, bootstrap 2.0: delta_2 = 2 + 1.8 - 1.5 = 2.3
    "bootstrapped": (False, 2.0, [2.84432, 2.006, 2.3]),
}


@pytest.mark.parametrize("case", CASES)
def test_gae_matches_a_hand_computed_episode(case):
    terminated, bootstrap, expected = CASES[case]
    adv, ret = gae(REWARDS, VALUES, terminated, GAMMA, LAM, bootstrap_value=bootstrap)
    assert adv.dtype == ret.dtype == np.float32
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    np.testing.assert_allclose(ret, np.array(expected) + VALUES, rtol=1e-6)


def test_terminated_ignores_the_bootstrap_value():
    a = gae(REWARDS, VALUES, True, GAMMA, LAM)
    b = gae(REWARDS, VALUES, True, GAMMA, LAM, bootstrap_value=100.0)
    np.testing.assert_array_equal(a[0], b[0])


@pytest.mark.parametrize(("terminated", "bootstrap", "tail"), [(True, None, 0.0), (False, 3.0, 3.0)])
def test_gamma_and_lambda_one_give_the_reward_to_go(terminated, bootstrap, tail):
    rng = np.random.default_rng(0)
    rewards, values = rng.normal(size=20), rng.normal(size=20)
    adv, ret = gae(rewards, values, terminated, 1.0, 1.0, bootstrap_value=bootstrap)
    reward_to_go = np.cumsum(rewards[::-1])[::-1] + tail
    np.testing.assert_allclose(ret, reward_to_go, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(adv, reward_to_go - values, rtol=1e-5, atol=1e-5)


def test_lambda_zero_gives_one_step_td_errors():
    rng = np.random.default_rng(1)
    rewards, values = rng.normal(size=10), rng.normal(size=10)
    adv, _ = gae(rewards, values, False, 0.95, 0.0, bootstrap_value=0.7)
    next_values = np.append(values[1:], 0.7)
    np.testing.assert_allclose(adv, rewards + 0.95 * next_values - values, rtol=1e-5, atol=1e-6)


def test_one_step_episode():
    adv, ret = gae(np.array([1.0]), np.array([0.25]), True, 0.99, 0.95)
    np.testing.assert_allclose(adv, [0.75])
    np.testing.assert_allclose(ret, [1.0])


@pytest.mark.parametrize(("rewards", "values", "gamma", "lam"), [
    (np.zeros(3), np.zeros(2), 0.9, 0.9),  # lengths differ
    (np.zeros(0), np.zeros(0), 0.9, 0.9),  # empty episode
    (np.zeros((2, 2)), np.zeros((2, 2)), 0.9, 0.9),  # not one episode
    (np.zeros(3), np.zeros(3), 1.5, 0.9),
    (np.zeros(3), np.zeros(3), 0.9, -0.1),
])
def test_gae_refuses_bad_input(rewards, values, gamma, lam):
    with pytest.raises(ValueError):
        gae(rewards, values, True, gamma, lam)


def test_normalize_advantages():
    out = normalize_advantages(np.array([1.0, 2.0, 3.0, 6.0]))
    assert out.dtype == np.float32
    assert abs(out.mean()) < 1e-6
    np.testing.assert_allclose(out.std(), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(normalize_advantages(np.array([5.0])), np.zeros(1, dtype=np.float32))
    # no spread: eps keeps it finite, and it is all zeros
    np.testing.assert_array_equal(normalize_advantages(np.full(4, 2.0)), np.zeros(4, dtype=np.float32))


def test_minibatches_cover_every_index_once_per_epoch():
    batches = ppo_minibatches(n=10, minibatch_size=4, epochs=3, seed=7, iteration=2)
    assert [len(b) for b in batches] == [4, 4, 2] * 3
    for epoch in range(3):
        seen = np.concatenate(batches[3 * epoch:3 * epoch + 3])
        np.testing.assert_array_equal(np.sort(seen), np.arange(10))
    # the epochs are shuffled independently
    assert not np.array_equal(np.concatenate(batches[:3]), np.concatenate(batches[3:6]))


def test_minibatches_are_a_pure_function_of_their_arguments():
    def order(**overrides):
        args = dict(n=64, minibatch_size=16, epochs=2, seed=3, iteration=5) | overrides
        return np.concatenate(ppo_minibatches(**args))

    np.testing.assert_array_equal(order(), order())
    np.testing.assert_array_equal(
        np.concatenate(ppo_minibatches(64, 16, 2, 3, 5)[:4]),
        np.random.default_rng([3, 5, 0]).permutation(64))
    assert not np.array_equal(order(), order(iteration=6))
    assert not np.array_equal(order(), order(seed=4))


def test_minibatch_larger_than_the_batch_is_one_minibatch():
    batches = ppo_minibatches(n=5, minibatch_size=128, epochs=2, seed=0, iteration=0)
    assert [len(b) for b in batches] == [5, 5]


@pytest.mark.parametrize("args", [
    (0, 4, 1, 0, 0), (4, 0, 1, 0, 0), (4, 4, 0, 0, 0), (4, 4, 1, -1, 0), (4, 4, 1, 0, -1),
])
def test_minibatches_refuse_bad_arguments(args):
    with pytest.raises(ValueError):
        ppo_minibatches(*args)
