"""Inference latency under training load: the device gate with and without its training budget.

    python -m benchmarks.gate_latency [--preset tiny] [--train-rows 256] [--requests 60]
                                      [--interval-ms 50] [--budget-ms 200] [--json PATH]

One process, one backbone, one ``DeviceGate`` (as a device host has). An
"inference" client sends one request every ``--interval-ms`` and times it from
submission to its feature (gate wait + its forward). Three runs, same requests:
``idle`` (nothing else uses the device), ``train, whole groups`` (a training
loop keeps sending groups of ``--train-rows`` rows, each one forward, the gate
without a budget), ``train, chunked`` (the same loop, the gate splitting each
group into chunks that fit ``--budget-ms``). Prints p50/p99/max latency per run
and the training rows per second each run kept. No Kafka: the roles add their
bus time on top of these numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import numpy as np
import torch

from backbone.gate import DeviceGate
from backbone.grouped import forward_grouped_on
from backbone.inputs import VLARequest
from backbone.model import Backbone
from infra.settings import Settings


def _requests(n: int, seed: int, size: int = 32) -> list[VLARequest]:
    rng = np.random.default_rng(seed)
    return [VLARequest(f"tenant-{i % 4}", [rng.integers(0, 255, (size, size, 3), dtype=np.uint8)],
                       "reach the blue target", rng.standard_normal(10).astype(np.float32)) for i in range(n)]


async def _run(backbone: Backbone, gate: DeviceGate, infer, train, interval_s: float) -> dict[str, float]:
    stop = asyncio.Event()
    trained = 0

    async def training() -> None:
        nonlocal trained
        while not stop.is_set():
            await forward_grouped_on(gate, "train", backbone, train)
            trained += len(train)

    async def inference() -> list[float]:
        latencies = []
        for request in infer:
            began = time.perf_counter()
            await forward_grouped_on(gate, "inference", backbone, [request])
            latencies.append(time.perf_counter() - began)
            await asyncio.sleep(max(0.0, interval_s - latencies[-1]))
        return latencies

    began = time.perf_counter()
    loop = asyncio.create_task(training()) if train else None
    latencies = np.array(await inference())
    stop.set()
    if loop is not None:
        await loop
    wall = time.perf_counter() - began
    return {"p50_ms": 1e3 * float(np.percentile(latencies, 50)),
            "p99_ms": 1e3 * float(np.percentile(latencies, 99)),
            "max_ms": 1e3 * float(latencies.max()),
            "train_rows_per_s": trained / wall,
            "train_forwards": float(gate.forwards["train"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--train-rows", type=int, default=256)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--interval-ms", type=float, default=50.0)
    parser.add_argument("--budget-ms", type=float, default=200.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = Settings()
    backbone = Backbone.from_preset(args.preset, settings.model_dir, settings.device, settings.dtype)
    infer = [backbone.prepare(r) for r in _requests(args.requests, seed=1)]
    train = [backbone.prepare(r) for r in _requests(args.train_rows, seed=2)]
    backbone.forward(infer[:1])  # warm-up
    runs = {
        "idle": (DeviceGate(), []),
        "train, whole groups": (DeviceGate(), train),
        "train, chunked": (DeviceGate(train_budget_s=args.budget_ms / 1e3), train),
    }
    results = {name: asyncio.run(_run(backbone, gate, infer, rows, args.interval_ms / 1e3))
               for name, (gate, rows) in runs.items()}
    print(f"preset {args.preset}, {args.train_rows} rows per training group, budget {args.budget_ms:.0f} ms, "
          f"{args.requests} inference requests every {args.interval_ms:.0f} ms")
    print("| run | p50 ms | p99 ms | max ms | training rows/s | training forwards |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} | "
              f"{r['train_rows_per_s']:.1f} | {r['train_forwards']:.0f} |")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "results": results},
                                        indent=2))


if __name__ == "__main__":
    main()
