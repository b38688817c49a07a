"""``joynexus report RUN_DIR``: one self-contained HTML page of a run (demo or benchmark).

Reads what the run directory holds, all optional:

* ``jobs.json``   every job's progress history (demo, benchmarks): return, success and loss curves;
* ``summary.json`` the demo's per-tenant table and service numbers (evaluations, busy fractions);
* ``forwards.json`` the device timeline (``backbone/timeline.py``): the busy-time picture coloured
  by tenant, a zoom on its busiest stretch, and the group-size histograms;
* ``comparison.json`` (``joynexus.comparison.v1``, written by ``benchmarks/multi_tenant.py``):
  isolated vs shared device time and busy fractions; without it the bars show this run alone.

The page has no external reference (no script, style, font or image from anywhere): figures are
inline SVG, and a few lines of inline script record, once the page has laid out, each figure's
box in ``#render-check`` (JSON), which is how the headless-browser test knows every plot is there.
Every figure is always present; one without data says why inside it.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from backbone.timeline import ForwardLog, ForwardRecord, load_forwards, read_window
from infra.logging import get_logger
from infra.runtime import report_plots as plots

__all__ = ["PLOTS", "COMPARISON_FORMAT", "build_report", "write_report", "write_run_report"]

log = get_logger("infra.runtime.report")

COMPARISON_FORMAT = "joynexus.comparison.v1"
# The figures of every report, in page order: (id, heading).
PLOTS = (
    ("return", "Per-tenant return (RL, mean episode return per iteration)"),
    ("success", "Per-tenant success rate (RL rollouts per iteration)"),
    ("loss", "Per-tenant training loss (at each published policy version)"),
    ("timeline", "Device timeline: busy time coloured by tenant"),
    ("timeline-zoom", "Device timeline, zoom on the busiest stretch"),
    ("groups", "Group-size histogram"),
    ("busy", "Busy fraction and device time: shared vs isolated"),
)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text()) if path.exists() else None
    except (OSError, json.JSONDecodeError) as exc:  # a broken file costs its figures, not the page
        log.warning("report_input_unreadable", path=str(path), error=str(exc)[:200])
        return None


def _series(jobs: dict[str, Any], y: str, x: str, rl_only: bool) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    for tenant, job in jobs.items():
        points = []
        for i, h in enumerate(job.get("history", [])):
            if y not in h or (rl_only and "train_loss" in h):
                continue
            xv = h.get(x, i) if x != "iteration" else h.get("iteration", i) + 1
            points.append((float(xv), float(h[y])))
        out[tenant] = points
    return out


def _busiest_window(forwards: list[ForwardRecord]) -> tuple[float, float] | None:
    """A window of about 1/20 of the run (0.5-5 s) where the device was busiest with the most tenants."""
    if not forwards:
        return None
    start, end = min(f.start_s for f in forwards), max(f.end_s for f in forwards)
    width = min(5.0, max(0.5, (end - start) / 20))
    ordered = sorted(forwards, key=lambda f: f.start_s)
    step = max(1, len(ordered) // 200)
    best, best_score = (start, start + width), -1.0
    for candidate in ordered[::step]:
        lo, hi = candidate.start_s, candidate.start_s + width
        inside = [f for f in ordered if lo <= f.start_s < hi]
        score = sum(f.busy_s for f in inside) * len({t for f in inside for t in f.tenants})
        if score > best_score:
            best, best_score = (lo, hi), score
    return best


def _modes(comparison: Any, summary: Any) -> tuple[dict[str, dict[str, float]], str]:
    if isinstance(comparison, dict) and comparison.get("format") == COMPARISON_FORMAT:
        return comparison["modes"], comparison.get("note", "medians over the benchmark's repeats")
    service = (summary or {}).get("service") if isinstance(summary, dict) else None
    if not service:
        return {}, "no device numbers in this run directory"
    wall = float(service.get("wall_s", 0.0))
    inf = float(service.get("backbone_busy_inference", 0.0))
    train = float(service.get("backbone_busy_train", 0.0))
    mode = {"device_time_s": wall, "busy_train_s": train * wall, "busy_inference_s": inf * wall,
            "busy_fraction_train": train, "busy_fraction_inference": inf, "busy_fraction_total": inf + train}
    return {"this run (shared)": mode}, (
        "this run only (all tenants at once, evaluations included); isolated runs come from "
        "benchmarks/multi_tenant.py, which writes comparison.json")


def _tenant_table(summary: Any, jobs: dict[str, Any]) -> str:
    rows = []
    if isinstance(summary, dict) and summary.get("tenants"):
        for t in summary["tenants"]:
            evals = [t["evals"][v] for v in sorted(t.get("evals", {}), key=lambda v: int(v))]
            success = " &rarr; ".join(f"{e.get('success_rate', float('nan')):.2f}" for e in evals) or "-"
            rows.append([t["tenant"], t["kind"], t["task"], t["phase"], t.get("steps"), t.get("final_loss"),
                         t.get("final_return"), success])
    else:
        for tenant, job in jobs.items():
            last = job.get("history", [{}])[-1] if job.get("history") else {}
            rows.append([tenant, "", "", job.get("phase"), last.get("steps"), last.get("train_loss"),
                         last.get("mean_return"), "-"])
    head = ["tenant", "kind", "task", "result", "steps", "final loss", "final return", "eval success"]

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "-" if v is None else (v if isinstance(v, str) and "&rarr;" in v else html.escape(str(v)))

    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{body}</table>"


def build_report(run_dir: Path) -> str:
    """The report page of ``run_dir`` as one HTML string."""
    run_dir = Path(run_dir)
    jobs = _read_json(run_dir / "jobs.json") or {}
    summary = _read_json(run_dir / "summary.json")
    comparison = _read_json(run_dir / "comparison.json")
    forwards: list[ForwardRecord] = []
    if (run_dir / "forwards.json").exists():
        try:
            forwards = load_forwards(run_dir / "forwards.json")
        except (ValueError, KeyError, json.JSONDecodeError) as exc:
            log.warning("report_forwards_unreadable", error=str(exc)[:200])
    tenants = sorted(set(jobs) | {t for f in forwards for t in f.tenants})
    colours = plots.tenant_colours(tenants)
    modes, note = _modes(comparison, summary)
    window = _busiest_window(forwards)
    figures = {
        "return": plots.curve(_series(jobs, "mean_return", "iteration", True), "mean episode return",
                              "iteration", "return", colours, "no RL tenant in this run"),
        "success": plots.curve(_series(jobs, "success_rate", "iteration", True), "success rate",
                               "iteration", "success rate", colours, "no RL tenant in this run"),
        "loss": plots.curve(_series(jobs, "train_loss", "steps", False), "training loss", "optimizer step",
                            "loss", colours, "no training loss reported in this run"),
        "timeline": plots.timeline(forwards, colours, f"every forward ({len(forwards)})"),
        "timeline-zoom": plots.timeline(
            forwards, colours, "zoom" if window is None else f"zoom: {window[0]:.1f}-{window[1]:.1f} s",
            window),
        "groups": plots.group_histogram(forwards),
        "busy": plots.busy_bars(modes, note),
    }
    sections = "\n".join(
        f'<section><h2>{html.escape(title)}</h2><figure class="plot" id="plot-{pid}" data-plot="{pid}">'
        f"{figures[pid]}</figure></section>"
        for pid, title in PLOTS
    )
    service = (summary or {}).get("service", {}) if isinstance(summary, dict) else {}
    service_rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{v:.4g}</td></tr>"
                           for k, v in service.items() if isinstance(v, int | float))
    return _PAGE.format(
        title=html.escape(f"joynexus run {run_dir.name}"),
        tenants=_tenant_table(summary, jobs),
        service=(f"<table><tr><th>service</th><th>value</th></tr>{service_rows}</table>"
                 if service_rows else ""),
        sections=sections,
        expected=json.dumps([pid for pid, _ in PLOTS]),
    )


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Writes ``build_report(run_dir)`` to ``out`` (default ``RUN_DIR/report.html``)."""
    out = Path(out) if out is not None else Path(run_dir) / "report.html"
    out.write_text(build_report(Path(run_dir)))
    return out


def write_run_report(run_dir: Path, timeline_dir: Path, since_unix: float) -> Path | None:
    """For a run whose device host is another process: the forwards it exported to
    ``timeline_dir`` since ``since_unix`` into ``RUN_DIR/forwards.json``, then ``report.html``.
    A failure is logged, never raised: the report is a view of the run, whose numbers are
    already in its JSON files."""
    try:
        forwards = read_window(Path(timeline_dir), since_unix)
        # the records' times are relative to the run's start
        ForwardLog().dump(Path(run_dir) / "forwards.json", forwards, origin_unix=since_unix)
        return write_report(Path(run_dir))
    except Exception as exc:
        log.warning("report_failed", run_dir=str(run_dir), error=f"{type(exc).__name__}: {exc}"[:300])
        return None


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; }}
table {{ border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; }}
figure.plot {{ margin: 0; }} figure.plot svg {{ max-width: 100%; height: auto; }}
h2 {{ font-size: 16px; margin-top: 28px; }}
</style></head>
<body>
<h1>{title}</h1>
{tenants}
{service}
{sections}
<pre id="render-check" hidden></pre>
<script>
window.addEventListener("load", function () {{
  var expected = {expected}, found = {{}};
  document.querySelectorAll("figure.plot").forEach(function (fig) {{
    var svg = fig.querySelector("svg"), box = svg ? svg.getBoundingClientRect() : null;
    found[fig.dataset.plot] = box ? {{x: box.left + window.scrollX, y: box.top + window.scrollY,
      width: box.width, height: box.height,
      shapes: svg.querySelectorAll("path,rect,image,use").length}} : null;
  }});
  document.getElementById("render-check").textContent = JSON.stringify({{expected: expected, found: found}});
}});
</script>
</body></html>
"""
