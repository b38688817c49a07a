"""Multi-tenant vs isolated: the paper's headline, measured on this machine, baseline in the same run.

    python -m benchmarks.multi_tenant [--repeats 3] [--scenario quick|full|smoke]
                                      [--no-maniskill | --builtin-third]
                                      [--deployment in-process|processes [--cpus device=0,optimizer=0,rest=1]
                                                    [--env-workers 3]]
                                      [--no-feature-cache] [--warm-up scenario|smoke]
                                      [--step-trace] [--json PATH] [--run-dir DIR]

The same fixed work per tenant (the demo's jobs: PPO on Reach twice, PPO on
ManiSkill PushCube, SFT on a Reach dataset; ``smoke`` is a seconds-long
shrink of it for tests and ``gpu.sh --dry-run``) runs through the same service
in two modes:

* isolated: one tenant after another, each alone on the service (what renting a
  device per tenant gives, minus the model loading);
* shared: all tenants at once, grouped into shared backbone forwards.

The device host's feature cache is on, as in the service (RL training finds the
features inference computed when acting; PPO and SFT epochs forward each input
once), and scoped per tenant (``feature_cache_scope=tenant``, the service's
default, forced here): every run uses fresh tenant ids, so no run finds
features an earlier run computed for the same inputs (same seeds), and each
tenant costs the device what it would cost alone. ``--no-feature-cache`` turns
it off (every gradient job's rows forwarded; how runs before 2026-11-30 were
measured).

First a warm-up (the scenario once, shared, not counted: it pays the one-off
costs such as importing ManiSkill and building the backbone; ``--warm-up smoke``
runs the smoke-sized shrink of the same jobs instead, which touches every code
path in a fraction of the time: ``gpu.sh`` uses it to fit its budget), then ``--repeats``
rounds, alternating the order (isolated first, then shared first, ...). Every
run uses fresh tenant ids, and a tenant's topics exist only during its turn
(``benchmarks/tenant_turns.py``: a shared run is one turn of all the tenants, an
isolated run one turn per tenant): made before it, deleted after it, the service's
consumer groups settled both times outside the clock. Until 2026-12-03 every
run's tenants were made up front, so the later runs of a benchmark carried every
earlier run's finished tenants in each fetch of each role. Per run: makespan, device time held, busy seconds
and busy fractions per queue (from the device gate), forwards. Printed: medians
with min-max spread, and shared/isolated ratios of the medians. Every tenant's
final parameters are compared across ALL runs (both modes, every repeat): they
must be bit-identical.

Device time held is the mode's makespan in both deployments (isolated: the sum
of the tenants' runs, as if each rented the device for its own run). What the
"device" is depends on ``--deployment``:

* ``in-process`` (default): every role in this ONE process; the device is its
  gate, and a forward's wall time includes waiting for the cores (and the GIL)
  the simulators use;
* ``processes``: the service as OS processes under the process supervisor (as
  ``joynexus up`` runs it: device host, master, env workers, optimizer,
  rollout, evaluator, health, metering), started ONCE for the warm-up and every
  run (a process start costs 15-30 s of imports here), with the device host
  and the optimizer pinned to one core and every other process, this one
  included, on the rest (``--cpus``; default: the first CPU this process may
  use for the device host and the optimizer, the others for the rest), so
  their busy seconds are the device's, as on a GPU machine, where the tenant
  modules' backward and optimizer step run on the device too (with the
  optimizer beside the simulators, its steps waited for their core: 7.6 ->
  21.1 ms a step shared, 2026-12-01). Busy seconds and forwards per queue come from the device host's
  timeline file (``settings.timeline_dir``), read after its next append; its
  heartbeats' busy seconds are kept beside them as a cross-check. Env workers
  are a fixed count (``--env-workers``, no autoscaling), so both modes run on
  the same processes.

``--step-trace`` (processes only) turns the inference role's step trace on
(``consumers/step_trace.py``) and prints where an env step's round trip went in
each mode: bus in, lookup, device (preparation, group wait, forward), head, ack,
means and medians over every traced step of the mode's passes.

Outputs: a table on stdout; ``--json`` (and ``RUN_DIR/multi_tenant.json``):
{scenario, repeats, runs: [...], medians, spread, ratios, bit_identical};
``RUN_DIR/comparison.json`` (``joynexus.comparison.v1``, for the report),
``jobs.json`` and ``forwards.json`` of the last shared run, ``report.html``, and
``traces.json`` (every counted run's forwards and per-tenant job spans, the
input of ``benchmarks/projection.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import os
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from backbone.timeline import ForwardLog, ForwardRecord, read_window
from benchmarks.tenant_turns import TenantTurns
from consumers.step_trace import STAGES, read_steps, stage_summary
from infra.errors import JoynexusError
from infra.runtime.affinity import pin_process
from infra.runtime.demo import ensure_dataset, scenario
from infra.runtime.supervisor import parse_cpus
from infra.settings import Settings

MODES = ("isolated", "shared")
METRICS = ("makespan_s", "device_time_s", "busy_train_s", "busy_inference_s", "busy_total_s",
           "busy_fraction_train", "busy_fraction_inference", "busy_fraction_total",
           "forwards_train", "forwards_inference", "busy_optimizer_s", "optimizer_steps",
           "busy_training_service_s", "busy_fraction_training_service", "steal_share")

STEAL_SKEW = 0.03  # a gap in stolen shares between the modes that moves the saving by points
# CPU seconds of one pass's fixed work, most over least within a mode: beyond this, the VM's speed moved
WORK_SKEW = 0.10
BATCHING = ("inference_target_batch", "inference_max_wait_ms", "train_forward_budget_ms",
            "train_max_wait_ms")  # the rules benchmarks/projection.py plays


def bench_scenario(name: str, dataset: Path, maniskill: bool, builtin_third: bool = False,
                   iterations: int | None = None) -> list[dict[str, Any]]:
    """The demo's job specs (``quick`` or ``full``), or ``smoke``: the quick ones shrunk to seconds.
    ``builtin_third``: the third RL tenant on the built-in Push task instead of ManiSkill PushCube
    (still 3 RL + 1 SFT, without ManiSkill's 20-40 ms renders and its start-up). ``iterations``:
    at most that many per RL tenant (``quick``/``full``; the SFT tenant keeps its epochs)."""
    specs = copy.deepcopy(scenario(name != "full", dataset, maniskill and not builtin_third))
    if builtin_third:
        reach = next(s for s in specs if s["kind"] == "rl")
        specs.append({**copy.deepcopy(reach), "tenant": "push", "seed": 4,
                      "env": {**reach["env"], "env_id": "joynexus/Push-v0"}})
    if name != "smoke":
        for spec in specs:
            if spec["kind"] == "rl" and iterations is not None:
                spec["rl"]["iterations"] = min(iterations, spec["rl"]["iterations"])
        return specs
    for spec in specs:
        if spec["kind"] == "rl":
            spec["env"]["max_episode_steps"] = 8
            spec["rl"].update(iterations=1, episodes_per_iteration=2, minibatch_size=8, ppo_epochs=1)
        else:
            spec["sft"].update(epochs=1, publish_every=5)
    return specs


class InProcessDevice:
    """The device as seen by the benchmark when every role runs in this process: the service's gate."""

    def __init__(self, service) -> None:
        self.gate = service.gate

    async def snapshot(self) -> dict[str, float]:
        return {"busy_inference_s": self.gate.busy_s["inference"], "busy_train_s": self.gate.busy_s["train"],
                "forwards_inference": float(self.gate.forwards["inference"]),
                "forwards_train": float(self.gate.forwards["train"]), "clock_s": self.gate.timeline.now(),
                "steal_s": steal_seconds()}

    def timeline_since(self, start_s: float):
        return self.gate.timeline.since(start_s)

    @property
    def origin_unix(self) -> float:
        """The wall time of the timeline's zero."""
        return self.gate.timeline.origin_unix

    def clock(self) -> float:
        """Now, on the clock of the timeline's records."""
        return self.gate.timeline.now()


def steal_seconds() -> float:
    """CPU seconds the hypervisor gave other guests while this machine's CPUs wanted to run, all
    CPUs together, since boot (``/proc/stat``; 0 where there is none): a pass that ran slower
    because the VM's host was busy says so here."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return 0.0
    # "cpu user nice system idle iowait irq softirq steal ..." (proc(5))
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` and its waited-for children (0: gone or None)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    # after the name: state is field 3, utime..cstime are fields 14-17 (proc(5))
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def runqueue_seconds(pid: int | None) -> float:
    """Seconds the threads of process ``pid`` were runnable but waiting for a CPU (the second field
    of each ``/proc/<pid>/task/<tid>/schedstat``; 0: gone, None, or no schedstats): how long it
    queued behind other processes of its core. Threads that already exited are not counted."""
    if pid is None:
        return 0.0
    total = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0.0
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


class ProcessDevice:
    """The device host of a ``ProcessSupervisor``, seen from this process: busy seconds and forwards
    per queue from the forwards it appends to its timeline file, on a clock of Unix seconds since
    this object was made (the records are Unix times, so the two processes' clocks agree)."""

    def __init__(self, supervisor) -> None:
        from consumers.inference import TIMELINE_EXPORT_S
        from infra.broker import LocalBroker

        self.supervisor = supervisor
        ours = supervisor.settings.bootstrap_servers is None  # a broker this benchmark started
        self.broker = LocalBroker(supervisor.settings) if ours else None
        self.timeline_dir = supervisor.settings.timeline_dir
        self.export_s = TIMELINE_EXPORT_S
        self.origin_unix = time.time()

    def clock(self) -> float:
        return time.time() - self.origin_unix

    async def snapshot(self) -> dict[str, float]:
        """Totals of the forwards that started up to now. The device host appends its new forwards
        every ``export_s``: read once it has appended after now, and once a heartbeat sent after
        that append is in (its cumulative busy seconds, the cross-check, then cover the same span)."""
        cut = self.clock()
        await asyncio.sleep(self.export_s + 0.5)
        beat = await self._heartbeat_after(self.origin_unix + cut + self.export_s + 0.5)
        forwards = [f for f in self.timeline_since(0.0) if f.start_s <= cut]
        snap = {"clock_s": cut,
                "busy_total_s_heartbeats": float(beat.get("busy_inference_s", 0.0))
                + float(beat.get("busy_train_s", 0.0)),
                "process_restarts": float(sum(i.restarts for i in self.supervisor.instances))}
        for queue in ("inference", "train"):
            mine = [f for f in forwards if f.queue == queue]
            snap[f"busy_{queue}_s"] = sum(f.busy_s for f in mine)
            snap[f"forwards_{queue}"] = float(len(mine))
        return snap | self.cpu() | {"steal_s": steal_seconds()}  # the machine's, not a process's

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far per process kind (``cpu_<kind>_s``), the broker and this process (the
        tenants' client) included: where the cores' time goes. A restart resets its process's
        count (``process_restarts`` says whether one happened)."""
        out: dict[str, float] = {}
        broker = self.broker.pid() if self.broker else None
        pids = [(inst.kind, inst.pid) for inst in self.supervisor.instances]
        for kind, pid in [*pids, ("broker", broker), ("client", os.getpid())]:
            for key, value in ((f"cpu_{kind}_s", cpu_seconds(pid)),
                               (f"rqwait_{kind}_s", runqueue_seconds(pid))):
                out[key] = out.get(key, 0.0) + value
        return out

    async def _heartbeat_after(self, unix: float) -> dict[str, str]:
        """The details of the first inference-role heartbeat the device host sent after ``unix``."""
        (device,) = self.supervisor.of_kind("device")
        deadline = time.monotonic() + 10 * self.supervisor.settings.heartbeat_s + 30.0
        while True:
            for state in self.supervisor.view.book.of_role("inference"):
                if state.instance_id == device.instance_id and state.pid == device.pid \
                        and state.beat_at.timestamp() > unix:
                    return state.details
            if time.monotonic() > deadline:
                raise RuntimeError(f"the device host {device.instance_id} sent no heartbeat; see "
                                   f"{self.supervisor.log_dir}")
            await asyncio.sleep(0.2)

    def timeline_since(self, start_s: float) -> list[ForwardRecord]:
        return [f for f in read_window(self.timeline_dir, self.origin_unix) if f.start_s >= start_s]


@contextlib.asynccontextmanager
async def in_process(settings: Settings):
    """Every role in this process over one ``Service``: (device, policy store)."""
    from consumers.service import Service
    from infra.runtime.host import RoleHost

    service = await Service.open(settings)
    try:
        async with RoleHost(service.settings, service=service):  # every role in this process
            yield InProcessDevice(service), service.store
    finally:
        await service.close()


@contextlib.asynccontextmanager
async def processes(settings: Settings, console: Console, env_workers: int):
    """The service as OS processes, started once and kept for every run: (device, policy store)."""
    from infra.runtime.supervisor import DEFAULT_KINDS, ProcessSupervisor
    from tenants.policy_store import PolicyStore

    supervisor = ProcessSupervisor(settings, DEFAULT_KINDS, {"env": env_workers}, autoscale=False)
    async with supervisor:
        with console.status(f"starting {len(supervisor.instances)} processes, CPUs {settings.cpu_affinity} "
                            f"(logs in {supervisor.log_dir})"):
            await supervisor.wait_healthy()
        yield ProcessDevice(supervisor), PolicyStore(settings.policy_dir)


def default_cpus() -> dict[str, list[int]]:
    """The device host and the optimizer (the device's work on a GPU machine) on the first CPU this
    process may use, everything else on the others."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit(f"--deployment processes needs 2 CPUs or more (device + the rest); this process "
                         f"may use {cpus}")
    return {"device": cpus[:1], "optimizer": cpus[:1], "rest": cpus[1:]}


async def _follow(client, specs: list[dict], together: bool, clock) -> tuple[list, list]:
    """The jobs' final states, and each job's (submitted, completed) on the device's ``clock``."""
    spans: list[list[float]] = [[0.0, 0.0] for _ in specs]

    async def one(i: int, handle):
        state = await client.follow(handle, timeout_s=3600)
        spans[i][1] = clock()
        return state

    if together:
        handles = []
        for i, spec in enumerate(specs):
            spans[i][0] = clock()
            handles.append(await client.submit(spec))
        states = await asyncio.gather(*(one(i, h) for i, h in enumerate(handles)))
    else:
        states = []
        for i, spec in enumerate(specs):
            spans[i][0] = clock()
            states.append(await one(i, await client.submit(spec)))
    bad = [(s.tenant, s.phase, s.reason) for s in states if s.phase != "completed"]
    if bad:
        raise RuntimeError(f"jobs did not complete: {bad}")
    return states, spans


class OptimizerSeconds:
    """The optimizer's metered step seconds and steps per tenant, folded from the shared usage topic.

    A tenant's last version, its usage and its ``JobCompleted`` are one transaction, so once a
    run's jobs have completed, reading the topic to its end finds every step of the run. Usage
    ids are unique per version: a replayed publish is counted once."""

    def __init__(self, settings: Settings) -> None:
        from infra.follow import TopicFollower, from_beginning
        from infra.topics import shared_topic

        self.topic = shared_topic(settings, "usage")
        self.seconds: dict[str, float] = {}
        self.steps: dict[str, int] = {}
        self.seen: set[str] = set()
        # read only through caught_up (which waits for no settling): settling keeps the
        # benchmark's own reading off the core it shares with the simulators
        self.follower = TopicFollower(settings, self.topic, self._fold, name="bench-usage",
                                      seek=from_beginning, settle_s=settings.read_model_settle_ms / 1000)

    def _fold(self, event, record) -> None:
        from schemas.events import UsageRecorded

        if isinstance(event, UsageRecorded) and event.role == "optimizer" and event.usage_id not in self.seen:
            self.seen.add(event.usage_id)
            self.seconds[event.tenant_id] = self.seconds.get(event.tenant_id, 0.0) + event.seconds
            self.steps[event.tenant_id] = self.steps.get(event.tenant_id, 0) + event.steps

    async def __aenter__(self) -> OptimizerSeconds:
        await self.follower.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.follower.stop()

    async def of(self, tenants: list[str]) -> tuple[float, int]:
        """(step seconds, steps) of ``tenants``."""
        await self.follower.caught_up([self.topic], timeout_s=60.0)
        return sum(self.seconds.get(t, 0.0) for t in tenants), sum(self.steps.get(t, 0) for t in tenants)


async def run_mode(device, client, turns: TenantTurns, base: list[dict], mode: str, label: str,
                   optimizer: OptimizerSeconds, steps_dir: Path | None = None) -> dict[str, Any]:
    """One pass: shared, one turn of every tenant at once; isolated, one turn per tenant, one after
    another. Each turn's tenants exist only during it (``TenantTurns``); its measures are taken
    between two snapshots inside it, and the mode's are their sums; each turn's CPU seconds per
    process kind are also kept (``turn_cpu``, in turn order: one entry a tenant when isolated, for
    ``benchmarks/cores_model.py``). ``steps_dir``: where the step trace is (read for the turns'
    windows; None: not traced)."""
    specs = [{**s, "tenant": f"{s['tenant']}-{label}", "job_id": "bench"} for s in base]
    run: dict[str, Any] = {"turn_cpu": []}
    states, spans, forwards, steps, makespan = [], [], [], [], 0.0
    for group in [specs] if mode == "shared" else [[s] for s in specs]:
        async with turns.turn(s["tenant"] for s in group):
            before = await device.snapshot()
            began = time.monotonic()
            done, done_spans = await _follow(client, group, mode == "shared", device.clock)
            makespan += time.monotonic() - began
            after = await device.snapshot()
        for k in after.keys() - {"clock_s"}:
            run[k] = run.get(k, 0.0) + after[k] - before[k]
        run["turn_cpu"].append({k: after[k] - before[k] for k in after if k.startswith("cpu_")})
        states += done
        spans += done_spans
        forwards += [f for f in device.timeline_since(before["clock_s"]) if f.start_s <= after["clock_s"]]
        if steps_dir is not None:  # the snapshot waited for the device host's next export
            steps += read_steps(steps_dir, device.origin_unix + before["clock_s"],
                                device.origin_unix + after["clock_s"])
    run |= {"mode": mode, "makespan_s": makespan, "device_time_s": makespan,
            "busy_total_s": run["busy_train_s"] + run["busy_inference_s"]}
    run["busy_optimizer_s"], run["optimizer_steps"] = await optimizer.of([s["tenant"] for s in specs])
    run["busy_training_service_s"] = run["busy_train_s"] + run["busy_optimizer_s"]
    run["steal_share"] = run["steal_s"] / ((os.cpu_count() or 1) * makespan)  # of the CPUs' time
    for q in ("train", "inference", "total", "training_service"):
        run[f"busy_fraction_{q}"] = run[f"busy_{q}_s"] / makespan
    run["tenants"] = [s["tenant"] for s in specs]
    run["kinds"] = [s["kind"] for s in specs]
    run["spans"] = spans  # per tenant: (submitted, completed) on the timeline's clock
    run["_states"] = states
    run["_forwards"] = forwards
    run["_steps"] = steps
    if steps_dir is not None:
        run["steps_traced"] = len(steps)
    return run


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    medians, spread = {}, {}
    for mode in MODES:
        rows = [r for r in runs if r["mode"] == mode]
        medians[mode] = {m: statistics.median(r[m] for r in rows) for m in METRICS}
        spread[mode] = {m: [min(r[m] for r in rows), max(r[m] for r in rows)] for m in METRICS}
    ratios = {m: (medians["shared"][m] / medians["isolated"][m]) if medians["isolated"][m] else None
              for m in METRICS}
    return {"medians": medians, "spread": spread, "ratios": ratios,
            "device_time_saving": 1 - ratios["device_time_s"]}


def cpu_medians(runs: list[dict[str, Any]], prefix: str = "cpu_") -> dict[str, dict[str, float]]:
    """Per mode: median CPU seconds per process kind (``processes`` deployment; empty in-process), or
    with ``prefix="rqwait_"`` the seconds each kind waited for a CPU."""
    kinds = sorted({k for r in runs for k in r if k.startswith(prefix)})
    return {mode: {k: statistics.median(r.get(k, 0.0) for r in runs if r["mode"] == mode) for k in kinds}
            for mode in MODES}


def print_cpu(console: Console, cpu: dict[str, dict[str, float]], affinity: dict[str, list[int]],
              wait: dict[str, dict[str, float]] | None = None) -> None:
    kinds = list(cpu["isolated"])
    if not kinds:
        return
    wait = wait or {"isolated": {}, "shared": {}}
    table = Table("process kind", "isolated CPU s (median)", "shared CPU s (median)", "shared / isolated",
                  "waited for a CPU, s: isolated / shared",
                  title="where the cores' time goes (CPUs: " + ", ".join(
                      f"{kind} {cpus}" for kind, cpus in affinity.items()) + ")")
    for k in [*kinds, "total"]:
        name = k.removeprefix("cpu_").removesuffix("_s")
        iso = sum(cpu["isolated"].values()) if k == "total" else cpu["isolated"][k]
        sha = sum(cpu["shared"].values()) if k == "total" else cpu["shared"][k]
        waits = [sum(wait[m].values()) if k == "total" else wait[m].get(f"rqwait_{name}_s", 0.0)
                 for m in MODES]
        table.add_row(name, f"{iso:.1f}", f"{sha:.1f}", f"{sha / iso:.3f}" if iso else "-",
                      " / ".join(f"{w:.1f}" for w in waits))
    console.print(table)


def step_stages(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per mode: each stage of the traced steps of all its passes (empty when not traced)."""
    return {mode: stage_summary(s for r in runs if r["mode"] == mode for s in r["_steps"]) for mode in MODES}


def print_stages(console: Console, stages: dict[str, dict[str, dict[str, float]]]) -> None:
    if not stages["isolated"] or not stages["shared"]:
        return
    counts = " / ".join(f"{stages[mode]['total']['steps']:.0f}" for mode in MODES)
    table = Table("stage", "isolated ms: mean / p50", "shared ms: mean / p50", "shared / isolated (means)",
                  title=f"where an env step's round trip goes (device host) (step trace; {counts} steps)")
    for name in (*STAGES, "total"):
        iso, sha = stages["isolated"][name], stages["shared"][name]
        ratio = f"{sha['mean_ms'] / iso['mean_ms']:.2f}" if iso["mean_ms"] else "-"
        table.add_row(name, *(f"{m['mean_ms']:.2f} / {m['p50_ms']:.2f}" for m in (iso, sha)), ratio)
    console.print(table)


def print_steal(console: Console, runs: list[dict[str, Any]], medians: dict[str, dict[str, float]]) -> None:
    """Per pass, in run order: what the VM's host took from this machine's CPUs, and a warning
    when it took more from one mode than the other: on 2026-12-02 one commit measured 18.4-36.6%
    in five 1-repeat runs, and the figure moved with what the host stole from each pass."""
    console.print("CPU stolen by the VM's host per pass (both CPUs): "
                  + ", ".join(f"{r['mode']} {r['repeat'] + 1}: {r['steal_s']:.1f} s" for r in runs))
    iso, shared = (medians[mode]["steal_share"] for mode in MODES)
    console.print(f"stolen, share of the CPUs' time (medians): isolated {iso:.1%}, shared {shared:.1%}")
    if abs(iso - shared) > STEAL_SKEW:
        more = "isolated" if iso > shared else "shared"
        console.print(f"[bold yellow]warning:[/] the VM's host stole more from the {more} passes: this "
                      f"run's saving is {'flattered' if more == 'isolated' else 'understated'} by it; "
                      "compare several runs, not one")


def pass_cpu(run: dict[str, Any]) -> float:
    """The CPU seconds every process kind spent in one pass (0 in-process: no kinds)."""
    return sum(v for k, v in run.items() if k.startswith("cpu_"))


def median_cpu(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per mode, the median of its passes' CPU seconds (``pass_cpu``; None without any: in-process)."""
    medians: dict[str, float | None] = {}
    for mode in MODES:
        totals = [pass_cpu(r) for r in runs if r["mode"] == mode and pass_cpu(r) > 0]
        medians[mode] = statistics.median(totals) if totals else None
    return medians


def work_skew(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per mode: how much more CPU the costliest pass took than the cheapest (processes deployment;
    None in-process). Every pass of a mode does the same work, so on a steady VM this is a few
    percent (2-6% in four 3-repeat runs on 2026-12-07); in two runs of that morning it was 21% and
    24% (56.7 -> 68.7 CPU s in one's isolated passes), and their savings read 46.2% and 32.3% where
    steady runs of the same code read 33-39%."""
    skew: dict[str, float | None] = {}
    for mode in MODES:
        totals = [pass_cpu(r) for r in runs if r["mode"] == mode]
        skew[mode] = max(totals) / min(totals) - 1 if totals and min(totals) > 0 else None
    return skew


def cores_busy(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per mode, the median over its passes of the service's CPU seconds over the makespan: how many
    cores it kept busy on average (None in-process). A pass's makespan is its CPU over this, so
    for one pass of each mode saving = 1 - (shared / isolated CPU) / (shared / isolated cores)
    (with medians, about that): sharing saves by keeping more cores busy and by needing less CPU
    for the same work. Unlike the makespan this hardly moves with the VM's speed: of this VM's two
    cores the median shared pass kept 1.50-1.57 busy in each of the fourteen 2026-12-07 runs at
    B = 8 (1.40-1.44 at B = 16 and 24), the median isolated one 1.05-1.17 (each tenant alone waits
    on one core while its step is on the other)."""
    busy: dict[str, float | None] = {}
    for mode in MODES:
        ratios = [pass_cpu(r) / r["makespan_s"] for r in runs if r["mode"] == mode and pass_cpu(r) > 0]
        busy[mode] = statistics.median(ratios) if ratios else None
    return busy


def skew_warning(skew: dict[str, float | None]) -> str | None:
    """What a run whose VM's speed moved between passes must say beside its saving, or None."""
    known = {mode: v for mode, v in skew.items() if v is not None}
    if not known or max(known.values()) <= WORK_SKEW:
        return None
    worst = max(known, key=lambda mode: known[mode])
    return (f"one {worst} pass took {known[worst]:.0%} more CPU than another for the same work: the VM's "
            "speed moved during this run, and the saving moves with it; compare several runs, and each "
            "mode's makespan per CPU second")


def print_work(console: Console, runs: list[dict[str, Any]], skew: dict[str, float | None]) -> None:
    """Per pass, in run order: the service's CPU seconds; per mode, the cores it kept busy and its
    CPU ratio (``cores_busy``); and a warning when the same work cost markedly more in one pass
    than another: the VM's speed moved within the run."""
    if any(v is None for v in skew.values()):
        return
    console.print("CPU seconds of the whole service per pass (the same work in every pass of a mode): "
                  + ", ".join(f"{r['mode']} {r['repeat'] + 1}: {pass_cpu(r):.1f}" for r in runs))
    busy = cores_busy(runs)
    cpu = median_cpu(runs)
    console.print("cores the service kept busy on average (its CPU seconds / makespan, medians): "
                  f"isolated {busy['isolated']:.3f}, shared {busy['shared']:.3f} "
                  f"({busy['shared'] / busy['isolated']:.2f}x); its CPU for the same work, shared / "
                  f"isolated: {cpu['shared'] / cpu['isolated']:.3f}")
    if (warning := skew_warning(skew)) is not None:
        console.print(f"[bold yellow]warning:[/] {warning}")


def bit_identical(store, runs: list[dict[str, Any]]) -> list[bool]:
    """Per tenant (scenario position): its final parameters equal in every run, both modes."""
    reference = [store.load(t).state.model for t in runs[0]["tenants"]]
    same = [True] * len(reference)
    for run in runs[1:]:
        for i, tenant in enumerate(run["tenants"]):
            model = store.load(tenant).state.model
            same[i] &= model.keys() == reference[i].keys() and all(
                torch.equal(model[k], reference[i][k]) for k in model)
    return same


def print_table(console: Console, result: dict[str, Any], title: str) -> None:
    table = Table("metric", "isolated median [min-max]", "shared median [min-max]", "shared / isolated",
                  title=title)
    for m in METRICS:
        cells = []
        for mode in MODES:
            lo, hi = result["spread"][mode][m]
            digits = 3 if m.startswith("busy_fraction") or m == "steal_share" else 2
            cells.append(f"{result['medians'][mode][m]:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]")
        ratio = result["ratios"][m]
        table.add_row(m, *cells, "-" if ratio is None else f"{ratio:.3f}")
    console.print(table)


def print_verdicts(console: Console, result: dict[str, Any], runs: list[dict[str, Any]],
                   cpu_affinity: dict[str, list[int]] | None) -> None:
    """The headline figures against the paper's and the targets, one line each."""
    same = result["bit_identical"]
    console.print(f"device time saved by sharing: {result['device_time_saving']:.1%} "
                  f"(paper: 28.3%, target: >= 40%)")
    fractions = result["medians"]
    for q, name, paper in (
            ("training_service", "training service (backbone training forwards + optimizer steps)",
             "20.8% -> 41.3%, 1.99x; target >= 2.5x"),
            ("train", "backbone training forwards alone", "-"),
            ("inference", "inference", "28.1% -> 37.5%, 1.33x")):
        iso, sha = fractions["isolated"][f"busy_fraction_{q}"], fractions["shared"][f"busy_fraction_{q}"]
        ratio = sha / iso if iso else float("nan")
        console.print(f"busy fraction, {name}: {iso:.1%} -> {sha:.1%}, {ratio:.2f}x (paper: {paper})")
    console.print(f"final parameters bit-identical across all {len(runs)} runs: "
                  f"{sum(same)}/{len(same)} tenants")
    if cpu_affinity is not None:
        gap = max(abs(r["busy_total_s"] - r["busy_total_s_heartbeats"]) for r in runs)
        restarts = sum(r["process_restarts"] for r in runs)
        console.print(f"CPU affinity: {cpu_affinity}; busy seconds from its timeline, "
                      f"largest gap to its heartbeats' {gap:.3f} s; process restarts during counted runs: "
                      f"{restarts:.0f}")


def write_run_dir(run_dir: Path, result: dict[str, Any], runs: list[dict[str, Any]], origin_unix: float,
                  args: argparse.Namespace) -> None:
    """The run's files: the result, the report's comparison, the last shared pass's jobs and forwards
    (the report's pictures), and every counted pass's traces (for ``benchmarks/projection.py``)."""
    from infra.runtime.report import COMPARISON_FORMAT

    last_shared = [r for r in runs if r["mode"] == "shared"][-1]
    (run_dir / "multi_tenant.json").write_text(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    (run_dir / "comparison.json").write_text(json.dumps({
        "format": COMPARISON_FORMAT, "modes": result["medians"],
        "note": f"medians of {args.repeats} alternating repeats after a warm-up "
                f"(benchmarks/multi_tenant.py, scenario {args.scenario}, deployment {args.deployment})"
                + (f"; warning: {warning}" if (warning := skew_warning(result["work_skew"])) else "")},
        indent=2))
    jobs = {s.tenant: {"job_id": s.job_id, "phase": s.phase, "history": s.history}
            for s in last_shared["_states"]}
    (run_dir / "jobs.json").write_text(json.dumps(jobs, indent=2, default=str))
    forwards = last_shared["_forwards"]
    origin = min((f.start_s for f in forwards), default=0.0)  # the report's clock starts with the run
    ForwardLog().dump(run_dir / "forwards.json", [
        ForwardRecord(f.queue, f.start_s - origin, f.end_s - origin, f.tenants) for f in forwards],
        origin_unix=origin_unix + origin)
    # every counted run's forwards and job spans, for the projection model (benchmarks/projection.py)
    (run_dir / "traces.json").write_text(json.dumps([
        {"mode": r["mode"], "repeat": r["repeat"], "tenants": r["tenants"], "kinds": r["kinds"],
         "spans": r["spans"], "makespan_s": r["makespan_s"],
         "forwards": ForwardLog().to_json(r["_forwards"], origin_unix=origin_unix)} for r in runs]))


async def run_passes(device, client, turns: TenantTurns, optimizer: OptimizerSeconds, warm: list[dict],
                     base: list[dict], args: argparse.Namespace, tag: str, console: Console,
                     steps_dir: Path | None) -> list[dict[str, Any]]:
    """The warm-up (not counted), then ``args.repeats`` rounds of both modes, alternating which
    goes first; each pass is printed as it ends, so a run cut short still shows its passes."""
    order = [("isolated", "shared") if r % 2 == 0 else ("shared", "isolated") for r in range(args.repeats)]
    runs: list[dict[str, Any]] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        bar = progress.add_task("warm-up (not counted)", total=1 + 2 * args.repeats)
        await run_mode(device, client, turns, warm, "shared", f"w{tag}", optimizer)
        progress.advance(bar)
        for r, modes in enumerate(order):
            for mode in modes:
                progress.update(bar, description=f"repeat {r + 1}/{args.repeats}: {mode}")
                run = await run_mode(device, client, turns, base, mode, f"{mode[0]}{r}{tag}", optimizer,
                                     steps_dir)
                run["repeat"], run["order"] = r, "-".join(modes)
                runs.append(run)
                progress.console.print(
                    f"repeat {r + 1} {mode}: makespan {run['makespan_s']:.1f} s, inference busy "
                    f"{run['busy_inference_s']:.1f} s in {run['forwards_inference']:.0f} forwards, "
                    f"optimizer {run['busy_optimizer_s']:.1f} s")
                progress.advance(bar)
    return runs


def print_result(console: Console, result: dict[str, Any], runs: list[dict[str, Any]], settings: Settings,
                 args: argparse.Namespace) -> None:
    """Every table and verdict of the run, in the order a reader wants them."""
    print_table(console, result, f"multi-tenant vs isolated: {result['tenants']} tenants, "
                f"backbone {settings.backbone}, scenario {args.scenario}, "
                f"{args.repeats} repeats (alternating order), warm-up first")
    print_cpu(console, result["cpu_medians"], settings.cpu_affinity, result["runqueue_wait_medians"])
    print_stages(console, result["step_stages"])
    print_steal(console, runs, result["medians"])
    print_work(console, runs, result["work_skew"])
    print_verdicts(console, result, runs, settings.cpu_affinity if args.deployment == "processes" else None)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from infra.broker import LocalBroker
    from infra.runtime.report import write_report
    from infra.topics import TopicAdmin
    from producers.client.sdk import Client

    settings = Settings()
    console = Console() if Console().is_terminal else Console(width=160)  # piped: keep the table wide
    # per tenant: fresh tenant ids per run, so no run reuses an earlier run's features (same seeds)
    settings = settings.model_copy(update={"feature_cache_scope": "tenant"} if args.feature_cache
                                   else {"train_feature_cache_mb": 0.0})
    if args.deployment == "processes":
        settings = settings.model_copy(update={"cpu_affinity": args.cpus or default_cpus(),
                                               "step_trace": args.step_trace or settings.step_trace})
        # this process (the tenants' client) and a broker it starts below stay off the device's core
        pin_process(settings.cpu_affinity, "benchmark")
    if settings.bootstrap_servers is None:
        await asyncio.to_thread(LocalBroker(settings).up)
    dataset = await asyncio.to_thread(ensure_dataset, settings, args.scenario != "full")
    tag = datetime.now(UTC).strftime("%m%d%H%M%S")
    run_dir = args.run_dir or settings.run_dir / f"multi-tenant-{tag}"
    run_dir.mkdir(parents=True, exist_ok=True)
    base = bench_scenario(args.scenario, dataset, not args.no_maniskill, args.builtin_third, args.iterations)
    async with TopicAdmin(settings) as admin:
        await admin.ensure_shared()
    deployment = (processes(settings, console, args.env_workers) if args.deployment == "processes"
                  else in_process(settings))
    async with deployment as (device, store):
        async with Client(settings, requested_by="benchmark") as client, \
                OptimizerSeconds(settings) as optimizer, TenantTurns(settings) as turns:
            warm = base if args.warm_up == "scenario" else bench_scenario(
                "smoke", dataset, not args.no_maniskill, args.builtin_third)
            runs = await run_passes(device, client, turns, optimizer, warm, base, args, tag, console,
                                    settings.timeline_dir if args.step_trace else None)
        same = bit_identical(store, runs)
    result = {"scenario": args.scenario, "iterations": args.iterations, "tenants": len(base),
              "backbone": settings.backbone,
              "repeats": args.repeats, "warm_up": args.warm_up, "deployment": args.deployment,
              "cpu_affinity": settings.cpu_affinity,
              "feature_cache_mb": settings.train_feature_cache_mb,
              "feature_cache_scope": settings.feature_cache_scope,
              "batching": {k: getattr(settings, k) for k in BATCHING}, **summarise(runs),
              "bit_identical": same, "cpu_medians": cpu_medians(runs),
              "runqueue_wait_medians": cpu_medians(runs, "rqwait_"), "step_stages": step_stages(runs),
              "work_skew": work_skew(runs), "cores_busy": cores_busy(runs),
              "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in runs]}
    print_result(console, result, runs, settings, args)
    write_run_dir(run_dir, result, runs, device.origin_unix, args)
    console.print(f"run directory: {run_dir} (multi_tenant.json, report.html: {write_report(run_dir).name})")
    return result


def _cpus(text: str) -> dict[str, list[int]]:
    try:
        return parse_cpus(text)
    except JoynexusError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds of (isolated, shared), alternating which goes first")
    parser.add_argument("--scenario", choices=("smoke", "quick", "full"), default="quick")
    parser.add_argument("--iterations", type=int, default=None,
                        help="at most this many iterations per RL tenant (quick: 8; the SFT tenant "
                             "is unchanged): a shorter run with the same kinds of work")
    parser.add_argument("--no-maniskill", action="store_true", help="drop the ManiSkill tenant")
    parser.add_argument("--builtin-third", action="store_true",
                        help="the third RL tenant on the built-in Push task instead of ManiSkill PushCube")
    parser.add_argument("--deployment", choices=("in-process", "processes"), default="in-process",
                        help="roles in this process, or as OS processes with the device host and "
                             "the optimizer on their own core")
    parser.add_argument("--cpus", type=_cpus, default=None,
                        help="processes: CPU affinity per kind, e.g. device=0,rest=1 (default: the first "
                             "CPU this process may use for the device host and the optimizer, the "
                             "others for the rest)")
    parser.add_argument("--env-workers", type=int, default=3,
                        help="processes: env worker processes (fixed: no autoscaling between modes)")
    parser.add_argument("--no-feature-cache", dest="feature_cache", action="store_false",
                        help="turn the device host's feature cache off: every gradient job's rows are "
                             "forwarded (PPO: every epoch), as runs before 2026-11-30 measured")
    parser.add_argument("--warm-up", choices=("scenario", "smoke"), default="scenario",
                        help="the uncounted first run: the scenario itself, or its smoke-sized shrink")
    parser.add_argument("--step-trace", action="store_true",
                        help="processes: trace every answered step's stages in the device host and "
                             "print them per mode (consumers/step_trace.py)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--run-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.iterations is not None and args.iterations < 1:
        parser.error("--iterations must be >= 1")
    if args.env_workers < 1:
        parser.error("--env-workers must be >= 1")
    if args.step_trace and args.deployment != "processes":
        parser.error("--step-trace needs --deployment processes (the trace is read from the device "
                     "host's files)")
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
