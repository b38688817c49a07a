"""How much of a pass the CPU sets: makespan against the service's CPU seconds, per mode, over
many ``benchmarks/multi_tenant.py --deployment processes`` runs.

    python -m benchmarks.cpu_bound RUN.json [RUN.json ...] [--target 0.40] [--json PATH]

Input: the benchmark's ``--json`` files (or ``RUN_DIR/multi_tenant.json``). Every pass of the
processes deployment carries the CPU seconds of each process kind (``cpu_<kind>_s``, from
``/proc``) and its makespan. Per mode, over every pass of every file, a least-squares line

    makespan = slope * CPU + intercept

CPU is every process kind's, the broker's and the benchmark client's (``pass_cpu``). The slope is
the wall seconds a CPU second of the service's work costs; the intercept, the seconds of a pass
that no CPU work explains (waits: timers, round trips with idle cores, one tenant's latency at a
time). A pass bound by the CPU has an intercept near 0 and a slope near 1 / (cores busy on
average).

From the two lines and the median ratio r of a run's shared to isolated CPU (the same work costs
less CPU shared: fuller batches, fewer idle polls), the saving as a function of an isolated
pass's CPU C:

    saving(C) = 1 - (slope_s * r * C + intercept_s) / (slope_i * C + intercept_i)

and where it reaches ``--target`` (at most, or at least, some C; or always, or never): with the
day's lines, the CPU a pass would have to come down to, on any VM speed, for the target to hold
on this machine. Each file's own saving is printed beside the lines' saving for its median CPU in
each mode, so a reader sees how well the lines describe the runs. Files holding the same passes
(one run under its two paths) count once.

This is a description of measured runs (a fit), not a model of the service and not a
projection to other hardware: ``benchmarks/projection.py`` is the projection.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.multi_tenant import MODES, median_cpu, pass_cpu

__all__ = ["Line", "Reach", "cpu_for", "fit", "main", "saving"]


@dataclass(frozen=True)
class Line:
    """makespan = slope * cpu + intercept over ``passes`` passes of one mode."""

    slope: float
    intercept: float
    residual_sd: float  # with n - 2 degrees of freedom: two parameters were fitted
    passes: int

    def at(self, cpu: float) -> float:
        return self.slope * cpu + self.intercept


@dataclass(frozen=True)
class Reach:
    """Where the lines' saving is at least the target, as an isolated pass's CPU: ``at most`` or
    ``at least`` ``cpu`` CPU seconds, ``always`` or ``never`` (``cpu`` None)."""

    where: Literal["at most", "at least", "always", "never"]
    cpu: float | None = None


def passes_of(doc: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(mode, CPU seconds, makespan) of every pass that recorded its processes' CPU."""
    return [(r["mode"], pass_cpu(r), r["makespan_s"]) for r in doc.get("runs", []) if pass_cpu(r) > 0]


def fit(points: list[tuple[float, float]]) -> Line:
    """Least squares through (CPU, makespan) points; at least three, with two distinct CPU figures."""
    if len(points) < 3 or len({round(c, 6) for c, _ in points}) < 2:
        raise ValueError("a line needs at least three passes with two different CPU totals")
    cpu, makespan = np.array(points, dtype=float).T
    (slope, intercept), *_ = np.linalg.lstsq(np.stack([cpu, np.ones_like(cpu)], axis=1), makespan, rcond=None)
    residuals = makespan - (slope * cpu + intercept)
    return Line(float(slope), float(intercept), float(residuals.std(ddof=2)), len(points))


def saving(isolated: Line, shared: Line, ratio: float, cpu: float) -> float:
    """The lines' saving for an isolated pass of ``cpu`` CPU seconds (shared: ``ratio`` x that)."""
    return 1 - shared.at(ratio * cpu) / isolated.at(cpu)


def cpu_for(isolated: Line, shared: Line, ratio: float, target: float) -> Reach:
    """Where ``saving`` >= ``target``, for isolated passes whose makespan is positive:
    (1 - target) (a_i C + b_i) >= a_s r C + b_s, i.e. k C >= m with the k and m below."""
    keep = 1 - target
    k = keep * isolated.slope - shared.slope * ratio
    m = shared.intercept - keep * isolated.intercept
    if k == 0:
        return Reach("always" if m <= 0 else "never")
    crossing = m / k
    if k < 0:  # the saving grows as CPU falls: met up to the crossing
        return Reach("at most", crossing) if crossing > 0 else Reach("never")
    return Reach("at least", crossing) if crossing > 0 else Reach("always")


def summarize(docs: dict[str, dict[str, Any]], target: float) -> dict[str, Any]:
    """Raises ValueError when the files hold too few passes with CPU for the lines."""
    points: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    per_file, seen = {}, set()
    for name, doc in docs.items():
        passes = passes_of(doc)
        if tuple(passes) in seen:  # one run under two paths (RUN_DIR and --json) counts once
            continue
        seen.add(tuple(passes))
        for mode, cpu, makespan in passes:
            points[mode].append((cpu, makespan))
        medians = median_cpu(doc.get("runs", []))
        if all(v is not None for v in medians.values()):
            per_file[name] = {"cpu": medians, "measured_saving": doc.get("device_time_saving")}
    if not per_file:
        raise ValueError("no file holds passes of both modes with their processes' CPU "
                         "(multi_tenant.py --deployment processes writes them)")
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
        "reach": asdict(cpu_for(lines["isolated"], lines["shared"], ratio, target)),
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
    ratio, least = result["cpu_ratio_shared_to_isolated"], result["least_isolated_cpu"]
    console.print(f"shared CPU / isolated CPU (median over files): {ratio:.3f}")
    console.print(f"least isolated pass measured: {least:.1f} CPU s, "
                  f"where the lines give {result['saving_at_least_cpu']:.1%}")
    console.print(f"a {result['target']:.0%} saving by the lines: {reach_words(result['reach'], least)}")


def reach_words(reach: dict[str, Any], least: float) -> str:
    where, cpu = reach["where"], reach["cpu"]
    if where == "always":
        return "at any CPU"
    if where == "never":
        return "at no CPU"
    if where == "at least":
        return f"an isolated pass of at least {cpu:.1f} CPU s (the lines' saving grows with CPU)"
    if cpu >= least:
        return f"an isolated pass of at most {cpu:.1f} CPU s: already met at the least measured"
    return f"an isolated pass of at most {cpu:.1f} CPU s ({1 - cpu / least:.0%} less than the least measured)"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="multi_tenant.py --json files")
    parser.add_argument("--target", type=float, default=0.40, help="the saving to solve for")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    docs = {str(path): json.loads(path.read_text()) for path in args.runs}
    try:
        result = summarize(docs, args.target)
    except ValueError as exc:
        parser.error(str(exc))
    show(Console(), result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
