"""Collects a ``benchmarks/gpu.sh`` output folder into ``results.json`` and ``results.md``.

    python benchmarks/gpu_summary.py OUT_DIR

Reads what the steps wrote (``environment.json``, ``steps.jsonl``,
``group_batching_<preset>.json``, ``tenant_memory.json``, ``multi_tenant.json``;
each optional: a failed or skipped step leaves its section saying so) and puts
each measured figure beside the paper's and the project's target. Nothing here
measures anything: every number comes from a file a benchmark wrote.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
PAPER = {
    "group_batching_8_tenants": "2.21x-3.24x",
    "device_time_saving": "28.3% (target >= 40%)",
    "busy_fraction_training_service": "20.8% -> 41.3%, 1.99x (target >= 2.5x)",
    "busy_fraction_train": "- (part of the training service)",
    "busy_fraction_inference": "28.1% -> 37.5%, 1.33x",
}


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text()) if path.exists() else None
    except json.JSONDecodeError:
        return None


def collect(out: Path) -> dict[str, Any]:
    lines = (out / "steps.jsonl").read_text().splitlines() if (out / "steps.jsonl").exists() else []
    steps = [json.loads(line) for line in lines if line.strip()]
    group = {p.stem.removeprefix("group_batching_"): _load(p)
             for p in sorted(out.glob("group_batching_*.json"))}
    return {"environment": _load(out / "environment.json"), "steps": steps,
            "group_batching": {k: v for k, v in group.items() if v},
            "tenant_memory": _load(out / "tenant_memory.json"),
            "multi_tenant": _load(out / "multi_tenant.json"), "projection": _load(out / "projection.json")}


def _header_md(env: dict[str, Any] | None, steps: list[dict[str, Any]]) -> list[str]:
    env = env or {}
    dry = " (DRY RUN: CPU, tiny preset)" if env.get("dry_run") else ""
    lines = [f"# benchmarks/gpu.sh results{dry}", "",
             f"Machine: {env.get('device', '?')}, {env.get('cpus', '?')} CPUs; "
             f"torch {env.get('torch', '?')}, "
             f"transformers {env.get('transformers', '?')}.", "",
             "| step | status | seconds |", "|---|---|---:|"]
    return lines + [f"| {s['name']} | {s['status']}{' (' + s['reason'] + ')' if s.get('reason') else ''} "
                    f"| {s.get('seconds', '-')} |" for s in steps]


def _group_batching_md(group: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = ["", "## Group batching (one grouped forward vs one forward per tenant)", ""]
    if not group:
        lines.append("not measured (step failed or skipped)")
    for preset, rows in group.items():
        batches = sorted({r["local_batch"] for r in rows})
        lines += [f"{preset} on {rows[0]['device']}: speedup by tenants (rows) x local batch (columns); "
                  f"paper at 8 tenants: {PAPER['group_batching_8_tenants']}", "",
                  "| tenants | " + " | ".join(f"b={b}" for b in batches) + " |",
                  "|---|" + "---:|" * len(batches)]
        for tenants in sorted({r["tenants"] for r in rows}):
            cells = [f"{r['speedup']:.2f}x ({r['grouped_s'] * 1e3:.1f} ms)"
                     for r in sorted(rows, key=lambda r: r["local_batch"]) if r["tenants"] == tenants]
            lines.append(f"| {tenants} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _tenant_memory_md(memory: list[dict[str, Any]] | None) -> list[str]:
    # no blank line before the heading: each batching table already ends with one
    lines = ["## Tenant-slot memory", ""]
    if not memory:
        return lines + ["not measured (step failed or skipped)"]
    lines += ["| backbone | slot | slot MiB (counted) | shared base MiB | extra tenant MiB (counted) "
              "| extra tenant on device: resident / peak MiB (allocator) |",
              "|---|---|---:|---:|---:|---:|"]
    for r in memory:
        device = ("-" if r.get("device_resident_bytes") is None else
                  f"{r['device_resident_bytes'] / MiB:.2f} / {r['device_peak_bytes'] / MiB:.2f}")
        lines.append(f"| {r['preset']} | {r['slot']} | {r['slot_bytes'] / MiB:.2f} "
                     f"| {r['shared_base_bytes'] / MiB:.2f} | {r['extra_tenant_bytes'] / MiB:.2f} "
                     f"| {device} |")
    return lines


def _shared_vs_isolated_md(mt: dict[str, Any] | None) -> list[str]:
    lines = ["", "## Shared vs isolated (the demo scenario)", ""]
    if not mt:
        return lines + ["not measured (step failed or skipped)"]
    iso, sha = mt["medians"]["isolated"], mt["medians"]["shared"]
    roles = ("roles as OS processes, CPU affinity " + json.dumps(mt.get("cpu_affinity"))
             if mt.get("deployment") == "processes" else "roles in one process")
    lines += [f"backbone {mt['backbone']}, scenario {mt['scenario']}, {mt['tenants']} tenants, "
              f"{mt['repeats']} repeat(s) after a {mt.get('warm_up', 'scenario')} warm-up, {roles}", "",
              "| figure | isolated | shared | ratio | paper |", "|---|---:|---:|---:|---|",
              f"| device time (s) | {iso['device_time_s']:.1f} | {sha['device_time_s']:.1f} "
              f"| {sha['device_time_s'] / iso['device_time_s']:.3f} "
              f"(saving {mt['device_time_saving']:.1%}) "
              f"| {PAPER['device_time_saving']} |"]
    for q in ("training_service", "train", "inference"):
        i, s = iso[f"busy_fraction_{q}"], sha[f"busy_fraction_{q}"]
        lines.append(f"| busy fraction {q} | {i:.1%} | {s:.1%} | {s / i if i else float('nan'):.2f}x "
                     f"| {PAPER[f'busy_fraction_{q}']} |")
    lines.append(f"\nfinal parameters bit-identical across runs: {sum(mt['bit_identical'])}/"
                 f"{len(mt['bit_identical'])} tenants")
    return lines


def _projection_md(proj: dict[str, Any] | None) -> list[str]:
    lines = ["", "## PROJECTION (a model, not a measurement)", ""]
    if not proj:
        return lines + ["not run (step failed or skipped)"]
    gpu, miss = proj["projection_gpu"], proj["model_cpu_miss"]
    lines += [f"benchmarks/projection.py on the traces above; {proj['gpu_source']}. "
              f"The model reproduces this run's shared makespan within {miss['shared']:+.1%}.", "",
              "| figure | isolated | shared | ratio |", "|---|---:|---:|---:|",
              f"| device time (s) | {gpu['isolated']['device_time_s']:.1f} "
              f"| {gpu['shared']['device_time_s']:.1f} | saving {gpu['device_time_saving']:.1%} |"]
    for q in ("train", "inference"):
        i, s = gpu["isolated"][f"busy_fraction_{q}"], gpu["shared"][f"busy_fraction_{q}"]
        lines.append(f"| busy fraction {q} | {i:.1%} | {s:.1%} | {s / i if i else float('nan'):.2f}x |")
    if "projection_gpu_cores" in proj:
        cores, off = proj["projection_gpu_cores"], proj["model_cpu_cores_miss"]
        iso, sha = cores["isolated"]["device_time_s"], cores["shared"]["device_time_s"]
        lines += ["", f"Cores model (host work as CPU on the plan's cores, {cores['cores']}; a forward "
                  f"keeps {proj['gpu_forward_share']:.2f} of its host core busy, "
                  f"{proj['gpu_forward_share_source']}): saving **{cores['device_time_saving']:.1%}** "
                  f"({iso:.1f} -> {sha:.1f} s). With this run's own forward times it reproduces the shared "
                  f"makespan within {off['shared']:+.1%}, the isolated within {off['isolated']:+.1%}."]
    return lines


def markdown(results: dict[str, Any]) -> str:
    lines = (_header_md(results["environment"], results["steps"])
             + _group_batching_md(results["group_batching"])
             + _tenant_memory_md(results["tenant_memory"])
             + _shared_vs_isolated_md(results["multi_tenant"])
             + _projection_md(results.get("projection")))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    out = Path((argv or sys.argv[1:])[0])
    results = collect(out)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(markdown(results))
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
