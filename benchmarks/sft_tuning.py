"""SFT on recorded Reach demonstrations without the bus: the service's SFT pipeline in one process.

    python -m benchmarks.sft_tuning '{"seed": 3, "sft": {...}, "optim": {...}, "modules": {...},
                                      "dataset": {"episodes": 60, "image_size": 32, "steps": 30}}'
                                    [--eval-every N] [--held-out 24] [--eval-seed 7] [--dataset DIR]

The same pieces the roles use, in the same order: the dataset recorded by the scripted expert as
``infra/runtime/demo.py``'s ``ensure_dataset`` records it (seed 0, rgb, unless ``--dataset`` names
one), the job spec compiled by ``consumers.master.plan`` (dataset widths, module config), the frozen
backbone (``--preset``, default the tiny one), the tenant slot, the feeder's batches
(``layout_batches``: a seeded shuffle per epoch, the last batch shorter, capped by
``limits.max_steps``) and ``slot.train_step`` per batch. A row's feature equals its forward alone,
so every sample's feature is computed once and reused for every epoch (what the service's feature
cache does after the first epoch).

Evaluation is the evaluator's: the demo's ``eval_spec`` (Reach, obs_mode rgb, proprio without the
state, the dataset's image size, 30 steps, spec seed 7), so episode k resets with
``EVAL_SEED_BASE + train_seed(seed 7) + k``, and the policy acts deterministically; the env executes
the first row of the predicted chunk. Printed: per epoch the mean train loss (L1) of its batches, and
every ``--eval-every`` epochs the held-out (mean return, success rate); before training, the
untrained modules' (the job's version 1).

``--state`` records the dataset with ``rgb+state`` and lets the state vector (agent, velocity,
target positions) join proprio in training AND evaluation, as the service does for a job with
``dataset.state_in_proprio`` (and RL tenants with ``env.state_in_proprio``); the demo's SFT tenant
runs that way. ``dataset.noise`` (expert action noise, ``make_expert(noise=...)``) is a what-if the
service does not offer.

Measured (tiny backbone, demo dataset, 24 held-out episodes, success before -> after):
* the service's own run of the quick demo's spec (20 demos, 2 epochs, batch 32, lr 1e-3, seed 3;
  tests' ``running_stack`` + the demo's ``eval_spec``) scored v1 -5.98 / 0.00 and final -5.50 / 0.00,
  as this script does (and as the last ``make demo`` printed);
* rgb only (the service's default): at most 0.17 (60 demos, up to 40 epochs, hidden 128-256,
  lr 1e-3-3e-3, expert noise 0-0.6; also 0.12 with ``mini-pretrained``). A linear probe of the tiny
  backbone's features does not find the target (held-out R^2 of its position ~0.1 from the token
  states); the expert's action is predicted from proprio's velocity alone (R^2 0.90), so cloning
  learns "keep going" and the first step's direction is a guess;
* ``--state``, 60 demos, 40 epochs, batch 32, lr 3e-3, hidden 256: 0.79 / 0.71 / 0.71 (seeds 0 / 1 / 3);
  20 demos, 40 epochs, batch 16: 0.33 / 0.33 / 0.42.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from backbone.feature import VLAFeature
from backbone.info import set_torch_threads
from backbone.inputs import VLARequest
from backbone.model import Backbone
from consumers.master import plan
from envs import make_expert, make_simulator
from infra.settings import Settings
from producers.dataset.format import layout_batches
from producers.dataset.generate import generate_dataset
from schemas.jobspec import JobSpec
from tenants.slot import TenantSlot
from tenants.targets import SFTTargets

FIELDS = ("sequence", "attention_mask", "pooled", "proprio", "task_id")
EVAL_SPEC_SEED = 7  # infra/runtime/demo.py eval_spec
FORWARD_ROWS = 32


def demo_dataset(episodes: int, image_size: int, steps: int, seed: int = 0, noise: float = 0.0,
                 state: bool = False, root: Path | None = None) -> Path:
    """The demo's expert dataset (``ensure_dataset``; ``noise``: the expert's action noise, relative to
    the action half-range), recorded once under ``root``."""
    root = root or Path(tempfile.gettempdir()) / "joynexus-sft-tuning"
    name = (f"reach-expert-{episodes}-s{seed}-i{image_size}-t{steps}" + (f"-n{noise:g}" if noise else "")
            + ("-state" if state else ""))
    path = root / name
    if not (path / "meta.json").exists():
        generate_dataset("joynexus/Reach-v0", path, episodes, seed=seed,
                         obs_mode="rgb+state" if state else "rgb", image_size=image_size,
                         expert=make_expert("joynexus/Reach-v0", noise=noise), max_episode_steps=steps,
                         overwrite=True, progress=False)
    return path


class Runner:
    def __init__(self, spec: JobSpec, backbone: Backbone, settings: Settings, state: bool = False):
        self.spec, self.backbone, self.state = spec, backbone, state
        dims, self.dataset = plan.dataset_dims(spec, settings)
        if state:  # NOT what the service does today: the state joins proprio (as RL's state_in_proprio)
            dims = replace(dims, proprio_dim=dims.proprio_dim + self.dataset.meta.state_dim)
        self.dims = dims
        self.slot = TenantSlot(plan.tenant_config(spec, backbone.info.hidden_size, dims)).mount()
        self.chunk = self.slot.config.head.chunk_len
        meta = self.dataset.meta
        self.sim = make_simulator(meta.env_id, obs_mode="rgb+state" if state else "rgb",
                                  image_size=meta.image_size,
                                  max_episode_steps=dims.max_episode_steps)
        self.features = self._dataset_features()
        self.step = 0

    def _forward(self, requests: list[VLARequest]) -> VLAFeature:
        return VLAFeature.cat(self.backbone.forward([self.backbone.prepare(r) for r in requests]))

    def _dataset_features(self) -> VLAFeature:
        """Every sample's feature, in sample order (computed once: the backbone is frozen)."""
        count = int(self.dataset.offsets[-1])
        parts = []
        for start in range(0, count, FORWARD_ROWS):
            mb = self.dataset.minibatch(np.arange(start, min(start + FORWARD_ROWS, count)), self.chunk)
            proprio = np.concatenate([mb.proprio, mb.state], 1) if self.state else mb.proprio
            parts.append(self._forward([VLARequest(self.spec.tenant, list(mb.images[i]), mb.instructions[i],
                                                   proprio[i].astype(np.float32))
                                        for i in range(len(mb.indices))]))
        return VLAFeature.cat(parts)

    def total_steps(self) -> int:
        return plan.sft_steps(self.spec, self.dataset)

    def epoch(self, epoch: int) -> list[float]:
        """The feeder's batches of ``epoch`` through ``slot.train_step``; the batches' losses."""
        losses = []
        for indices in layout_batches(self.dataset, self.spec.sft.batch_size, self.spec.seed, epoch):
            if self.step >= self.total_steps():
                break
            mb = self.dataset.minibatch(indices, self.chunk)
            take = torch.as_tensor(indices)
            feature = VLAFeature(*(getattr(self.features, n)[take] for n in FIELDS))
            targets = SFTTargets(torch.from_numpy(mb.actions.astype(np.float32)))
            metrics = self.slot.train_step(feature, targets)
            losses.append(metrics["loss"])
            self.step += 1
        return losses

    @torch.no_grad()
    def held_out(self, episodes: int, eval_seed: int = EVAL_SPEC_SEED) -> tuple[float, float]:
        """(mean return, success rate) as the evaluator scores the demo's eval job (deterministic)."""
        first = plan.EVAL_SEED_BASE + plan.train_seed(JobSpec.parse(
            {"kind": "eval", "tenant": "tuning", "seed": eval_seed, "env": {"obs_mode": "rgb",
                                                                            "state_in_proprio": False}}))
        returns, successes = [], []
        for k in range(episodes):
            obs, total, step = self.sim.reset(first + k), 0.0, None
            while True:
                images = [obs.image] if obs.image.ndim == 3 else list(obs.image)
                proprio = np.concatenate([obs.proprio, obs.state]) if self.state else obs.proprio
                feature = self._forward([VLARequest(self.spec.tenant, images, obs.instruction,
                                                    proprio.astype(np.float32))])
                chunk = self.slot.policy.act(feature, torch.Generator(), True)
                action = chunk[0].numpy().astype(np.float32).reshape(-1, self.dims.action_dim)[0]
                step = self.sim.step(action)
                total += step.reward
                obs = step.obs
                if step.terminated or step.truncated:
                    break
            returns.append(total)
            successes.append(step.success)
        return float(np.mean(returns)), float(np.mean(successes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", help="JSON: seed, sft, optim, modules, limits, "
                                     "dataset {episodes, image_size, "
                                     "steps, seed, noise}")
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--held-out", type=int, default=24)
    parser.add_argument("--eval-seed", type=int, default=EVAL_SPEC_SEED)
    parser.add_argument("--dataset", help="a dataset directory (default: the demo's, recorded once)")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--state", action="store_true",
                        help="the goal/target positions join proprio in training and evaluation (what RL "
                             "tenants get with state_in_proprio; the SFT service does not do it today)")
    args = parser.parse_args()
    given = json.loads(args.spec)
    settings = Settings()
    set_torch_threads(settings.torch_threads)
    data = given.get("dataset", {})
    path = Path(args.dataset) if args.dataset else demo_dataset(
        data.get("episodes", 60), data.get("image_size", 32), data.get("steps", 30), data.get("seed", 0),
        data.get("noise", 0.0), args.state)
    spec = JobSpec.parse(json.dumps({
        "kind": "sft", "tenant": "tuning", "job_id": "tuning", "seed": given.get("seed", 3),
        "dataset": {"path": str(path)}, "sft": given.get("sft", {}), "optim": given.get("optim", {}),
        "modules": given.get("modules", {}), "limits": given.get("limits", {})}))
    began = time.monotonic()
    runner = Runner(spec, Backbone.from_preset(args.preset, settings.model_dir), settings, args.state)
    print(f"dataset {path.name}: {runner.dataset.num_episodes} episodes, {int(runner.dataset.offsets[-1])} "
          f"samples; {runner.total_steps()} optimizer steps; features in {time.monotonic() - began:.0f} s")
    ret, success = runner.held_out(args.held_out, args.eval_seed)
    print(f"held-out before: return {ret:.2f}, success {success:.2f}")
    epochs = spec.sft.epochs
    for epoch in range(epochs):
        losses = runner.epoch(epoch)
        if not losses:
            break
        print(f"epoch {epoch}: train L1 {np.mean(losses):.4f} (last batch {losses[-1]:.4f}), "
              f"step {runner.step}")
        if (epoch + 1) % args.eval_every == 0 or epoch == epochs - 1 or runner.step >= runner.total_steps():
            ret, success = runner.held_out(args.held_out, args.eval_seed)
            print(f"  held-out after {epoch + 1} epochs: return {ret:.2f}, success {success:.2f}")
    print(f"{time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
