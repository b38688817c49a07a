"""Sync PPO on the built-in Reach task without the bus: the service's pipeline in one process, for tuning.

    python -m benchmarks.ppo_tuning '{"seed": 0, "steps": 30, "rl": {...}, "optim": {...}}'
                                    [--eval-every N] [--held-out 24]

The same pieces the roles use, in the same order: the job spec compiled by
``consumers.master.plan`` (module config, episode seeds), the frozen backbone
(``JOYNEXUS_BACKBONE``, default the tiny preset here), the tenant slot, the
inference role's per-(seed, episode, step) action noise, ``gae``,
``normalize_advantages`` and ``ppo_minibatches``, then ``slot.train_step`` per
minibatch. A row's feature equals its forward alone, so features are computed
once per step and reused for every epoch (what the service recomputes). On the
runs compared it printed the same iteration returns and the same final policy
score as the service (tests/test_service.py): it is a tuning tool, the service
stays the reference. Prints, per iteration, the sampled episodes' mean return,
success and length, and every ``--eval-every`` iterations the policy's
deterministic (mean return, success rate) on ``--held-out`` fixed episodes
(seeds from 1,000,000, as ``tests/service_helpers.held_out``).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from backbone.feature import VLAFeature
from backbone.info import set_torch_threads
from backbone.inputs import VLARequest
from backbone.model import Backbone
from consumers.inference import action_generator
from consumers.master import plan
from envs import make_simulator
from infra.settings import Settings
from schemas.jobspec import JobSpec
from tenants.advantages import gae, normalize_advantages, ppo_minibatches
from tenants.slot import TenantSlot
from tenants.targets import PPOTargets

HELD_OUT_SEED = 1_000_000
FIELDS = ("sequence", "attention_mask", "pooled", "proprio", "task_id")


class Runner:
    def __init__(self, spec: JobSpec, backbone: Backbone):
        self.spec, self.backbone = spec, backbone
        dims = plan.env_dims(spec)
        self.slot = TenantSlot(plan.tenant_config(spec, backbone.info.hidden_size, dims)).mount()
        env = spec.env
        self.sims = [make_simulator(env.env_id, obs_mode=env.obs_mode, image_size=env.image_size,
                                    max_episode_steps=env.max_episode_steps)
                     for _ in range(spec.rl.episodes_per_iteration)]

    def _features(self, observations) -> list[VLAFeature]:
        requests = [VLARequest(self.spec.tenant, [o.image] if o.image.ndim == 3 else list(o.image),
                               o.instruction, np.concatenate([o.proprio, o.state]).astype(np.float32))
                    for o in observations]
        return VLAFeature.cat(self.backbone.forward([self.backbone.prepare(r) for r in requests])).split(
            [1] * len(requests))

    def play(self, seeds: list[int], deterministic: bool) -> list[list[tuple]]:
        """Episodes in lockstep (one forward per step for all of them); per step (feature, action,
        log_prob, value, reward, terminated, success)."""
        obs = [self.sims[i].reset(s) for i, s in enumerate(seeds)]
        alive, episodes, step = [True] * len(seeds), [[] for _ in seeds], 0
        while any(alive):
            live = [i for i in range(len(seeds)) if alive[i]]
            features = self._features([obs[i] for i in live])
            with torch.no_grad():  # as the inference role: one act_each for the rows acting together
                outs = self.slot.policy.act_each(
                    features, [action_generator(self.spec.seed, seeds[i], step) for i in live], deterministic)
            for feature, out, i in zip(features, outs, live, strict=True):
                action = out.action[0].numpy().astype(np.float32)
                result = self.sims[i].step(action.reshape(-1))
                episodes[i].append((feature, action, float(out.log_prob[0]), float(out.value[0]),
                                    result.reward, result.terminated, result.success))
                obs[i] = result.obs
                alive[i] = not (result.terminated or result.truncated)
            step += 1
        return episodes

    def held_out(self, episodes: int) -> tuple[float, float]:
        played = []
        for first in range(0, episodes, len(self.sims)):
            count = min(len(self.sims), episodes - first)
            played += self.play([HELD_OUT_SEED + first + k for k in range(count)], True)
        return (float(np.mean([sum(s[4] for s in e) for e in played])),
                float(np.mean([e[-1][6] for e in played])))

    def iteration(self, k: int) -> dict[str, float]:
        rl, e = self.spec.rl, self.spec.rl.episodes_per_iteration
        episodes = self.play([plan.train_seed(self.spec) + k * e + i for i in range(e)], False)
        advantages, returns = [], []
        for ep in episodes:
            adv, ret = gae(np.array([s[4] for s in ep]), np.array([s[3] for s in ep]), ep[-1][5],
                           rl.gamma, rl.gae_lambda)
            advantages.append(adv)
            returns.append(ret)
        rows = [s for ep in episodes for s in ep]
        adv = normalize_advantages(np.concatenate(advantages))
        ret = np.concatenate(returns).astype(np.float32)
        feature = VLAFeature.cat([s[0] for s in rows])
        actions = torch.tensor(np.stack([s[1] for s in rows]))
        log_probs = torch.tensor([s[2] for s in rows])
        for idx in ppo_minibatches(len(rows), rl.minibatch_size, rl.ppo_epochs, self.spec.seed, k):
            take = torch.tensor(idx)
            self.slot.train_step(VLAFeature(*(getattr(feature, n)[take] for n in FIELDS)),
                                 PPOTargets(actions[take], log_probs[take], torch.tensor(adv[idx]),
                                            torch.tensor(ret[idx])))
        return {"mean_return": float(np.mean([sum(s[4] for s in ep) for ep in episodes])),
                "success_rate": float(np.mean([ep[-1][6] for ep in episodes])),
                "mean_length": float(np.mean([len(ep) for ep in episodes]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", help="JSON: seed, steps (episode limit), rl, optim, modules")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--held-out", type=int, default=24)
    parser.add_argument("--preset", default="tiny")
    args = parser.parse_args()
    given = json.loads(args.spec)
    settings = Settings()
    set_torch_threads(settings.torch_threads)
    spec = JobSpec.parse(json.dumps({
        "kind": "rl", "tenant": "tuning", "job_id": "tuning", "seed": given.get("seed", 0),
        "env": {"max_episode_steps": given.get("steps", 30)}, "rl": given.get("rl", {}),
        "optim": given.get("optim", {}), "modules": given.get("modules", {})}))
    runner = Runner(spec, Backbone.from_preset(args.preset, settings.model_dir))
    began = time.monotonic()
    ret, success = runner.held_out(args.held_out)
    print(f"held-out before: return {ret:.2f}, success {success:.2f}")
    for k in range(spec.rl.iterations):
        m = runner.iteration(k)
        print(f"iteration {k}: sampled return {m['mean_return']:.2f}, success {m['success_rate']:.2f}, "
              f"length {m['mean_length']:.1f}")
        if (k + 1) % args.eval_every == 0 or k == spec.rl.iterations - 1:
            ret, success = runner.held_out(args.held_out)
            print(f"  held-out after {k + 1} iterations: return {ret:.2f}, success {success:.2f}")
    print(f"{time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
