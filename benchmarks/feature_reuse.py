"""Feature reuse: training forwards and bytes on the bus per RL iteration, feature cache off vs on.

    python -m benchmarks.feature_reuse [--iterations 3] [--episodes 8] [--steps 30] [--ppo-epochs 10]
                                       [--sft-epochs 2] [--json PATH]

One RL job (built-in Reach, the demo's RL settings: 8 episodes of 30 steps in 4 sessions per
iteration, minibatches of 64, 10 PPO epochs; ``--iterations`` of them) and one SFT job (the demo's
quick SFT job on the Reach expert dataset) run one after the other on the whole service in this
process (every role, tiny backbone), three times, each on a fresh service:

* ``off``: no feature cache (``train_feature_cache_mb=0``), the baseline: nothing is kept between
  backbone-train's polls, so every PPO epoch and SFT epoch forwards its rows again (only the jobs
  of one poll, up to ``train_max_batch_jobs``, forward a row they share once: how many epochs
  land in one poll depends on timing). "rows requested" is what forwarding every row of every
  job would cost;
* ``train``: backbone-train's cache only (``feature_cache_from_inference=false``): each distinct
  input is forwarded once by training;
* ``shared``: inference puts what it computed when acting into the same cache, so RL training
  forwards (almost) nothing.

Per RL iteration (exact: the role's counters are read each time a policy version appears, and sync
RL never collects while it trains): backbone-train forwards, rows forwarded and rows requested,
inference forwards; per SFT epoch: the job's totals over its epochs. Rows requested, and rows
forwarded with a cache, do not depend on the machine's load; rows forwarded without one, the number
of forwards (polls, the gate's chunks, inference groups) and the seconds printed do. Bytes on the
bus: the sum of the record value sizes (Avro, as consumers see them: before the producer's
compression) on each of the tenant's topics, read back with a plain consumer after the job, per RL
iteration (the job's total over its iterations) and per SFT epoch; plus the bytes the job's tensors
put into the tensor store (an RL iteration's images go there once, as one gradient job refers to
them; before 2026-12-02 every minibatch of every epoch carried its images on the bus). The three
runs must end with bit-identical checkpoints (the cache changes no bit; checked and printed).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from infra.runtime.demo import ensure_dataset, scenario
from infra.settings import Settings
from infra.topics import TENANT_STREAMS, tenant_topic

CONFIGS: dict[str, dict[str, Any]] = {
    "off": {"train_feature_cache_mb": 0.0, "feature_cache_from_inference": False},
    "train": {"feature_cache_from_inference": False},
    "shared": {"feature_cache_from_inference": True},
}


def job_specs(dataset: Path, args: argparse.Namespace, tag: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The demo's Reach RL job and quick SFT job, resized by ``args``; tenant ids carry ``tag``."""
    specs = scenario(True, dataset, maniskill=False)
    rl = copy.deepcopy(next(s for s in specs if s["kind"] == "rl"))
    sft = copy.deepcopy(next(s for s in specs if s["kind"] == "sft"))
    rl["rl"].update(iterations=args.iterations, episodes_per_iteration=args.episodes,
                    ppo_epochs=args.ppo_epochs)
    rl["env"]["max_episode_steps"] = args.steps
    sft["sft"]["epochs"] = args.sft_epochs
    rl.update(tenant=f"fr-rl-{tag}", job_id="reuse")
    sft.update(tenant=f"fr-sft-{tag}", job_id="reuse")
    return rl, sft


def counters(host) -> dict[str, int]:
    train = host.roles["backbone-train"]
    return {"train_forwards": train.groups, "rows_forwarded": train.rows,
            "rows_requested": train.rows_requested,
            "inference_forwards": len(host.roles["inference"].batcher.records)}


async def bus_bytes(settings: Settings, tenant: str) -> dict[str, int]:
    """Sum of record value sizes on each of ``tenant``'s topics (committed records)."""
    from consumers.bus.replay import replay

    out = {}
    for spec in TENANT_STREAMS:
        topic = tenant_topic(settings, tenant, spec.stream)
        out[spec.stream] = sum([len(r.value or b"") async for r in replay(settings, topic)])
    return out


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


async def run_job(client, host, store, spec: dict[str, Any]) -> tuple[Any, list[dict[str, int]], float]:
    """Run ``spec`` to its end; the role counters each time a new policy version appeared."""
    began = time.monotonic()
    handle = await client.submit(spec)
    follow = asyncio.create_task(client.follow(handle, timeout_s=7200))
    marks, seen = [], 0
    while not follow.done():
        versions = len(store.versions(spec["tenant"]))
        if versions > seen:
            seen = versions
            marks.append(counters(host))
        await asyncio.sleep(0.05)
    state = await follow
    if len(store.versions(spec["tenant"])) > seen:
        marks.append(counters(host))
    return state, marks, time.monotonic() - began


async def run_config(name: str, base: Settings, backbone, specs: tuple[dict, dict],
                     home: Path) -> dict[str, Any]:
    from consumers.service import Service
    from infra.runtime.host import RoleHost
    from producers.client.sdk import Client

    settings = base.model_copy(update={"home": home, **CONFIGS[name]})
    service = await Service.open(settings, backbone)
    host = RoleHost(settings, service=service)
    await host.start()
    out: dict[str, Any] = {"config": name}
    try:
        async with Client(settings, requested_by="benchmark") as client:
            for kind, spec in zip(("rl", "sft"), specs, strict=True):
                before = counters(host)
                tensors_before = dir_bytes(settings.tensor_dir)
                state, marks, seconds = await run_job(client, host, service.store, spec)
                after = counters(host)
                if state.phase != "completed":
                    raise SystemExit(f"{name}: {kind} job ended {state.phase}: {state.reason}")
                out[kind] = {
                    "seconds": seconds, "total": {k: after[k] - before[k] for k in after},
                    "marks": marks, "bytes": await bus_bytes(settings, spec["tenant"]),
                    "tensor_store_bytes": dir_bytes(settings.tensor_dir) - tensors_before,
                    "final": service.store.load(spec["tenant"]).state,
                }
    finally:
        await host.stop()
        await service.close()
    if any(host.restarts.values()):
        raise SystemExit(f"{name}: roles crashed: {host.restarts}")
    return out


def per_iteration(run: dict[str, Any], iterations: int) -> list[dict[str, int]]:
    """RL: counter deltas between consecutive policy versions (version 1 is the initial modules, so
    iteration k's collection and training lie between versions k+1 and k+2)."""
    marks = run["rl"]["marks"]
    if len(marks) != iterations + 1:
        raise SystemExit(f"expected {iterations + 1} policy versions, saw {len(marks)}")
    return [{k: b[k] - a[k] for k in a} for a, b in zip(marks, marks[1:], strict=False)]


def same_state(a, b) -> bool:
    return a.step == b.step and all(
        sorted(getattr(a, part)) == sorted(getattr(b, part))
        and all(torch.equal(getattr(a, part)[n], getattr(b, part)[n]) for n in getattr(a, part))
        for part in ("model", "train"))


def summary(runs: dict[str, dict[str, Any]], args: argparse.Namespace) -> tuple[list[list[str]], dict]:
    iters = {name: per_iteration(run, args.iterations) for name, run in runs.items()}
    rows: list[list[str]] = []
    result: dict[str, Any] = {"per_iteration": iters}

    def ratio(before: float, after: float) -> str:
        if not after:
            return "all gone" if before else "-"
        return f"{before / after:.1f}x"

    def add(label: str, values: dict[str, float], fmt: str = "{:,.0f}") -> None:
        rows.append([label, *(fmt.format(values[n]) for n in CONFIGS),
                     ratio(values["off"], values["train"]), ratio(values["off"], values["shared"])])
        result[label] = values

    labels = (("train_forwards", "training forwards (load-dependent)"), ("rows_forwarded", "rows forwarded"),
              ("rows_requested", "rows requested"), ("inference_forwards", "inference forwards (load-dep.)"))
    for k in range(args.iterations):
        for key, label in labels:
            add(f"RL it{k}: {label}", {n: iters[n][k][key] for n in CONFIGS})
    for key, label in labels[:3]:
        add(f"RL mean per iteration: {label}",
            {n: sum(it[key] for it in iters[n]) / args.iterations for n in CONFIGS}, "{:,.1f}")
    for stream in ("gradient-jobs", "features", "rollouts", "observations", "actions"):
        add(f"RL bytes/iteration: {stream}",
            {n: runs[n]["rl"]["bytes"][stream] / args.iterations for n in CONFIGS})
    add("RL bytes/iteration: all tenant topics",
        {n: sum(runs[n]["rl"]["bytes"].values()) / args.iterations for n in CONFIGS})
    add("RL tensor-store bytes/iteration", {n: runs[n]["rl"]["tensor_store_bytes"] / args.iterations
                                           for n in CONFIGS})
    add("RL wall s/iteration (load-dependent)",
        {n: runs[n]["rl"]["seconds"] / args.iterations for n in CONFIGS}, "{:.1f}")
    epochs = args.sft_epochs
    for key, label in labels[:3]:
        add(f"SFT per epoch: {label}", {n: runs[n]["sft"]["total"][key] / epochs for n in CONFIGS}, "{:,.1f}")
    for stream in ("gradient-jobs", "features"):
        add(f"SFT bytes/epoch: {stream}", {n: runs[n]["sft"]["bytes"][stream] / epochs for n in CONFIGS})
    identical = {kind: all(same_state(runs["off"][kind]["final"], runs[n][kind]["final"]) for n in CONFIGS)
                 for kind in ("rl", "sft")}
    result["identical_checkpoints"] = identical
    return rows, result


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from backbone.model import Backbone
    from infra.broker import LocalBroker
    from infra.topics import TopicAdmin

    settings = Settings().model_copy(update={"backbone": "tiny"})
    console = Console() if Console().is_terminal else Console(width=170)
    if settings.bootstrap_servers is None:
        await asyncio.to_thread(LocalBroker(settings).up)
    dataset = await asyncio.to_thread(ensure_dataset, settings, True)
    backbone = await asyncio.to_thread(Backbone.from_preset, "tiny", settings.model_dir)
    tag = datetime.now(UTC).strftime("%m%d%H%M%S")
    runs, specs = {}, {}
    for name in CONFIGS:
        specs[name] = job_specs(dataset, args, f"{name}-{tag}")
    async with TopicAdmin(settings) as admin:  # up front: topic creation makes groups rebalance
        await admin.ensure_shared()
        for pair in specs.values():
            for spec in pair:
                await admin.ensure_tenant(spec["tenant"])
    for name in CONFIGS:
        console.print(f"[bold]{name}[/]: RL {args.iterations} iterations, then SFT {args.sft_epochs} epochs")
        runs[name] = await run_config(name, settings, backbone, specs[name],
                                      settings.home / "feature-reuse" / tag / name)
    rows, result = summary(runs, args)
    table = Table("per RL iteration / SFT epoch", *CONFIGS, "off / train", "off / shared",
                  title=f"feature reuse, tiny backbone: RL {args.iterations} it x {args.episodes} episodes x "
                        f"{args.steps} steps, ppo_epochs {args.ppo_epochs}; SFT {args.sft_epochs} epochs")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print("final checkpoints bit-identical in the three runs: "
                  f"RL {result['identical_checkpoints']['rl']}, SFT {result['identical_checkpoints']['sft']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": vars(args), **result}, indent=2, default=str))
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=8, help="episodes per RL iteration")
    parser.add_argument("--steps", type=int, default=30, help="steps per episode")
    parser.add_argument("--ppo-epochs", type=int, default=10)
    parser.add_argument("--sft-epochs", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
