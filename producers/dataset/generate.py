"""Records demonstrations with a scripted expert into the dataset format (``producers.dataset.format``).

Episode ``k`` of a run uses the seed ``episode_seed(seed, k)`` (a SeedSequence
of ``(seed, k)``, so runs with different seeds share no episode); simulator
and expert are both reset with it, which makes every recorded episode a pure
function of that seed. With ``only_success`` failed attempts are skipped (and
counted in ``meta.extra``) until enough episodes succeeded.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from envs import Expert, GuardedSimulator, make_expert, make_simulator
from infra.errors import ConfigError
from infra.logging import get_logger
from producers.dataset.format import DatasetError, DatasetHeader, DatasetMeta, DatasetWriter, Episode

__all__ = ["episode_seed", "generate_dataset", "record_episode"]

log = get_logger("producers.dataset.generate")


def episode_seed(seed: int, attempt: int) -> int:
    """The reset seed of attempt ``attempt`` of a run seeded ``seed`` (a uint32)."""
    return int(np.random.SeedSequence([seed, attempt]).generate_state(1)[0])


def record_episode(sim: GuardedSimulator, expert: Expert, seed: int) -> Episode:
    """One episode of ``expert`` in ``sim`` from ``reset(seed)`` until it terminates or is truncated."""
    spec = sim.spec
    obs = sim.reset(seed)
    expert.reset(seed)
    actions, proprio, images, states, rewards, success = [], [], [], [], [], []
    while True:
        action = np.asarray(expert.act(obs, sim), dtype=np.float32)
        action = np.clip(action, spec.action_low, spec.action_high)
        actions.append(action)
        proprio.append(obs.proprio)
        images.append(obs.image)
        states.append(obs.state)
        out = sim.step(action)
        rewards.append(out.reward)
        success.append(out.success)
        obs = out.obs
        if out.terminated or out.truncated:
            break
    return Episode(
        instruction=obs.instruction, seed=seed, actions=np.stack(actions), proprio=np.stack(proprio),
        rewards=np.asarray(rewards, dtype=np.float32), success=np.asarray(success, dtype=bool),
        images=np.stack(images) if spec.cameras else None,
        state=np.stack(states) if spec.state_dim else None,
        terminated=out.terminated, truncated=out.truncated,
    )


def _header(sim: GuardedSimulator, obs_mode: str, expert: Expert, seed: int,
            only_success: bool) -> DatasetHeader:
    spec = sim.spec
    return DatasetHeader(
        env_id=spec.env_id, obs_mode=obs_mode, image_size=spec.image_size, cameras=spec.cameras,
        action_dim=spec.action_dim, action_low=spec.action_low, action_high=spec.action_high,
        proprio_dim=spec.proprio_dim, state_dim=spec.state_dim, max_episode_steps=spec.max_episode_steps,
        generator=f"{type(expert).__module__}.{type(expert).__qualname__}", seed=seed,
        extra={"only_success": only_success, "expert_noise": float(getattr(expert, "noise", 0.0))},
    )


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("success {task.fields[rate]}"), TimeElapsedColumn(),
        console=Console(stderr=True), disable=not enabled,
    )


def generate_dataset(env_id: str, out_dir: str | os.PathLike[str], episodes: int, seed: int,
                     obs_mode: str = "rgb", image_size: int = 64, expert: Expert | None = None,
                     only_success: bool = False, *, cameras: int = 1, max_episode_steps: int | None = None,
                     max_attempts: int | None = None, overwrite: bool = False,
                     progress: bool = True) -> DatasetMeta:
    """Records ``episodes`` expert episodes of ``env_id`` into ``out_dir`` (atomically) and returns its meta.

    ``expert`` defaults to the task's scripted expert. With ``only_success``,
    at most ``max_attempts`` (default 10 x episodes) are tried; too few
    successes is a ``DatasetError`` and nothing is written.
    """
    if episodes < 1 or seed < 0:
        raise ConfigError(f"need episodes >= 1 and seed >= 0, got episodes={episodes}, seed={seed}")
    attempts_allowed = max_attempts or (10 * episodes if only_success else episodes)
    expert = expert if expert is not None else make_expert(env_id)
    sim = make_simulator(env_id, obs_mode=obs_mode, image_size=image_size, cameras=cameras,
                         max_episode_steps=max_episode_steps)
    started, attempts, successes = time.monotonic(), 0, 0
    try:
        with DatasetWriter(out_dir, _header(sim, obs_mode, expert, seed, only_success),
                           overwrite=overwrite) as writer, _progress(progress) as bar:
            task = bar.add_task(f"{env_id} -> {Path(out_dir).name}", total=episodes, rate="-")
            while len(writer.shards) < episodes:
                if attempts >= attempts_allowed:
                    raise DatasetError(f"{env_id}: only {len(writer.shards)} of {episodes} episodes "
                                       f"succeeded in {attempts} attempts; nothing written")
                episode = record_episode(sim, expert, episode_seed(seed, attempts))
                attempts += 1
                successes += episode.succeeded
                if episode.succeeded or not only_success:
                    writer.add(episode)
                bar.update(task, completed=len(writer.shards), rate=f"{successes / attempts:.0%}")
            meta = writer.close(attempts=attempts, attempt_success_rate=successes / attempts)
    finally:
        sim.close()
    log.info("dataset written", env_id=env_id, path=str(out_dir), episodes=meta.episodes, steps=meta.steps,
             success_rate=meta.success_rate, attempts=attempts, seconds=round(time.monotonic() - started, 2))
    return meta
