"""PROJECTION (not a measurement): shared vs isolated with GPU-class forward times, by a small
discrete-event model of the device fed with a measured ``benchmarks/multi_tenant.py`` run.

    python -m benchmarks.projection RUN_DIR [--gpu-table group_batching_gpu-2b.json]
                                    [--assume-ms FIXED PER_ROW] [--host-slots 1] [--json PATH]
                                    [--gpu-cpus device=0,optimizer=1,rest=2-15] [--gpu-forward-share S]

Input: ``RUN_DIR/traces.json`` (multi_tenant.py writes it): every counted run's
forwards (queue, start, end, tenant per row) and each job's (submitted,
completed) times. From each ISOLATED run, each tenant becomes a chain of
device work items (queue, rows) separated by host gaps: the measured time from
its submission to its first forward, between the end of a forward and the
start of its next one (simulator steps, the Kafka round trips, the optimizer,
the batcher's T wait), and from its last forward to its completion.

The model replays the chains:

* isolated: tenants one after another; device time = the sum of their chains;
* shared: all chains at once on ONE device that runs one forward at a time,
  playing the service's rules (``Policy``, read from the run's
  ``multi_tenant.json`` when it has them, else today's settings): the inference
  batcher forms one group at a time and flushes it at B rows, when its oldest
  request waited T, or when it is complete (every tenant answered in the last
  ``active_window_s`` has asked again); the gate runs a waiting inference group
  before training unless a training item waited ``train_max_wait_s``; training
  items ready when the device frees up share a forward (backbone-train's poll
  batch) up to the rows of one budgeted chunk.

The model's unit is a tenant's forward, not an env session: completeness is
judged per tenant (its sessions' asks of one step arrive as one item, as they
did when it ran alone), and all tenants share one batcher bucket (one image
size, as in the benchmark's scenarios).

A forward of ``rows`` rows on ``queue`` takes ``duration(queue, rows)``:

* ``cpu``: a least-squares line per queue through the run's own measured
  forwards. This is the check: the model must reproduce the measured shared
  run; the miss is printed (host gaps are taken from isolated runs; how
  they contend for the CPU when shared is the host-slot limit below);
* ``gpu``: from a ``benchmarks/group_batching.py --json`` table measured on a
  GPU (grouped forward time at tenants x local batch rows, interpolated
  linearly in rows, extrapolated from the last two points), or, when no GPU
  table exists, the stated assumption ``--assume-ms FIXED PER_ROW``
  (default 12 ms + 2.5 ms per row, a guess for a 2B VLM in bf16 on an
  H100/H200-class GPU: an ASSUMPTION, labelled as such in the output).

Host gaps are kept as measured (the simulators and the bus run on CPUs in
both settings). How many can run at once is the model's other input: with
``--host-slots 1`` they queue for one slot: one interpreter (``--deployment
in-process``, every role in one Python process) or one core for every host
process (``--deployment processes`` on a 2-core machine: the device host has
the other core); "host unlimited" lets every tenant's host work run in parallel (a GPU machine
with roles as processes on enough cores). Both are printed, for the CPU check
and for the projection. Optimizer steps are host time here (on a GPU machine
they would also use the device, outside the gate): not modelled.

The cores model (``benchmarks/cores_model.py``) replaces slots with CPU: when the
run's ``multi_tenant.json`` recorded each isolated turn's CPU per process kind
(``--deployment processes`` since 2026-12-07), each tenant's host work becomes
CPU asked of the core groups of the run's CPU plan, shared fairly when tenants
run at once. It prints two more rows: its CPU check (forward times fitted
through the isolated forwards only: their stretching when shared is the model's
part) and the projection onto a GPU machine's plan (``--gpu-cpus``, gpu.sh's
plan on 16 CPUs by default; ``--gpu-forward-share``: how much of its core a GPU
forward's host thread keeps busy; by default the GPU table's measured share
(``grouped_host_s``), else 1, an ASSUMPTION: host-bound, as the H200's forward
times of 2026-12-04 suggest, 66 ms for one row and 73 ms for eight).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from backbone.timeline import ForwardRecord

Duration = Callable[[str, int], float]


@dataclass(frozen=True)
class Policy:
    """The grouping and priority rules the model plays (the service's settings of the same names)."""

    max_wait_s: float = 0.050  # T: inference_max_wait_ms
    target_rows: int = 8  # B: inference_target_batch
    max_rows: int = 32  # one inference flush takes at most this many requests
    active_window_s: float = 1.0  # a tenant answered this recently is expected back (completeness)
    train_max_wait_s: float | None = 2.0  # train_max_wait_ms: training goes first after this wait
    train_budget_s: float | None = 0.2  # train_forward_budget_ms: rows of one training chunk

    @classmethod
    def of_settings(cls, settings: dict[str, Any]) -> Policy:
        """From the settings a run recorded (``multi_tenant.json``'s ``batching``) or today's."""
        ms = settings.get("train_max_wait_ms")
        budget = settings.get("train_forward_budget_ms")
        target = int(settings["inference_target_batch"])
        return cls(max_wait_s=settings["inference_max_wait_ms"] / 1e3, target_rows=target,
                   max_rows=max(target, 32), train_max_wait_s=None if ms is None else ms / 1e3,
                   train_budget_s=None if budget is None else budget / 1e3)


@dataclass(frozen=True)
class Item:
    queue: str
    rows: int
    gap_before_s: float  # host time between the previous item's end (or submission) and this start


@dataclass(frozen=True)
class Chain:
    tenant: str
    items: tuple[Item, ...]
    tail_s: float  # host time from the last item's end to completion


def chains_of(run: dict[str, Any]) -> list[Chain]:
    """One chain per tenant of an isolated run (each tenant was alone on the device)."""
    records = [ForwardRecord(q, s, e, tuple(t)) for q, s, e, t in run["forwards"]["forwards"]]
    chains = []
    for tenant, (submitted, completed) in zip(run["tenants"], run["spans"], strict=True):
        mine = sorted((r for r in records if tenant in r.tenants), key=lambda r: r.start_s)
        items, last_end = [], submitted
        for r in mine:
            items.append(Item(r.queue, r.rows, max(0.0, r.start_s - last_end)))
            last_end = r.end_s
        chains.append(Chain(tenant, tuple(items), max(0.0, completed - last_end)))
    return chains


def cpu_duration(runs: list[dict[str, Any]]) -> Duration:
    """Least squares per queue through the measured forwards (rows -> seconds)."""
    fits = {}
    for queue in ("inference", "train"):
        xs, ys = [], []
        for run in runs:
            for q, s, e, t in run["forwards"]["forwards"]:
                if q == queue:
                    xs.append(len(t))
                    ys.append(e - s)
        if len(set(xs)) >= 2:
            slope, intercept = np.polyfit(xs, ys, 1)
            fits[queue] = (max(float(intercept), 0.0), max(float(slope), 0.0))
        else:
            fits[queue] = (statistics.median(ys) if ys else 0.0, 0.0)
    return lambda queue, rows: fits[queue][0] + fits[queue][1] * rows


def host_share(path: Path) -> float | None:
    """How much of a grouped GPU forward its host thread was busy: the median over a
    ``group_batching.py`` table's rows (None: a table from before it recorded ``grouped_host_s``)."""
    shares = [r["grouped_host_s"] / r["grouped_s"] for r in json.loads(Path(path).read_text())
              if "grouped_host_s" in r and r["grouped_s"] > 0]
    return min(1.0, statistics.median(shares)) if shares else None


def table_duration(path: Path) -> Duration:
    """Grouped forward seconds at rows = tenants x local batch from a group_batching.py JSON."""
    by_rows: dict[int, list[float]] = {}
    for r in json.loads(Path(path).read_text()):
        by_rows.setdefault(r["tenants"] * r["local_batch"], []).append(r["grouped_s"])
    xs = sorted(by_rows)
    ys = [statistics.median(by_rows[x]) for x in xs]

    def duration(_queue: str, rows: int) -> float:
        if rows <= xs[-1]:
            return float(np.interp(rows, xs, ys))
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
        return ys[-1] + slope * (rows - xs[-1])

    return duration


def assumed_duration(fixed_ms: float, per_row_ms: float) -> Duration:
    return lambda _queue, rows: (fixed_ms + per_row_ms * rows) / 1e3


def isolated(chains: list[Chain], duration: Duration) -> dict[str, float]:
    busy = {"inference": 0.0, "train": 0.0}
    total = 0.0
    for chain in chains:
        for item in chain.items:
            d = duration(item.queue, item.rows)
            busy[item.queue] += d
            total += item.gap_before_s + d
        total += chain.tail_s
    return _figures(total, busy)


def shared(chains: list[Chain], duration: Duration, policy: Policy = Policy(),
           host_slots: int | None = None) -> dict[str, float]:
    """Discrete-event replay of all chains at once on one device. ``host_slots``: how many host
    gaps can run at the same time (None: as many as there are tenants; 1: one Python interpreter,
    as when every role shares one process and its GIL, or one core for every host process)."""
    hosts = [0.0] * (host_slots or len(chains))  # when each host slot is free (a heap)

    def after(t: float, gap: float) -> float:
        start = max(t, heapq.heappop(hosts))
        heapq.heappush(hosts, start + gap)
        return start + gap

    nxt = [0] * len(chains)
    ready = [after(0.0, c.items[0].gap_before_s) if c.items else 0.0 for c in chains]
    finish = [after(0.0, c.tail_s) if not c.items else 0.0 for c in chains]
    answered: list[float | None] = [None] * len(chains)  # when each chain's last inference was answered
    train_rows = _train_chunk_rows(chains, duration, policy)
    busy = {"inference": 0.0, "train": 0.0}
    device_free = batcher_free = 0.0
    forwards = 0

    def queue_of(i: int) -> str:
        return chains[i].items[nxt[i]].queue

    while True:
        live = [i for i, c in enumerate(chains) if nxt[i] < len(c.items)]
        if not live:
            break
        asking = [i for i in live if queue_of(i) == "inference"]
        training = [i for i in live if queue_of(i) == "train"]
        flush = (_flush_time({i: chains[i].items[nxt[i]].rows for i in asking}, ready, answered,
                             policy, batcher_free) if asking else math.inf)
        train_ready = min((ready[i] for i in training), default=math.inf)
        inference_start, train_start = max(flush, device_free), max(train_ready, device_free)
        bound = policy.train_max_wait_s
        starved = bound is not None and inference_start - train_ready >= bound
        if train_start < inference_start or (starved and train_start <= inference_start):
            queue, t, cap = "train", train_start, train_rows
            members = [i for i in training if ready[i] <= t]
        else:
            queue, t, cap = "inference", inference_start, policy.max_rows
            members = [i for i in asking if ready[i] <= flush]  # the group was formed at its flush
        members.sort(key=lambda i: ready[i])
        rows, taken = 0, []
        for i in members:
            r = chains[i].items[nxt[i]].rows
            if taken and rows + r > cap:
                break
            rows += r
            taken.append(i)
        d = duration(queue, rows)
        busy[queue] += d
        forwards += 1
        device_free = t + d
        if queue == "inference":
            batcher_free = device_free  # the batcher awaits its forward before forming the next group
        for i in taken:
            if queue == "inference":
                answered[i] = device_free
            nxt[i] += 1
            chain = chains[i]
            if nxt[i] < len(chain.items):
                ready[i] = after(device_free, chain.items[nxt[i]].gap_before_s)
            else:
                finish[i] = after(device_free, chain.tail_s)
    return _figures(max(finish + [device_free]), busy) | {"forwards": float(forwards)}


def _flush_time(asking: dict[int, int], ready: list[float], answered: list[float | None],
                policy: Policy, batcher_free: float) -> float:
    """When the batcher flushes its next group: at B rows, when the oldest waited T, or when every
    tenant answered in the last ``active_window_s`` has asked again; never while it awaits a forward.
    ``asking``: the chains whose next item is inference, with its rows."""
    order = sorted(asking, key=lambda i: ready[i])
    oldest = ready[order[0]]
    full, queued = math.inf, 0
    for i in order:
        queued += asking[i]
        if queued >= policy.target_rows:
            full = ready[i]
            break
    complete = oldest
    for j, at in enumerate(answered):
        if at is not None:  # expected back until it asks again or goes quiet
            back = ready[j] if j in asking else math.inf
            complete = max(complete, min(back, at + policy.active_window_s))
    return max(batcher_free, min(oldest + policy.max_wait_s, full, complete))


def _train_chunk_rows(chains: list[Chain], duration: Duration, policy: Policy) -> int:
    """Rows one training forward may take: what fits the device budget, and never less than the
    largest item measured (a chunk the gate already cut)."""
    largest = max((it.rows for c in chains for it in c.items if it.queue == "train"), default=1)
    if policy.train_budget_s is None:
        return 1 << 30
    rows = largest
    while rows < 100_000 and duration("train", rows + 1) <= policy.train_budget_s:
        rows += 1
    return rows


def _figures(device_time: float, busy: dict[str, float]) -> dict[str, float]:
    out = {"device_time_s": device_time, "busy_train_s": busy["train"], "busy_inference_s": busy["inference"]}
    for q in ("train", "inference"):
        out[f"busy_fraction_{q}"] = busy[q] / device_time if device_time else 0.0
    return out


def project(traces: list[dict[str, Any]], duration: Duration, policy: Policy,
            host_slots: int | None = None) -> dict[str, Any]:
    """Median over the isolated runs of the model's isolated and shared figures, and the ratios."""
    return medians([(isolated(chains_of(r), duration), shared(chains_of(r), duration, policy, host_slots))
                    for r in traces if r["mode"] == "isolated"])


def medians(results: list[tuple[dict[str, float], dict[str, float]]]) -> dict[str, Any]:
    """The medians of (isolated, shared) figures over passes, their ratios and the saving."""
    iso = {k: statistics.median(r[0][k] for r in results) for k in results[0][0]}
    sha = {k: statistics.median(r[1][k] for r in results) for k in results[0][1]}
    ratios = {k: sha[k] / iso[k] if iso[k] else None for k in iso}
    return {"isolated": iso, "shared": sha, "ratios": ratios,
            "device_time_saving": 1 - ratios["device_time_s"]}


def measured(traces: list[dict[str, Any]]) -> dict[str, float]:
    """The measured makespans (medians over the run's repeats of each mode)."""
    return {f"{mode}_device_time_s": statistics.median(r["makespan_s"] for r in traces if r["mode"] == mode)
            for mode in ("shared", "isolated")}


def policy_of(run_dir: Path) -> tuple[Policy, str]:
    """The rules the measured run used (its ``multi_tenant.json``), else today's settings."""
    recorded = run_dir / "multi_tenant.json"
    if recorded.exists() and "batching" in (run := json.loads(recorded.read_text())):
        return Policy.of_settings(run["batching"]), f"recorded in {recorded.name}"
    from infra.settings import Settings

    return Policy.of_settings(Settings().model_dump()), "today's settings: the run recorded none"


def _cores(args: argparse.Namespace, traces: list[dict[str, Any]], truth: dict[str, float], policy: Policy,
           gpu_duration: Duration) -> dict[str, Any]:
    """The cores model (``benchmarks/cores_model.py``) on the run's CPU plan, its miss, and on the
    GPU machine's plan; a reason instead when the run recorded no per-turn CPU."""
    from benchmarks import cores_model
    from infra.runtime.supervisor import parse_cpus

    recorded = args.run_dir / "multi_tenant.json"
    run = json.loads(recorded.read_text()) if recorded.exists() else {}
    if run.get("deployment") != "processes" or not all(r.get("turn_cpu") for r in run.get("runs", [])):
        return {"cores_skipped": "it needs a --deployment processes run that recorded each turn's CPU"}
    alone = cpu_duration([t for t in traces if t["mode"] == "isolated"])  # contention is the model's part
    cpu = cores_model.project_cores(traces, run["runs"], alone, policy, run["cpu_affinity"])
    miss = {mode: cpu[mode]["device_time_s"] / truth[f"{mode}_device_time_s"] - 1
            for mode in ("shared", "isolated")}
    share, source = args.gpu_forward_share, "given"
    if share is None:
        measured_share = host_share(args.gpu_table) if args.gpu_table else None
        share, source = ((measured_share, f"measured in {args.gpu_table.name}") if measured_share is not None
                         else (1.0, "ASSUMED: host-bound, no measured share in a GPU table"))
    gpu = cores_model.project_cores(traces, run["runs"], gpu_duration, policy,
                                    parse_cpus(args.gpu_cpus, here=False), share)
    return {"model_cpu_cores": cpu, "model_cpu_cores_miss": miss, "projection_gpu_cores": gpu,
            "gpu_forward_share": share, "gpu_forward_share_source": source}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--gpu-table", type=Path, default=None,
                        help="a group_batching.py --json measured on a GPU (else --assume-ms)")
    parser.add_argument("--assume-ms", type=float, nargs=2, default=(12.0, 2.5), metavar=("FIXED", "PER_ROW"))
    parser.add_argument("--host-slots", type=int, default=1,
                        help="host gaps that run at once in the limited-host variants (1: one interpreter)")
    parser.add_argument("--gpu-cpus", default="device=0,optimizer=1,rest=2-15",
                        help="the GPU machine's CPU plan for the cores model (gpu.sh's on 16 CPUs)")
    parser.add_argument("--gpu-forward-share", type=float, default=None,
                        help="of its core a GPU forward's host thread keeps busy (default: the GPU "
                             "table's measured share, else 1: host-bound)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    traces = json.loads((args.run_dir / "traces.json").read_text())
    truth = measured(traces)
    policy, policy_source = policy_of(args.run_dir)
    slots = args.host_slots
    cpu = project(traces, cpu_duration(traces), policy, slots)
    cpu_free = project(traces, cpu_duration(traces), policy, None)
    if args.gpu_table:
        gpu_source = f"measured GPU forward times from {args.gpu_table.name}"
        gpu_duration = table_duration(args.gpu_table)
    else:
        gpu_source = (f"ASSUMED GPU forward times: {args.assume_ms[0]} ms + {args.assume_ms[1]} ms per row "
                      "(not measured: no GPU table given)")
        gpu_duration = assumed_duration(*args.assume_ms)
    gpu = project(traces, gpu_duration, policy, None)
    gpu_one = project(traces, gpu_duration, policy, slots)
    cores = _cores(args, traces, truth, policy, gpu_duration)
    miss = {"shared": cpu["shared"]["device_time_s"] / truth["shared_device_time_s"] - 1,
            "isolated": cpu["isolated"]["device_time_s"] / truth["isolated_device_time_s"] - 1,
            "shared_unlimited_host": cpu_free["shared"]["device_time_s"] / truth["shared_device_time_s"] - 1}
    result = {"measured": truth, "model_cpu": cpu, "model_cpu_unlimited_host": cpu_free,
              "model_cpu_miss": miss, "projection_gpu": gpu, "projection_gpu_limited_host": gpu_one,
              "host_slots": slots, "gpu_source": gpu_source, **cores,
              "policy": {**policy.__dict__, "source": policy_source}}
    print("PROJECTION, not a measurement: a discrete-event model of one device fed with the measured "
          f"traces of {args.run_dir}\n")
    print("| | isolated device s | shared device s | device time saved | busy train iso -> shared "
          "| busy inference iso -> shared |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| measured (CPU) | {truth['isolated_device_time_s']:.1f} | {truth['shared_device_time_s']:.1f} "
          f"| {1 - truth['shared_device_time_s'] / truth['isolated_device_time_s']:.1%} | - | - |")
    rows = [(f"model, CPU forward times, {slots} host slot(s)", cpu),
            ("model, CPU forward times, host unlimited", cpu_free),
            ("PROJECTION, GPU forward times, host unlimited", gpu),
            (f"PROJECTION, GPU forward times, {slots} host slot(s)", gpu_one)]
    if "model_cpu_cores" in cores:
        rows += [("model, CPU forward times (isolated fit), the run's cores", cores["model_cpu_cores"]),
                 (f"PROJECTION, GPU forward times, cores {args.gpu_cpus}", cores["projection_gpu_cores"])]
    for name, r in rows:
        cells = []
        for q in ("train", "inference"):
            i, s = r["isolated"][f"busy_fraction_{q}"], r["shared"][f"busy_fraction_{q}"]
            cells.append(f"{i:.1%} -> {s:.1%} ({s / i if i else float('nan'):.2f}x)")
        print(f"| {name} | {r['isolated']['device_time_s']:.1f} | {r['shared']['device_time_s']:.1f} "
              f"| {r['device_time_saving']:.1%} | {cells[0]} | {cells[1]} |")
    print(f"\nmodel vs measurement with CPU forward times: shared makespan off by {miss['shared']:+.1%} "
          f"with {slots} host slot(s) ({miss['shared_unlimited_host']:+.1%} with unlimited host), "
          f"isolated by {miss['isolated']:+.1%}")
    if "model_cpu_cores" in cores:
        off = cores["model_cpu_cores_miss"]
        print(f"cores model vs measurement: shared off by {off['shared']:+.1%}, isolated by "
              f"{off['isolated']:+.1%} (host work as CPU on the run's cores "
              f"{cores['model_cpu_cores']['cores']}); "
              f"GPU forwards keep {cores['gpu_forward_share']:.2f} of their host core busy "
              f"({cores['gpu_forward_share_source']})")
    else:
        print(f"cores model: not played ({cores['cores_skipped']})")
    print(f"GPU forward times: {gpu_source}")
    print(f"rules played ({policy_source}): T {policy.max_wait_s * 1e3:g} ms, B {policy.target_rows}, "
          f"completeness window {policy.active_window_s:g} s, training first after "
          f"{policy.train_max_wait_s} s, training chunk budget {policy.train_budget_s} s")
    print("paper: 28.3% less device time; train busy 20.8% -> 41.3% (1.99x); inference 28.1% -> 37.5% "
          "(1.33x). targets: >= 40% less, >= 2.5x train busy fraction")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
