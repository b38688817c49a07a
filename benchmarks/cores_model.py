"""The shared replay of ``benchmarks/projection.py`` with host work as CPU on cores (a fluid model).

``projection.py`` plays a host gap as a block of time that runs or waits for a host slot, and neither
one slot nor unlimited slots reproduces a measured shared pass. Here a gap is CPU work on the cores of
the run's CPU plan (``multi_tenant.json``'s ``cpu_affinity``), measured per tenant from its ISOLATED
turn: ``turn_cpu``, each process kind's CPU seconds in that turn, summed per core group:

* the device host's group (e.g. the device host and the optimizer on core 0): its CPU outside the
  tenant's forwards, spread over the tenant's gaps; a running forward takes ``forward_share`` of it
  (1 on a CPU: the forward is CPU; on a GPU, the share of a forward its host thread is busy);
* every other group (the simulators, the broker, the other roles): its CPU spread over the whole
  turn, gaps and forwards (a tenant's simulators step while its forward runs).

When tenants run at once, each core group is shared fairly among what asks for it (processor
sharing: a group asked for 1.5x its cores runs everything on it at 1/1.5 of the pace): a gap advances
at the pace of the most overloaded group it uses, a forward at the pace of its core; a tenant waiting
for the device asks for nothing. Rates change only at events (a gap, a forward or a batcher deadline
ending), so the replay steps from event to event exactly. The device rules are ``projection.shared``'s.

Alone, a tenant asks no group for more than its cores (its own turn's CPU could not exceed them),
so the isolated replay is the measured chain; what the model adds is how the tenants' host work
contends when shared. It leaves out the processes' idle CPU (counted once per tenant here, paid
once per second when shared), the CPU a shared pass saves per step (fewer, fuller forwards,
fetches and produce requests), and GIL and scheduler effects inside one process. A model, not a
measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from benchmarks.projection import Chain, Duration, Policy, _figures, _train_chunk_rows, chains_of, medians
from infra.runtime.affinity import REST, cpus_for

__all__ = ["Cores", "Load", "groups_of", "loads_of", "project_cores", "replay", "replay_isolated"]

EPS = 1e-12


@dataclass(frozen=True)
class Cores:
    """The cores each group of processes may use, and which group runs the device's forwards."""

    capacity: dict[str, float]  # group -> cores
    device: str
    forward_share: float = 1.0  # of the device group a running forward occupies


@dataclass(frozen=True)
class Load:
    """One tenant's host CPU per second, per core group: in its gaps, and beside its forwards."""

    gap: dict[str, float]
    forward: dict[str, float]


def groups_of(plan: dict[str, list[int]]) -> tuple[dict[str, str], Cores]:
    """(process kind -> group name, the groups' cores) of a CPU plan like ``{"device": [0],
    "optimizer": [0], "rest": [1]}``: kinds on the same CPUs form one group; a kind the plan does
    not name (the broker, the benchmark's client) is in ``rest``'s group."""
    by_cpus: dict[tuple[int, ...], str] = {}
    kind_group: dict[str, str] = {}
    for kind in plan:
        key = tuple(cpus_for(plan, kind) or ())
        by_cpus.setdefault(key, "cpus " + ",".join(map(str, key)))
        kind_group[kind] = by_cpus[key]
    overlapping = [(a, b) for a in by_cpus for b in by_cpus if a < b and set(a) & set(b)]
    if overlapping:
        raise ValueError(f"the cores model needs disjoint CPU sets per group; {overlapping} overlap")
    if "device" not in kind_group or REST not in kind_group:
        raise ValueError(f"a CPU plan with 'device' and 'rest' is needed, got {sorted(plan)}")
    capacity = {name: float(len(cpus)) for cpus, name in by_cpus.items()}
    return kind_group, Cores(capacity, kind_group["device"])


def loads_of(trace: dict[str, Any], turn_cpu: list[dict[str, float]], kind_group: dict[str, str],
             cores: Cores) -> list[Load]:
    """Each tenant's ``Load`` from one isolated pass: its trace (chains) and its turns' CPU."""
    if len(turn_cpu) != len(trace["tenants"]):
        raise ValueError(f"{len(turn_cpu)} turns' CPU for {len(trace['tenants'])} tenants: not an "
                         "isolated pass recorded with turn_cpu")
    loads = []
    for chain, cpu, (submitted, completed) in zip(chains_of(trace), turn_cpu, trace["spans"], strict=True):
        length = completed - submitted
        forward_s = sum(e - s for q, s, e, t in trace["forwards"]["forwards"] if chain.tenant in t)
        gap_s = max(length - forward_s, EPS)
        per_group: dict[str, float] = {}
        for key, seconds in cpu.items():
            kind = key.removeprefix("cpu_").removesuffix("_s")
            group = kind_group.get(kind, kind_group[REST])
            per_group[group] = per_group.get(group, 0.0) + seconds
        gap, forward = {}, {}
        for group, seconds in per_group.items():
            if group == cores.device:
                gap[group] = max(seconds - forward_s, 0.0) / gap_s
            else:
                gap[group] = forward[group] = seconds / max(length, EPS)
        loads.append(Load(gap, forward))
    return loads


def project_cores(traces: list[dict[str, Any]], passes: list[dict[str, Any]], duration: Duration,
                  policy: Policy, plan: dict[str, list[int]], forward_share: float = 1.0) -> dict[str, Any]:
    """Median over the isolated passes of the model's isolated and shared figures, and the ratios
    (``projection.project``'s shape). ``passes``: ``multi_tenant.json``'s ``runs`` (their
    ``turn_cpu``); ``plan``: the CPU plan replayed on (the run's own, or a GPU machine's)."""
    kind_group, cores = groups_of(plan)
    cores = replace(cores, forward_share=forward_share)
    turn_cpu = {r["repeat"]: r.get("turn_cpu") for r in passes if r["mode"] == "isolated"}
    results = []
    for trace in (t for t in traces if t["mode"] == "isolated"):
        if not turn_cpu.get(trace["repeat"]):
            raise ValueError(f"isolated pass {trace['repeat']} has no turn_cpu: run multi_tenant.py "
                             "--deployment processes again (it records each turn's CPU since 2026-12-07)")
        chains = chains_of(trace)
        loads = loads_of(trace, turn_cpu[trace["repeat"]], kind_group, cores)
        results.append((replay_isolated(chains, loads, duration, policy, cores),
                        replay(chains, loads, duration, policy, cores)))
    return medians(results) | {"cores": cores.capacity, "forward_share": forward_share}


def replay_isolated(chains: list[Chain], loads: list[Load], duration: Duration, policy: Policy,
                    cores: Cores) -> dict[str, float]:
    """One tenant after another, each replayed alone: device time is the sum."""
    alone = [replay([c], [ld], duration, policy, cores) for c, ld in zip(chains, loads, strict=True)]
    busy = {q: sum(a[f"busy_{q}_s"] for a in alone) for q in ("train", "inference")}
    return _figures(sum(a["device_time_s"] for a in alone), busy) | {
        "forwards": float(sum(a["forwards"] for a in alone))}


@dataclass(eq=False)  # `in` and `is` by identity: two tenants may hold equal fields
class _Tenant:
    chain: Chain
    load: Load
    nxt: int = 0
    state: str = "gap"  # gap (host work), ready (asking), grouped (in a formed group), forward, done
    left_s: float = 0.0  # isolated seconds of the current gap still to run
    ready_at: float = 0.0
    answered: float | None = None

    @property
    def queue(self) -> str:
        return self.chain.items[self.nxt].queue

    @property
    def rows(self) -> int:
        return self.chain.items[self.nxt].rows

    def next_gap(self) -> None:
        """Into the gap before the next item, or into the tail after the last one."""
        self.state = "gap"
        items = self.chain.items
        self.left_s = items[self.nxt].gap_before_s if self.nxt < len(items) else self.chain.tail_s


def replay(chains: list[Chain], loads: list[Load], duration: Duration, policy: Policy,
           cores: Cores) -> dict[str, float]:
    """All chains at once on one device, their host work sharing the cores (see the module doc)."""
    return _Replay(chains, loads, duration, policy, cores).run()


@dataclass
class _Forward:
    queue: str
    members: list[_Tenant]
    left_s: float  # of its duration alone
    began: float


class _Replay:
    """From event to event: gaps ending, the batcher forming a group, the device starting and ending
    forwards. ``projection.shared``'s device rules: the batcher forms one inference group at a time
    (at B rows, T, or completeness) and not while its last group is on the device; the free device
    runs a formed group before training unless a training item waited ``train_max_wait_s``."""

    def __init__(self, chains: list[Chain], loads: list[Load], duration: Duration, policy: Policy,
                 cores: Cores) -> None:
        self.tenants = [_Tenant(c, ld) for c, ld in zip(chains, loads, strict=True)]
        for tenant in self.tenants:
            tenant.next_gap()
        self.duration, self.policy, self.cores = duration, policy, cores
        self.train_rows = _train_chunk_rows(chains, duration, policy)
        self.busy = {"inference": 0.0, "train": 0.0}
        self.device: _Forward | None = None
        self.group: list[_Tenant] | None = None  # formed by the batcher, waiting for the device
        self.t = self.end = 0.0
        self.forwards = 0

    def run(self) -> dict[str, float]:
        while True:
            self._end_gaps()
            if self._batcher_free() and self._flush_at() <= self.t + EPS:
                self.group = self._take(self._asking(), self.policy.max_rows)
                for tenant in self.group:
                    tenant.state = "grouped"
            if self.device is None:
                self._start()
            if self.device is None and all(tn.state == "done" for tn in self.tenants):
                return _figures(self.end, self.busy) | {"forwards": float(self.forwards)}
            self._advance()

    def _asking(self) -> list[_Tenant]:
        return sorted((tn for tn in self.tenants if tn.state == "ready" and tn.queue == "inference"),
                      key=lambda tn: tn.ready_at)

    def _flush_at(self) -> float:
        """When the batcher flushes what is asking now: at B rows, when the oldest waited T, or when
        every tenant answered in the last ``active_window_s`` has asked again (inf: nothing asks)."""
        asking = self._asking()
        if not asking:
            return math.inf
        if sum(tn.rows for tn in asking) >= self.policy.target_rows:
            return self.t
        complete = self.t
        for tenant in self.tenants:
            if tenant.answered is not None and tenant not in asking:
                complete = max(complete, tenant.answered + self.policy.active_window_s)
        return min(asking[0].ready_at + self.policy.max_wait_s, complete)

    def _batcher_free(self) -> bool:
        return self.group is None and (self.device is None or self.device.queue != "inference")

    def _end_gaps(self) -> None:
        for tenant in self.tenants:
            if tenant.state == "gap" and tenant.left_s <= EPS:
                if tenant.nxt < len(tenant.chain.items):
                    tenant.state, tenant.ready_at = "ready", self.t
                else:
                    tenant.state, self.end = "done", max(self.end, self.t)

    def _start(self) -> None:
        training = sorted((tn for tn in self.tenants if tn.state == "ready" and tn.queue == "train"),
                          key=lambda tn: tn.ready_at)
        bound = self.policy.train_max_wait_s
        starved = bool(training) and bound is not None and self.t - training[0].ready_at >= bound
        if self.group is not None and not starved:
            queue, members, self.group = "inference", self.group, None
        elif training:
            queue, members = "train", self._take(training, self.train_rows)
        else:
            return
        self.forwards += 1
        self.device = _Forward(queue, members, self.duration(queue, sum(tn.rows for tn in members)), self.t)
        for tenant in members:
            tenant.state = "forward"

    @staticmethod
    def _take(waiting: list[_Tenant], cap: int) -> list[_Tenant]:
        rows, taken = 0, []
        for tenant in waiting:
            if taken and rows + tenant.rows > cap:
                break
            rows += tenant.rows
            taken.append(tenant)
        return taken

    def _advance(self) -> None:
        """To the next event, every gap and the forward at its pace meanwhile."""
        gap_pace, forward_pace = _paces(self.tenants, self.device is not None, self.cores)
        gaps = [tn for tn in self.tenants if tn.state == "gap"]
        step = min((tn.left_s / gap_pace[id(tn)] for tn in gaps), default=math.inf)
        if self.device is not None:
            step = min(step, self.device.left_s / forward_pace)
        if self._batcher_free():
            step = min(step, self._flush_at() - self.t)
        if not math.isfinite(step):
            raise RuntimeError("the replay is stuck: no gap, forward or batcher deadline ahead")
        step = max(step, 0.0)
        self.t += step
        for tenant in gaps:
            tenant.left_s -= step * gap_pace[id(tenant)]
        if self.device is not None:
            self.device.left_s -= step * forward_pace
            if self.device.left_s <= EPS:
                self._finish(self.device)
                self.device = None

    def _finish(self, forward: _Forward) -> None:
        self.busy[forward.queue] += self.t - forward.began  # wall seconds: stretched on a shared core
        for tenant in forward.members:
            if forward.queue == "inference":
                tenant.answered = self.t
            tenant.nxt += 1
            tenant.next_gap()


def _paces(tenants: list[_Tenant], forwarding: bool, cores: Cores) -> tuple[dict[int, float], float]:
    """Each gap's pace and the forward's (1: as fast as alone) under processor sharing per group."""
    asked = {group: 0.0 for group in cores.capacity}
    if forwarding:
        asked[cores.device] += cores.forward_share
    for tenant in tenants:
        demand = tenant.load.gap if tenant.state == "gap" else (
            tenant.load.forward if tenant.state == "forward" else {})
        for group, rate in demand.items():
            asked[group] += rate
    pace = {g: min(1.0, cores.capacity[g] / a) if a > EPS else 1.0 for g, a in asked.items()}
    gaps = {id(tn): min((pace[g] for g, r in tn.load.gap.items() if r > EPS), default=1.0)
            for tn in tenants if tn.state == "gap"}
    return gaps, pace[cores.device] if cores.forward_share > 0 else 1.0
