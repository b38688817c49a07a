"""The simulators' table in the README, measured: steps/s (state, RGB) and scripted-expert success.

    python -m benchmarks.envs_table [--envs joynexus/Reach-v0,Pendulum-v1] [--steps 500]
                                    [--episodes 50] [--json PATH]

Per env: ``steps/s`` of the guarded simulator stepping random actions with
``obs_mode="state"`` and with ``obs_mode="rgb"`` at 64 px (resets included,
one process, one torch-free loop); ``expert success`` is the share of episodes
the scripted expert finishes (seeds 0..episodes-1, no noise), when it has one.
ManiSkill envs are skipped when no Vulkan device answers.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from envs import ENVS, make_expert, make_simulator, vulkan_available
from infra.errors import ConfigError

DEFAULT_ENVS = ("joynexus/Reach-v0", "joynexus/Push-v0", "Pendulum-v1", "Reacher-v5", "Pusher-v5",
                "PushCube-v1", "PickCube-v1")


def steps_per_s(env_id: str, obs_mode: str, steps: int) -> float:
    sim = make_simulator(env_id, obs_mode=obs_mode, image_size=64)
    rng = np.random.default_rng(0)
    try:
        sim.reset(0)
        began = time.perf_counter()
        for i in range(steps):
            out = sim.step(rng.uniform(-1, 1, sim.spec.action_dim).astype(np.float32))
            if out.terminated or out.truncated:
                sim.reset(i + 1)
        return steps / (time.perf_counter() - began)
    finally:
        sim.close()


def expert_success(env_id: str, episodes: int) -> float | None:
    try:
        expert = make_expert(env_id)
    except ConfigError:
        return None
    sim = make_simulator(env_id, obs_mode="state")
    wins = 0
    try:
        for seed in range(episodes):
            expert.reset(seed)
            obs, done, success = sim.reset(seed), False, False
            while not done:
                out = sim.step(expert.act(obs, sim))
                obs, done, success = out.obs, out.terminated or out.truncated, success or out.success
            wins += success
    finally:
        sim.close()
    return wins / episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default=",".join(DEFAULT_ENVS))
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for env_id in args.envs.split(","):
        if ENVS[env_id.split("?")[0]].family == "maniskill" and not vulkan_available():
            print(f"skipped {env_id}: no Vulkan device")
            continue
        rows.append({"env": env_id, "state_steps_per_s": steps_per_s(env_id, "state", args.steps),
                     "rgb64_steps_per_s": steps_per_s(env_id, "rgb", max(args.steps // 5, 20)),
                     "expert_success": expert_success(env_id, args.episodes),
                     "expert_episodes": args.episodes})
    print("| env | steps/s state | steps/s RGB 64 px | expert success |")
    print("|---|---|---|---|")
    for r in rows:
        rate = r["expert_success"]
        success = "-" if rate is None else f"{rate:.0%} of {r['expert_episodes']}"
        print(f"| {r['env']} | {r['state_steps_per_s']:.0f} | {r['rgb64_steps_per_s']:.0f} | {success} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
