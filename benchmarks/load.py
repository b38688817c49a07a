"""Load: many tenants at once (16 by default, tiny preset), each with fixed work, against their solo runs.

    python -m benchmarks.load [--tenants 16] [--iterations 1] [--episodes 2] [--steps 8] [--json PATH]

Tenants alternate between PPO on the built-in Reach task (3 of 4; the second of
every four with a policy suffix over the backbone's tokens, trained through LoRA)
and SFT on the Reach dataset (1 of 4), each with its own seed and the smoke-sized work of
``benchmarks/multi_tenant.py``. First each tenant runs ALONE on the service (one
after another: its solo run), then all of them at once under fresh tenant ids.
Checked and printed, nothing is assumed:

* nothing lost: every job completes, and each tenant's rollout records, gradient
  jobs and optimizer steps equal its solo run's counts;
* each tenant equal to its solo run: final parameters bit-identical;
* throughput: env steps/s and optimizer steps/s of the concurrent run (and of
  the solo runs back to back, the baseline);
* maximum consumer lag, sampled every ``--lag-every`` seconds during the
  concurrent run: per consumer group, the sum over the run's partitions of end
  offset minus committed offset (end offsets count transaction markers, so a
  caught-up transactional partition reads 1, not 0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from benchmarks.multi_tenant import bench_scenario
from infra.runtime.demo import ensure_dataset
from infra.settings import Settings
from infra.topics import tenant_topic


def load_specs(n: int, dataset: Path, iterations: int = 1, episodes: int = 2,
               steps: int = 8) -> list[dict[str, Any]]:
    """``n`` jobs: 3 of 4 PPO on Reach (``iterations`` x ``episodes`` x ``steps``), the second of them
    with a policy suffix (the paper's adapters: a block over the backbone's tokens, trained
    through LoRA), 1 of 4 SFT (one epoch of the quick dataset), all with distinct seeds."""
    smoke = bench_scenario("smoke", dataset, False)
    rl, sft = (next(s for s in smoke if s["kind"] == k) for k in ("rl", "sft"))
    rl["rl"].update(iterations=iterations, episodes_per_iteration=episodes)
    rl["env"]["max_episode_steps"] = steps
    specs = []
    for i in range(n):
        spec = json.loads(json.dumps(sft if i % 4 == 3 else rl))
        if i % 4 == 1:
            spec.setdefault("modules", {})["suffix"] = True
        specs.append({**spec, "tenant": f"load{i:02d}", "seed": 100 + i})
    return specs


async def lag_sampler(settings: Settings, tag: str, every_s: float, stop: asyncio.Event) -> dict[str, int]:
    """Max over samples of each consumer group's lag on the partitions of this run's topics."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap)
    probe = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap, group_id=None)
    await admin.start()
    await probe.start()
    worst: dict[str, int] = defaultdict(int)
    try:
        while not stop.is_set():
            listed = await admin.list_consumer_groups()
            for group in [g[0] if isinstance(g, tuple) else g.group_id for g in listed]:
                offsets = await admin.list_consumer_group_offsets(group)
                committed = {tp: om.offset for tp, om in offsets.items()
                             if tag in tp.topic and om.offset >= 0}
                if committed:
                    ends = await probe.end_offsets(list(committed))
                    lag = sum(max(0, ends[tp] - off) for tp, off in committed.items())
                    key = "optimizer.<tenant> (max)" if group.startswith("optimizer.") else group
                    worst[key] = max(worst[key], lag)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)
    finally:
        await probe.stop()
        await admin.close()
    return dict(worst)


async def _streams(settings: Settings, tenant: str) -> tuple[dict[str, int], list[tuple]]:
    """Records per stream, and the tenant's rollout transitions named by what does not depend on its
    ids or timing (policy version, reset seed, step) and sorted: equal lists mean the same actions
    were taken. One replay of each topic."""
    from consumers.bus.replay import replay
    from schemas import events as ev

    counts, transitions = {}, []
    for stream in ("rollouts", "gradient-jobs", "features"):
        counts[stream] = 0
        async for record in replay(settings, tenant_topic(settings, tenant, stream)):
            counts[stream] += 1
            event = record.event
            if isinstance(event, ev.RolloutRecord):
                transitions.append((event.policy_version, event.reset_seed, event.step, event.action.data,
                                    event.log_prob, event.value, event.reward))
    return counts, sorted(transitions, key=lambda t: t[:3])


def _differing(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    """Parameters that differ between two state dicts -> their largest absolute difference."""
    return {k: float((a[k].double() - b[k].double()).abs().max()) for k in sorted(a.keys() & b.keys())
            if not torch.equal(a[k], b[k])}


async def compare_to_solo(settings: Settings, store, solo: list[dict[str, Any]],
                          together: list[dict[str, Any]], solo_states: list,
                          states: list) -> list[dict[str, Any]]:
    """One row per tenant: its concurrent run beside its solo run (``identical`` is None unless both
    completed: an unfinished run has no final parameters to compare)."""
    rows = []
    for spec_s, spec_c, st_s, st_c in zip(solo, together, solo_states, states, strict=True):
        counts_s, actions_s = await _streams(settings, spec_s["tenant"])
        counts_c, actions = await _streams(settings, spec_c["tenant"])
        same, differing = None, {}
        if st_s.phase == st_c.phase == "completed":
            ma, mb = store.load(spec_s["tenant"]).state.model, store.load(spec_c["tenant"]).state.model
            differing = _differing(ma, mb)
            same = ma.keys() == mb.keys() and not differing
        # where a difference started: the actions taken (inference) or only the updates (training)
        same_actions = actions == actions_s
        rows.append({"tenant": spec_c["tenant"], "kind": spec_c["kind"], "phase": st_c.phase,
                     "solo_phase": st_s.phase, "counts": counts_c, "solo_counts": counts_s,
                     "steps": st_c.metrics.get("steps"), "solo_steps": st_s.metrics.get("steps"),
                     "identical": same, "same_actions": same_actions, "actions_compared": len(actions),
                     "differing": dict(list(differing.items())[:8])})
    return rows


def summarise(rows: list[dict[str, Any]], backbone: str, solo_s: float, concurrent_s: float,
              lag: dict[str, int]) -> dict[str, Any]:
    env_steps = sum(r["counts"]["rollouts"] for r in rows)
    opt_steps = sum(r["steps"] or 0 for r in rows)
    return {
        "tenants": len(rows), "backbone": backbone, "solo_s": solo_s, "concurrent_s": concurrent_s,
        "completed": sum(r["phase"] == "completed" for r in rows),
        "nothing_lost": sum(r["counts"] == r["solo_counts"] and r["steps"] == r["solo_steps"] for r in rows),
        "identical_to_solo": sum(bool(r["identical"]) for r in rows),
        "env_steps_per_s": env_steps / concurrent_s, "solo_env_steps_per_s": env_steps / solo_s,
        "optimizer_steps_per_s": opt_steps / concurrent_s, "solo_optimizer_steps_per_s": opt_steps / solo_s,
        "max_lag": lag, "rows": rows,
    }


def print_table(console: Console, result: dict[str, Any], title: str) -> None:
    n, concurrent_s, solo_s = result["tenants"], result["concurrent_s"], result["solo_s"]
    table = Table("figure", "value", title=title)
    table.add_row("jobs completed", f"{result['completed']}/{n}")
    table.add_row("nothing lost (rollouts, gradient jobs, features, steps = solo)",
                  f"{result['nothing_lost']}/{n}")
    table.add_row("final parameters bit-identical to the solo run", f"{result['identical_to_solo']}/{n}")
    table.add_row("wall: concurrent / solo runs back to back",
                  f"{concurrent_s:.1f} s / {solo_s:.1f} s = {concurrent_s / solo_s:.3f}")
    table.add_row("env steps/s: concurrent (solo)",
                  f"{result['env_steps_per_s']:.1f} ({result['solo_env_steps_per_s']:.1f})")
    table.add_row("optimizer steps/s: concurrent (solo)",
                  f"{result['optimizer_steps_per_s']:.1f} ({result['solo_optimizer_steps_per_s']:.1f})")
    for group, value in sorted(result["max_lag"].items(), key=lambda kv: -kv[1]):
        table.add_row(f"max consumer lag: {group}", str(value))
    console.print(table)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from consumers.service import Service
    from infra.broker import LocalBroker
    from infra.runtime.host import RoleHost
    from infra.topics import TopicAdmin
    from producers.client.sdk import Client

    settings = Settings()
    console = Console() if Console().is_terminal else Console(width=160)
    if settings.bootstrap_servers is None:
        await asyncio.to_thread(LocalBroker(settings).up)
    dataset = await asyncio.to_thread(ensure_dataset, settings, True)
    tag = datetime.now(UTC).strftime("%m%d%H%M%S")
    base = load_specs(args.tenants, dataset, args.iterations, args.episodes, args.steps)
    solo = [{**s, "tenant": f"{s['tenant']}-s{tag}", "job_id": "load"} for s in base]
    together = [{**s, "tenant": f"{s['tenant']}-c{tag}", "job_id": "load"} for s in base]
    async with TopicAdmin(settings) as admin:  # up front: topic creation makes groups rebalance
        await admin.ensure_shared()
        for spec in solo + together:
            await admin.ensure_tenant(spec["tenant"])
    service = await Service.open(settings)
    try:
        roles = RoleHost(service.settings, service=service)  # every role in this process
        async with roles, Client(settings, requested_by="benchmark") as client:
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), console=console) as progress:
                bar = progress.add_task("solo runs, one after another", total=len(solo))
                began = time.monotonic()
                solo_states = []
                for spec in solo:
                    solo_states.append(await client.follow(await client.submit(spec), timeout_s=3600))
                    progress.advance(bar)
                solo_s = time.monotonic() - began
                bar = progress.add_task(f"{len(together)} tenants at once", total=len(together))
                stop = asyncio.Event()
                sampler = asyncio.create_task(lag_sampler(settings, tag, args.lag_every, stop))
                began = time.monotonic()
                handles = [await client.submit(spec) for spec in together]

                async def one(handle):
                    state = await client.follow(handle, timeout_s=3600)
                    progress.advance(bar)
                    return state

                states = await asyncio.gather(*(one(h) for h in handles))
                concurrent_s = time.monotonic() - began
                stop.set()
                lag = await sampler
            rows = await compare_to_solo(settings, service.store, solo, together, solo_states, states)
    finally:
        await service.close()
    result = summarise(rows, settings.backbone, solo_s, concurrent_s, lag)
    print_table(console, result, f"load: {len(rows)} tenants at once, backbone {settings.backbone}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=1, help="PPO iterations per RL tenant")
    parser.add_argument("--episodes", type=int, default=2, help="episodes per iteration")
    parser.add_argument("--steps", type=int, default=8, help="steps per episode")
    parser.add_argument("--lag-every", type=float, default=1.0, help="seconds between lag samples")
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
