"""PPO's bookkeeping between rollouts and gradient steps: GAE, advantage normalisation, minibatch order.

The rollout role turns a finished episode into advantages and value targets and
then cuts an iteration's samples into minibatches. These are pure functions of
their arguments (numpy only, no torch, no Kafka) so that a replayed rollout
stream gives bit-identical gradient jobs, whichever worker computes them.
"""

from __future__ import annotations

import numpy as np

__all__ = ["gae", "normalize_advantages", "ppo_minibatches"]


def gae(rewards: np.ndarray, values: np.ndarray, terminated: bool, gamma: float, lam: float,
        bootstrap_value: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation over ONE episode: returns ``(advantages, returns)``, float32 ``[T]``.

    ``values[t]`` is the critic's estimate at the observation of step ``t``. The value after the
    last step is 0 when the episode ``terminated``; when it was truncated (time limit) it is
    ``bootstrap_value``, or ``values[-1]`` when that is None. That fallback is an approximation:
    rollouts do not record the observation after the last step, so its value is unknown and the
    last step's own estimate stands in for it. Returns are ``advantages + values`` (the value
    targets of PPO).
    """
    r = np.asarray(rewards, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if r.ndim != 1 or r.shape != v.shape or r.size == 0:
        raise ValueError(f"rewards and values must be non-empty 1-D arrays of one length, "
                         f"got shapes {r.shape} and {v.shape}")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must lie in [0, 1], got gamma={gamma}, lam={lam}")
    if bootstrap_value is None:
        bootstrap_value = float(v[-1])
    last = 0.0 if terminated else float(bootstrap_value)
    next_values = np.append(v[1:], last)
    deltas = r + gamma * next_values - v
    advantages = np.empty_like(deltas)
    running = 0.0
    # float64 accumulation: long episodes with gamma*lam near 1 lose precision in float32
    for t in range(r.size - 1, -1, -1):
        running = deltas[t] + gamma * lam * running
        advantages[t] = running
    return advantages.astype(np.float32), (advantages + v).astype(np.float32)


def normalize_advantages(adv: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """``(adv - mean) / (std + eps)`` over the whole batch, float32; one sample (no spread) gives zeros.

    ``std`` is the population standard deviation (ddof=0), defined for every batch size.
    """
    a = np.asarray(adv, dtype=np.float64).reshape(-1)
    if a.size <= 1:
        return np.zeros(a.shape, dtype=np.float32)
    return ((a - a.mean()) / (a.std() + eps)).astype(np.float32)


def ppo_minibatches(n: int, minibatch_size: int, epochs: int, seed: int, iteration: int) -> list[np.ndarray]:
    """Sample indices ``[0, n)`` cut into minibatches, epoch after epoch (int64 arrays).

    Each epoch is a fresh permutation drawn from ``np.random.default_rng([seed, iteration, epoch])``,
    so the order depends on nothing but the arguments (no hidden RNG state survives a restart) and
    every index appears exactly once per epoch; an epoch's last minibatch holds the remainder
    and may be smaller.
    """
    if n < 1 or minibatch_size < 1 or epochs < 1:
        raise ValueError(f"n, minibatch_size and epochs must be >= 1, "
                         f"got n={n}, minibatch_size={minibatch_size}, epochs={epochs}")
    if seed < 0 or iteration < 0:
        raise ValueError(f"seed and iteration must be >= 0, got seed={seed}, iteration={iteration}")
    batches: list[np.ndarray] = []
    for epoch in range(epochs):
        order = np.random.default_rng([seed, iteration, epoch]).permutation(n)
        batches.extend(order[start:start + minibatch_size] for start in range(0, n, minibatch_size))
    return batches
