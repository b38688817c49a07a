"""The run report's figures, each drawn with matplotlib (Agg) and returned as an inline SVG string.

One function per figure; each takes plain data (job histories, forward
records, busy numbers) and never reads files, so ``infra/runtime/report.py``
decides what a run directory holds and this module only draws. A figure with
nothing to show still renders, with a line saying why, so the page's set of
figures is the same for every run. Dense layers (thousands of forward bars)
are rasterised inside the SVG to keep the page small.
"""

from __future__ import annotations

import io
import textwrap
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.patches import Patch  # noqa: E402

from backbone.timeline import ForwardRecord  # noqa: E402

__all__ = ["busy_bars", "curve", "group_histogram", "tenant_colours", "timeline"]

QUEUE_LANES = {"inference": 1.0, "train": 0.0}  # inference drawn above training
RASTERISE_ABOVE = 1500  # forward bars; above this the bar layer is embedded as a bitmap


def tenant_colours(tenants: Sequence[str]) -> dict[str, Any]:
    cmap = plt.get_cmap("tab10" if len(tenants) <= 10 else "tab20")
    return {t: cmap(i % cmap.N) for i, t in enumerate(sorted(tenants))}


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE: the SVG goes inline in HTML


def _empty(ax, why: str) -> None:
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, fontsize=10, color="0.35")


def curve(series: dict[str, list[tuple[float, float]]], title: str, xlabel: str, ylabel: str,
          colours: dict[str, Any], empty: str) -> str:
    """One line per tenant: ``series[tenant] = [(x, y), ...]``."""
    fig, ax = plt.subplots(figsize=(6.2, 3.6))
    drawn = False
    for tenant, points in sorted(series.items()):
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o", markersize=3, label=tenant, color=colours.get(tenant))
            drawn = True
    if drawn:
        ax.legend(fontsize=7)
    else:
        _empty(ax, empty)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    return _svg(fig)


def timeline(forwards: Sequence[ForwardRecord], colours: dict[str, Any], title: str,
             window: tuple[float, float] | None = None) -> str:
    """Device busy time: one lane per queue, one bar per forward, its height split between the
    tenants of its rows (in proportion to their rows), each in that tenant's colour. Idle device
    time is the white between bars. ``window`` limits the x-axis (a zoom)."""
    fig, ax = plt.subplots(figsize=(12.5, 2.8 if window is None else 2.4))
    if window is not None:
        forwards = [f for f in forwards if f.end_s >= window[0] and f.start_s <= window[1]]
    bars: dict[str, list[tuple[float, float, float, float]]] = defaultdict(list)  # tenant -> x, w, y, h
    for f in forwards:
        counts: dict[str, int] = defaultdict(int)
        for t in f.tenants or ("(unknown)",):
            counts[t] += 1
        y = QUEUE_LANES.get(f.queue, -1.0) + 0.1
        total = sum(counts.values())
        for t in sorted(counts):
            h = 0.8 * counts[t] / total
            bars[t].append((f.start_s, max(f.busy_s, 1e-6), y, h))
            y += h
    raster = len(forwards) > RASTERISE_ABOVE
    for t, rects in bars.items():
        xs, ws, ys, hs = zip(*rects, strict=True)
        ax.bar(xs, hs, width=ws, bottom=ys, align="edge", color=colours.get(t, "0.5"), linewidth=0,
               rasterized=raster)
    ax.set_yticks([v + 0.5 for v in QUEUE_LANES.values()], list(QUEUE_LANES))
    ax.set_ylim(-0.05, 2.05)
    if window is not None:
        ax.set_xlim(*window)
    elif forwards:
        ax.set_xlim(min(f.start_s for f in forwards), max(f.end_s for f in forwards))
    if not forwards:
        _empty(ax, "no forwards recorded in this run")
    ax.set(title=title, xlabel="seconds since the run started")
    handles = [Patch(color=colours.get(t, "0.5"), label=t) for t in sorted(bars)]
    if handles:
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _svg(fig)


def _int_bins(values: Sequence[int]) -> list[float]:
    """At most ~30 bins with integer edges, each value in the middle of its bin."""
    lo, hi = min(values), max(values)
    step = max(1, -(-(hi - lo + 1) // 30))
    return [lo - 0.5 + i * step for i in range((hi - lo) // step + 2)]


def group_histogram(forwards: Sequence[ForwardRecord]) -> str:
    """Rows per forward, one panel per queue (their scales differ: inference groups a few
    observations, training groups whole minibatches), and distinct tenants per forward."""
    fig, axes = plt.subplots(1, 3, figsize=(12.5, 3.4))
    colours = {"inference": "tab:blue", "train": "tab:orange"}
    for ax, queue in zip(axes[:2], ("inference", "train"), strict=True):
        rows = [f.rows for f in forwards if f.queue == queue and f.rows]
        if rows:
            ax.hist(rows, bins=_int_bins(rows), color=colours[queue])
            mean = sum(rows) / len(rows)
            ax.set_title(f"{queue}: rows per forward ({len(rows)} forwards, mean {mean:.1f})", fontsize=9)
        else:
            ax.set_title(f"{queue}: rows per forward", fontsize=9)
            _empty(ax, "no forwards recorded in this run")
        ax.set(xlabel="rows (requests) per forward", ylabel="forwards")
        ax.grid(alpha=0.3)
    ax = axes[2]
    for queue in ("inference", "train"):
        tenants = [len(set(f.tenants)) for f in forwards if f.queue == queue and f.tenants]
        if tenants:
            ax.hist(tenants, bins=_int_bins(tenants), alpha=0.6, label=queue, color=colours[queue])
    ax.set_title("distinct tenants per forward", fontsize=9)
    ax.set(xlabel="tenants in one forward", ylabel="forwards")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    else:
        _empty(ax, "no forwards recorded in this run")
    fig.tight_layout()
    return _svg(fig)


NOTE_CHARS = 170  # a line of the busy bars' note at fontsize 8 across their 12.5-inch figure


def busy_bars(modes: dict[str, dict[str, float]], note: str) -> str:
    """Left: busy fraction of the device per queue (and of the training service, backbone training
    forwards + optimizer steps, where the benchmark measured it); right: device time (held) and
    busy seconds; one bar group per mode (``isolated``, ``shared``) that the run measured."""
    fig, (ax_frac, ax_time) = plt.subplots(1, 2, figsize=(12.5, 3.6))
    names = list(modes)
    width = 0.8 / max(len(names), 1)
    queues = ["train", "inference", "total"]
    if any("busy_fraction_training_service" in m for m in modes.values()):
        queues.append("training_service")
    for i, mode in enumerate(names):
        m = modes[mode]
        fracs = [m.get(f"busy_fraction_{q}", 0.0) for q in queues]
        xs = [j + i * width for j in range(len(queues))]
        ax_frac.bar(xs, fracs, width=width, label=mode)
        for x, v in zip(xs, fracs, strict=True):
            ax_frac.text(x, v, f"{v:.1%}", ha="center", va="bottom", fontsize=7)
        times = [m.get("device_time_s", 0.0), m.get("busy_train_s", 0.0), m.get("busy_inference_s", 0.0)]
        xs = [j + i * width for j in range(3)]
        ax_time.bar(xs, times, width=width, label=mode)
        for x, v in zip(xs, times, strict=True):
            ax_time.text(x, v, f"{v:.1f}", ha="center", va="bottom", fontsize=7)
    centre = width * (len(names) - 1) / 2
    labels = {"training_service": "busy train\n+ optimizer"}
    ax_frac.set_xticks([j + centre for j in range(len(queues))], [labels.get(q, f"busy {q}") for q in queues])
    ax_frac.set(title="device busy fraction (busy s / device time held)", ylabel="fraction")
    ax_time.set_xticks([j + centre for j in range(3)], ["device time held", "busy train", "busy inference"])
    ax_time.set(title="device seconds", ylabel="seconds")
    for ax in (ax_frac, ax_time):
        ax.grid(alpha=0.3, axis="y")
        if names:
            ax.legend(fontsize=8)
        else:
            _empty(ax, "no device numbers in this run")
    # wrapped: a benchmark's note may carry a warning about the run (multi_tenant.skew_warning)
    fig.text(0.5, -0.02, "\n".join(textwrap.wrap(note, NOTE_CHARS)), ha="center", va="top", fontsize=8,
             color="0.3")
    return _svg(fig)
