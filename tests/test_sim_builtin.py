"""The built-in 2D tasks: pure functions of the seed, images that show what the instruction names, experts."""

from __future__ import annotations

import numpy as np
import pytest

from envs import InvalidAction, SimObs, SimStep, make_expert, make_simulator
from envs.builtin import COLORS

BUILTIN = ["joynexus/Reach-v0", "joynexus/Push-v0"]


def rollout(sim, seed: int, steps: int, action_seed: int = 0) -> list[SimObs | SimStep]:
    """An episode from ``reset(seed)`` under seeded random actions (stops early when the episode ends)."""
    actions = np.random.default_rng(action_seed).uniform(-1, 1, size=(steps, sim.spec.action_dim))
    out: list[SimObs | SimStep] = [sim.reset(seed)]
    for action in actions:
        out.append(sim.step(action.astype(np.float32)))
        if out[-1].terminated or out[-1].truncated:
            break
    return out


def assert_same_rollout(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if isinstance(x, SimStep):
            assert (x.reward, x.terminated, x.truncated, x.success) == (y.reward, y.terminated, y.truncated,
                                                                         y.success)
            x, y = x.obs, y.obs
        assert x.instruction == y.instruction
        for name in ("proprio", "image", "state"):
            left, right = getattr(x, name), getattr(y, name)
            assert (left is None) == (right is None)
            if left is not None:
                np.testing.assert_array_equal(left, right)


def run_expert(sim, expert, seed: int) -> bool:
    obs = sim.reset(seed)
    expert.reset(seed)
    while True:
        out = sim.step(expert.act(obs, sim))
        obs = out.obs
        if out.terminated or out.truncated:
            return out.success


@pytest.mark.parametrize("env_id", [*BUILTIN, "joynexus/Faulty-v0?at_step=1000"])
@pytest.mark.parametrize("obs_mode", ["rgb", "state", "rgb+state"])
def test_an_episode_is_a_pure_function_of_its_seed(env_id: str, obs_mode: str) -> None:
    sim = make_simulator(env_id, obs_mode=obs_mode, cameras=2 if obs_mode != "state" else 1)
    first = rollout(sim, seed=7, steps=30)
    other = rollout(sim, seed=8, steps=30)
    again = rollout(sim, seed=7, steps=30)
    fresh = rollout(make_simulator(env_id, obs_mode=obs_mode, cameras=2 if obs_mode != "state" else 1),
                    seed=7, steps=30)
    assert_same_rollout(first, again)
    assert_same_rollout(first, fresh)
    assert not np.array_equal(first[0].proprio, other[0].proprio)


@pytest.mark.parametrize("env_id", BUILTIN)
def test_observations_match_the_spec(env_id: str) -> None:
    sim = make_simulator(env_id, obs_mode="rgb+state", image_size=32, cameras=2)
    spec = sim.spec
    assert (spec.action_dim, spec.proprio_dim, spec.max_episode_steps, spec.cameras) == (2, 4, 50, 2)
    assert spec.state_dim == (8 if env_id.endswith("Reach-v0") else 10)
    obs = sim.reset(0)
    assert obs.image.shape == (2, 32, 32, 3) and obs.image.dtype == np.uint8
    assert obs.proprio.dtype == np.float32 and obs.state.dtype == np.float32
    state_only = make_simulator(env_id, obs_mode="state").reset(0)
    assert state_only.image is None and state_only.state is not None
    rgb_only = make_simulator(env_id, obs_mode="rgb").reset(0)
    assert rgb_only.image.shape == (1, 64, 64, 3) and rgb_only.state is None
    np.testing.assert_array_equal(rgb_only.proprio, state_only.proprio)


@pytest.mark.parametrize("env_id", BUILTIN)
def test_the_instruction_names_the_colour_drawn_at_the_goal(env_id: str) -> None:
    sim = make_simulator(env_id, obs_mode="rgb", image_size=64)
    instructions = set()
    for seed in range(20):
        obs = sim.reset(seed)
        truth = sim.privileged()
        color = next(c for c in COLORS if f" {c} " in f" {obs.instruction} ")
        instructions.add(obs.instruction)
        x, y = truth["goal"]
        # Pixel at the goal's rim (the block or the agent may cover its centre).
        col = int((x + 1) / 2 * 64)
        row = int((1 - (y + 0.09)) / 2 * 64)
        pixel = tuple(int(v) for v in obs.image[0, row, col])
        assert pixel == COLORS[color], (seed, obs.instruction, pixel)
        others = {tuple(int(v) for v in obs.image[0, int((1 - t[1]) / 2 * 64), int((t[0] + 1) / 2 * 64)])
                  for t in truth["targets"][1:]}
        assert COLORS[color] not in others  # the distractor has another colour: language matters
    assert len(instructions) >= 3


@pytest.mark.parametrize("env_id", BUILTIN)
def test_the_episode_limit_truncates_and_then_steps_are_refused(env_id: str) -> None:
    sim = make_simulator(env_id, obs_mode="state", max_episode_steps=5)
    sim.reset(0)
    outs = [sim.step(np.zeros(2, dtype=np.float32)) for _ in range(5)]
    assert [o.truncated for o in outs] == [False] * 4 + [True]
    with pytest.raises(InvalidAction, match="no running episode"):
        sim.step(np.zeros(2, dtype=np.float32))


def test_actions_are_clipped_to_the_bounds() -> None:
    a, b = make_simulator("joynexus/Reach-v0", obs_mode="state"), make_simulator("joynexus/Reach-v0",
                                                                              obs_mode="state")
    a.reset(3)
    b.reset(3)
    np.testing.assert_array_equal(a.step(np.array([5.0, -9.0])).obs.proprio,
                                  b.step(np.array([1.0, -1.0])).obs.proprio)


# Measured: Reach 1000/1000 and Push 1000/1000 with noise 0; with noise 0.3, 1000/1000 and 995/1000.
@pytest.mark.parametrize(("env_id", "noise", "threshold"), [
    ("joynexus/Reach-v0", 0.0, 1.0), ("joynexus/Push-v0", 0.0, 0.97), ("joynexus/Push-v0", 0.3, 0.95),
])
def test_the_scripted_expert_succeeds(env_id: str, noise: float, threshold: float) -> None:
    sim = make_simulator(env_id, obs_mode="state")
    expert = make_expert(env_id, noise=noise)
    successes = [run_expert(sim, expert, seed) for seed in range(200)]
    assert np.mean(successes) >= threshold


def test_a_do_nothing_policy_fails_so_success_is_not_free() -> None:
    sim = make_simulator("joynexus/Push-v0", obs_mode="state")
    successes = []
    for seed in range(20):
        sim.reset(seed)
        while True:
            out = sim.step(np.zeros(2, dtype=np.float32))
            if out.terminated or out.truncated:
                break
        successes.append(out.success)
    assert not any(successes)


def episode_return(sim, seed: int, policy) -> tuple[float, bool]:
    """Return and success of one episode, ``policy(sim) -> action`` reading the simulator's truth."""
    sim.reset(seed)
    total = 0.0
    while True:
        out = sim.step(policy(sim))
        total += out.reward
        if out.terminated or out.truncated:
            return total, out.success


def _toward(offset: np.ndarray) -> np.ndarray:
    action = offset / 0.1  # SPEED: the action that covers the offset in one step, clipped by the sim
    return np.clip(action, -1.0, 1.0).astype(np.float32)


@pytest.mark.parametrize("env_id", BUILTIN)
def test_reaching_the_goal_pays_more_than_hovering_next_to_it(env_id: str) -> None:
    """The reward must pay success: a policy that stops just outside the success tolerance (Reach:
    the agent 0.15 from the goal; Push: the agent parked beside the block) earns less than the
    scripted expert on every seed, whose episodes end early on success."""
    sim = make_simulator(env_id, obs_mode="state", max_episode_steps=50)
    expert = make_expert(env_id, noise=0.0)

    def hover(s) -> np.ndarray:
        truth = s.privileged()
        if env_id.endswith("Reach-v0"):
            offset = truth["goal"] - truth["agent"]
            aim = truth["goal"] - offset / max(np.linalg.norm(offset), 1e-9) * 0.15
        else:  # beside the block, on the side away from the goal, never pushing it
            away = truth["block"] - truth["goal"]
            aim = truth["block"] + away / max(np.linalg.norm(away), 1e-9) * 0.2
        return _toward(aim - truth["agent"])

    for seed in range(20):
        expert.reset(seed)
        reached, success = episode_return(sim, seed, lambda s: expert.act(None, s))
        hovered, hover_success = episode_return(sim, seed, hover)
        assert success and not hover_success, (seed, success, hover_success)
        assert reached > hovered + 1.0, (seed, reached, hovered)
