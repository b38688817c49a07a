"""Helpers for the end-to-end service tests (tests/test_service.py): the whole service in this
process (one Supervisor running every role), a tenant client, and small readers of the log."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from consumers.service import Service
from infra.runtime.host import RoleHost
from infra.settings import Settings
from infra.topics import TopicAdmin, tenant_topic
from producers.client.sdk import Client, JobHandle
from schemas import events as ev
from schemas.jobstate import JobState
from tests.helpers import read_topic

# Small enough for a 2-core CI machine, big enough to exercise every role.
SMALL_ENV: dict[str, Any] = {"max_episode_steps": 15}
SMALL_RL: dict[str, Any] = {"iterations": 2, "episodes_per_iteration": 2, "minibatch_size": 16,
                            "ppo_epochs": 1}
# A job that has not ended by then is stuck; generous because CI machines can be ~3x slower than a dev VM
FOLLOW_S = 600.0


@dataclass
class Stack:
    """One running service: settings (fresh home, so a fresh policy store), roles, a client."""

    settings: Settings
    service: Service
    supervisor: RoleHost
    client: Client

    @property
    def store(self):
        return self.service.store

    def rl_spec(self, tenant: str, job_id: str, *, seed: int = 0, env: dict | None = None,
                rl: dict | None = None, **extra: Any) -> dict[str, Any]:
        return {"kind": "rl", "tenant": tenant, "job_id": job_id, "seed": seed,
                "env": env or SMALL_ENV, "rl": rl or SMALL_RL, **extra}

    async def run(self, spec: dict[str, Any], expect: str = "completed") -> JobState:
        """Submit, follow until terminal, and check the terminal phase (with the reason if not)."""
        job = await self.client.submit(spec)
        state = await self.client.follow(job, timeout_s=FOLLOW_S)
        assert state.phase == expect, f"{job.job_id} of {job.tenant}: {state.phase} ({state.reason})"
        return state

    async def follow(self, job: JobHandle, expect: str = "completed") -> JobState:
        state = await self.client.follow(job, timeout_s=FOLLOW_S)
        assert state.phase == expect, f"{job.job_id} of {job.tenant}: {state.phase} ({state.reason})"
        return state

    async def ensure_tenant(self, tenant: str) -> None:
        async with TopicAdmin(self.settings) as admin:
            await admin.ensure_tenant(tenant)

    async def events(self, tenant: str, stream: str) -> list[ev.Event]:
        return [r.event for r in await read_topic(self.settings, tenant_topic(self.settings, tenant, stream))
                if r.event is not None]


@contextlib.asynccontextmanager
async def running_stack(settings: Settings, model_root: Path, home: Path, *, check_restarts: bool = True,
                        **overrides: Any) -> AsyncIterator[Stack]:
    """Every role in this process on the tiny backbone and a fresh home (``overrides`` go into the
    settings), and a tenant client; with ``check_restarts``, fails if a role crashed meanwhile."""
    from backbone.model import Backbone

    local = settings.model_copy(update={"backbone": "tiny", "home": home, **overrides})
    backbone = await asyncio.to_thread(Backbone.from_preset, "tiny", model_root)
    service = await Service.open(local, backbone)
    host = RoleHost(local, service=service)
    await host.start()
    try:
        async with Client(local, requested_by="test") as client:
            yield Stack(local, service, host, client)
    finally:
        await host.stop()
        await service.close()
    if check_restarts:
        assert all(n == 0 for n in host.restarts.values()), f"roles crashed: {host.restarts}"


def iteration_returns(state: JobState) -> dict[int, float]:
    """RL: mean_return of each iteration, from the job's progress history (rollout and optimizer
    both report an iteration's collection metrics; they agree)."""
    out: dict[int, float] = {}
    for entry in state.history:
        if "mean_return" in entry and "iteration" in entry:
            it = int(entry["iteration"])
            assert out.get(it, entry["mean_return"]) == entry["mean_return"], (it, entry, out)
            out[it] = entry["mean_return"]
    return dict(sorted(out.items()))


def assert_same_state(a, b, what: str) -> None:
    """Two checkpoints' states equal bit for bit: the step, and every model and optimizer tensor."""
    assert a.step == b.step
    for part in ("model", "train"):
        ta, tb = getattr(a, part), getattr(b, part)
        assert sorted(ta) == sorted(tb)
        differ = [name for name in ta if not torch.equal(ta[name], tb[name])]
        assert not differ, f"{what}: {part} tensors differ: {differ}"


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative path -> hex), temp dirs included."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def held_out_return(policy, *, episodes: int, max_steps: int, first_seed: int = 1_000_000) -> float:
    """Mean return of ``policy`` on held-out Reach episodes (see ``held_out``)."""
    return held_out(policy, episodes=episodes, max_steps=max_steps, first_seed=first_seed)[0]


def held_out(policy, *, episodes: int, max_steps: int, first_seed: int = 1_000_000,
             state_in_proprio: bool = True) -> tuple[float, float]:
    """(mean return, success rate) of ``policy`` (a ServedPolicy from Client.load_policy) acting
    deterministically on the built-in Reach task, on fixed episode seeds no training run uses: the same
    episodes for every version, so two versions are compared pairwise, without sampling noise
    (blocking: use a thread)."""
    import numpy as np

    from envs import make_simulator

    sim = make_simulator("joynexus/Reach-v0", obs_mode="rgb+state", image_size=32,
                         max_episode_steps=max_steps)
    try:
        returns, successes = [], []
        for k in range(episodes):
            obs, total = sim.reset(first_seed + k), 0.0
            for _ in range(max_steps):
                proprio = (np.concatenate([obs.proprio, obs.state]) if state_in_proprio
                           else obs.proprio).astype(np.float32)
                images = [obs.image] if obs.image.ndim == 3 else list(obs.image)
                step = sim.step(policy.act(images, obs.instruction, proprio).reshape(-1))
                total += step.reward
                obs = step.obs
                if step.terminated or step.truncated:
                    break
            returns.append(total)
            successes.append(step.success)
        return float(np.mean(returns)), float(np.mean(successes))
    finally:
        sim.close()
