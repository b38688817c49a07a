"""Group batching: ONE backbone forward for N tenants vs N per-tenant forwards, same run.

    python benchmarks/group_batching.py [--preset tiny] [--device auto] [--json PATH]
                                        [--repeats 7] [--threads N]
                                        [--tenants 1 2 4 8] [--local-batch 1 2 4 8]

Grid: tenants {1, 2, 4, 8} x local batch {1, 2, 4, 8}. "separate" runs each
tenant's local batch as its own forward, one tenant after another (what
isolated services do); "grouped" runs all tenants' requests as one forward.
Inputs are normalised beforehand (identical work in both modes); only the
backbone forward is timed, median of ``--repeats`` after a warm-up. Prints a
markdown table; ``--json`` writes rows {preset, device, tenants, local_batch,
separate_s, grouped_s, speedup, grouped_host_s}. ``grouped_host_s`` is the CPU
time of the calling thread while it issued the grouped forward (before waiting
for the device): on a GPU, how much of a forward keeps its host thread busy
(``benchmarks/projection.py``'s cores model reads it); on a CPU, all of it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from rich.progress import Progress

from backbone.inputs import VLARequest
from backbone.model import Backbone
from infra.settings import Settings

TENANTS = (1, 2, 4, 8)
LOCAL_BATCH = (1, 2, 4, 8)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _time(fn, device: torch.device, repeats: int) -> tuple[float, float]:
    """Medians of (wall seconds, the thread's CPU seconds until ``fn`` returned, before the sync)."""
    fn()  # warm-up (allocator, kernels)
    walls, host = [], []
    for _ in range(repeats):
        _sync(device)
        start, cpu = time.perf_counter(), time.thread_time()
        fn()
        host.append(time.thread_time() - cpu)
        _sync(device)
        walls.append(time.perf_counter() - start)
    return statistics.median(walls), statistics.median(host)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1: a role shares the cores with others)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--tenants", type=int, nargs="+", default=list(TENANTS))
    parser.add_argument("--local-batch", type=int, nargs="+", default=list(LOCAL_BATCH))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    settings = Settings()
    backbone = Backbone.from_preset(args.preset, settings.home / "models", args.device, args.dtype)
    rng = np.random.default_rng(0)
    size = backbone.spec.image_size
    instruction = "pick up the red cube and place it on the plate"

    def request(tenant: int) -> VLARequest:
        return VLARequest(f"t{tenant}", [rng.integers(0, 255, (size, size, 3), dtype=np.uint8)],
                          instruction, rng.standard_normal(7))

    rows = []
    with Progress(transient=True) as progress:
        task = progress.add_task(f"{args.preset} on {backbone.device}",
                                 total=len(args.tenants) * len(args.local_batch))
        for tenants in args.tenants:
            for local in args.local_batch:
                per_tenant = [[backbone.prepare(request(t)) for _ in range(local)] for t in range(tenants)]
                everyone = [p for batch in per_tenant for p in batch]
                separate, _ = _time(lambda pt=per_tenant: [backbone.forward(b) for b in pt],
                                    backbone.device, args.repeats)
                grouped, host = _time(lambda e=everyone: backbone.forward(e), backbone.device, args.repeats)
                rows.append({"preset": args.preset, "device": str(backbone.device), "tenants": tenants,
                             "local_batch": local, "separate_s": separate, "grouped_s": grouped,
                             "speedup": separate / grouped, "grouped_host_s": host})
                progress.advance(task)

    print(f"\n{args.preset} ({backbone.num_parameters() / 1e6:.2f}M parameters) on {backbone.device}, "
          f"{backbone.dtype}, torch threads {torch.get_num_threads()}, median of {args.repeats}\n")
    print("| tenants | local batch | separate ms | grouped ms | speedup | grouped: host thread busy |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        busy = r["grouped_host_s"] / r["grouped_s"]
        print(f"| {r['tenants']} | {r['local_batch']} | {r['separate_s'] * 1e3:.2f} | "
              f"{r['grouped_s'] * 1e3:.2f} | {r['speedup']:.2f}x | {busy:.0%} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
