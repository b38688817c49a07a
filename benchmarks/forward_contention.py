"""How much a busy event loop in the same process stretches a backbone forward's wall time.

    taskset -c 0 python -m benchmarks.forward_contention [--preset tiny] [--rows 7] [--n 150]

The device host runs each forward in a worker thread while its event loop decodes
and encodes every tenant's Kafka traffic (Avro, numpy) in Python. On one core,
or whenever the forward needs the interpreter (a small model is many short
torch calls), the two take turns, and the gate's busy seconds, which are wall
time, grow with the traffic. ``multi_tenant.py --deployment processes`` saw a
7-row inference forward take 7.4-8.3 ms when one tenant ran and 13.7-14.7 ms
when four did, on a core no other process used.

This replays it in one process: forwards of ``--rows`` rows through
``asyncio.to_thread`` (as ``backbone/grouped.py`` runs them), with the event
loop idle (baseline) and with it doing pure-Python work ``--busy-ms`` out of
every ``--busy-ms`` + 1 ms (candidate), each at the interpreter's default
switch interval (5 ms) and at 0.5 ms. Printed: median and mean forward wall
time per case, and each loaded case's ratio to its idle baseline. Pin it to one
core (``taskset -c 0``) to see the device host's situation.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

import numpy as np
import torch

from backbone.inputs import VLARequest
from consumers.service import load_backbone
from infra.settings import Settings

WARMUP = 20


def _python_work(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        sum(range(200))


async def _case(backbone, group, n: int, busy_ms: float, switch_s: float) -> list[float]:
    sys.setswitchinterval(switch_s)
    done = asyncio.Event()

    async def event_loop_traffic() -> None:
        while not done.is_set():
            if busy_ms:
                _python_work(busy_ms)
            await asyncio.sleep(0.001)

    traffic = asyncio.create_task(event_loop_traffic())
    times = []
    for _ in range(WARMUP + n):
        t0 = time.perf_counter()
        await asyncio.to_thread(backbone.forward, group)
        times.append((time.perf_counter() - t0) * 1e3)
        await asyncio.sleep(0.003)
    done.set()
    await traffic
    return times[WARMUP:]


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--rows", type=int, default=7)
    parser.add_argument("--n", type=int, default=150)
    parser.add_argument("--busy-ms", type=float, default=2.0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    backbone = load_backbone(Settings(backbone=args.preset))
    rng = np.random.default_rng(0)
    group = [backbone.prepare(VLARequest(
        "bench", [rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)], "reach the red target",
        np.zeros(12, np.float32), task_id=1)) for _ in range(args.rows)]
    default_switch = sys.getswitchinterval()
    results: dict[str, dict[str, float]] = {}
    for switch_s in (default_switch, 0.0005):
        for busy_ms in (0.0, args.busy_ms):
            times = asyncio.run(_case(backbone, group, args.n, busy_ms, switch_s))
            results[f"loop {'busy' if busy_ms else 'idle'}, switch {switch_s * 1e3:g} ms"] = {
                "median_ms": statistics.median(times), "mean_ms": statistics.fmean(times)}
    sys.setswitchinterval(default_switch)
    print(f"{args.preset}, {args.rows} rows per forward, {args.n} forwards per case, CPUs "
          f"{sorted(os.sched_getaffinity(0))}")
    for name, r in results.items():
        idle = results[name.replace("busy", "idle")]["median_ms"]
        ratio = f"  x{r['median_ms'] / idle:.2f} of idle" if "busy" in name else ""
        print(f"  {name:28s} median {r['median_ms']:6.2f} ms  mean {r['mean_ms']:6.2f} ms{ratio}")
    return results


if __name__ == "__main__":
    main()
