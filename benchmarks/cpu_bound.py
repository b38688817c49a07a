"""How much of a pass the CPU sets: makespan against the service's CPU seconds, per mode, over
many ``benchmarks/multi_tenant.py --deployment processes`` runs.

    python -m benchmarks.cpu_bound RUN.json [RUN.json ...] [--target 0.40] [--json PATH]

Input: the benchmark's ``--json`` files (or ``RUN_DIR/multi_tenant.json``). Every pass of the
processes deployment carries the CPU seconds of each process kind (``cpu_<kind>_s``, from
``/proc``) and its makespan. Per mode, over every pass of every file, a least-squares line

    makespan = slope * CPU + intercept

The slope is the wall seconds a CPU second of the service's work costs; the intercept, the
seconds of a pass that no CPU work explains (waits: timers, round trips with idle cores, one
tenant's latency at a time). A pass that keeps the machine's cores busy has an intercept near 0
and a slope near 1 / (cores busy on average).

From the two lines and the median ratio r of a run's shared to isolated CPU (the same work costs
less CPU shared: fuller batches, fewer idle polls), the saving as a function of an isolated
pass's CPU C:

    saving(C) = 1 - (slope_s * r * C + intercept_s) / (slope_i * C + intercept_i)

and the C at which it reaches ``--target``: the CPU a pass would have to come down to, on any
VM speed, for the target to hold on this machine. Each file's own saving is printed beside the
lines' saving for its median CPU in each mode, so a reader sees how well the lines describe the
runs.

This is a description of measured runs (a fit), not a model of the service and not a
projection to other hardware: ``benchmarks/projection.py`` is the projection.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.multi_tenant import MODES, pass_cpu

__all__ = ["Line", "fit", "saving", "cpu_for", "main"]


@dataclass(frozen=True)
class Line:
    """makespan = slope * cpu + intercept over ``passes`` passes of one mode."""

    slope: float
    intercept: float
    residual_sd: float
    passes: int

    def at(self, cpu: float) -> float:
        return self.slope * cpu + self.intercept


def passes_of(doc: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(mode, CPU seconds, makespan) of every pass that recorded its processes' CPU."""
    return [(r["mode"], pass_cpu(r), r["makespan_s"]) for r in doc.get("runs", []) if pass_cpu(r) > 0]


def fit(points: list[tuple[float, float]]) -> Line:
    """Least squares through (CPU, makespan) points; at least two distinct CPU figures."""
    if len({round(c, 6) for c, _ in points}) < 2:
        raise ValueError("a line needs passes with at least two different CPU totals")
    cpu, makespan = np.array(points, dtype=float).T
    (slope, intercept), *_ = np.linalg.lstsq(np.stack([cpu, np.ones_like(cpu)], axis=1), makespan, rcond=None)
    residuals = makespan - (slope * cpu + intercept)
    return Line(float(slope), float(intercept), float(residuals.std()), len(points))


def saving(isolated: Line, shared: Line, ratio: float, cpu: float) -> float:
    """The lines' saving for an isolated pass of ``cpu`` CPU seconds (shared: ``ratio`` x that)."""
    return 1 - shared.at(ratio * cpu) / isolated.at(cpu)


def cpu_for(isolated: Line, shared: Line, ratio: float, target: float) -> float | None:
    """The isolated pass's CPU at which ``saving`` equals ``target``; None when the lines never
    get there (the saving falls, or stays under the target, as CPU falls)."""
    keep = 1 - target
    denominator = keep * isolated.slope - shared.slope * ratio
    if denominator >= 0:  # shared grows as fast as (1 - target) x isolated: no crossing below
        return None
    cpu = (keep * isolated.intercept - shared.intercept) / -denominator
    return cpu if cpu > 0 else None


def summarize(docs: dict[str, dict[str, Any]], target: float) -> dict[str, Any]:
    points = {mode: [] for mode in MODES}
    per_file = {}
    for name, doc in docs.items():
        passes = passes_of(doc)
        for mode, cpu, makespan in passes:
            points[mode].append((cpu, makespan))
        cpu = {m: [c for mm, c, _ in passes if mm == m] for m in MODES}
        if all(cpu.values()):
            per_file[name] = {"cpu": {m: statistics.median(cs) for m, cs in cpu.items()},
                              "measured_saving": doc.get("device_time_saving")}
    lines = {mode: fit(points[mode]) for mode in MODES}
    ratio = statistics.median(f["cpu"]["shared"] / f["cpu"]["isolated"] for f in per_file.values())
    for f in per_file.values():  # the file's own CPU in both modes: how well the lines describe it
        shared, isolated = lines["shared"].at(f["cpu"]["shared"]), lines["isolated"].at(f["cpu"]["isolated"])
        f["fitted_saving"] = 1 - shared / isolated
    least = min(c for c, _ in points["isolated"])
    return {
        "lines": {mode: asdict(line) for mode, line in lines.items()},
        "cpu_ratio_shared_to_isolated": ratio,
        "files": per_file,
        "target": target,
        "isolated_cpu_for_target": cpu_for(lines["isolated"], lines["shared"], ratio, target),
        "least_isolated_cpu": least,
        "saving_at_least_cpu": saving(lines["isolated"], lines["shared"], ratio, least),
    }


def show(console: Console, result: dict[str, Any]) -> None:
    table = Table(title="makespan = slope x CPU + intercept, per mode (a fit of measured passes)")
    for col in ("mode", "passes", "slope", "intercept (s)", "residual sd (s)"):
        table.add_column(col)
    for mode, line in result["lines"].items():
        table.add_row(mode, str(line["passes"]), f"{line['slope']:.3f}", f"{line['intercept']:.1f}",
                      f"{line['residual_sd']:.2f}")
    console.print(table)
    files = Table(title="per file: median CPU of a pass, saving measured and from the lines")
    for col in ("file", "isolated CPU s", "shared CPU s", "measured", "fitted"):
        files.add_column(col)
    for name, f in result["files"].items():
        measured = f["measured_saving"]
        files.add_row(name, f"{f['cpu']['isolated']:.1f}", f"{f['cpu']['shared']:.1f}",
                      "-" if measured is None else f"{measured:.1%}", f"{f['fitted_saving']:.1%}")
    console.print(files)
    target, cpu = result["target"], result["isolated_cpu_for_target"]
    ratio = result["cpu_ratio_shared_to_isolated"]
    console.print(f"shared CPU / isolated CPU (median over files): {ratio:.3f}")
    console.print(f"least isolated pass measured: {result['least_isolated_cpu']:.1f} CPU s, "
                  f"where the lines give {result['saving_at_least_cpu']:.1%}")
    if cpu is None:
        console.print(f"the lines never reach a {target:.0%} saving")
    else:
        console.print(f"a {target:.0%} saving by the lines: an isolated pass of at most {cpu:.1f} CPU s "
                      f"({1 - cpu / result['least_isolated_cpu']:.0%} less than the least measured)")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="multi_tenant.py --json files")
    parser.add_argument("--target", type=float, default=0.40, help="the saving to solve for")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    docs = {str(path): json.loads(path.read_text()) for path in args.runs}
    result = summarize(docs, args.target)
    show(Console(), result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
