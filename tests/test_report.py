"""The run report: the device timeline records whose rows each forward computed, and
``joynexus report`` turns a real ``demo --quick`` run into one self-contained page in which
headless Chromium lays out every figure, each visibly drawn in the screenshot."""

from __future__ import annotations

import io
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from PIL import Image
from rich.console import Console

from backbone.gate import DeviceGate
from backbone.grouped import forward_grouped_on
from backbone.timeline import JSONL_SUFFIX, ForwardLog, ForwardRecord, load_forwards, read_window
from infra.runtime.report import PLOTS, build_report, write_report
from tests.browser import chromium_or_skip, rendered, screenshot
from tests.vla import requests

WIDTH = 1280


def _check_page(page: Path, tmp: Path) -> dict:
    """Every figure laid out with a real size and drawn (non-blank, several colours) in the screenshot."""
    check = rendered(page, tmp / "profile")
    assert check, "the report's own render check did not run"
    assert check["expected"] == [pid for pid, _ in PLOTS]
    missing = [pid for pid in check["expected"] if not check["found"].get(pid)]
    assert not missing, f"figures missing from the page: {missing}"
    bottom = max(box["y"] + box["height"] for box in check["found"].values())
    shot = Image.open(screenshot(page, tmp / "shot.png", tmp / "profile", WIDTH, int(bottom) + 40))
    shot = shot.convert("RGB")
    for pid, box in check["found"].items():
        assert box["width"] > 300 and box["height"] > 120, (pid, box)
        assert box["shapes"] > 5, (pid, box)
        crop = shot.crop((int(box["x"]), int(box["y"]), int(box["x"] + box["width"]),
                          int(box["y"] + box["height"])))
        pixels = list(crop.getdata())
        drawn = sum(1 for p in pixels if min(p) < 235) / len(pixels)
        assert drawn > 0.01, f"figure {pid} is blank in the screenshot ({drawn:.4f} drawn)"
        assert len(set(crop.quantize(16).getdata())) >= 3, f"figure {pid} has almost no colours"
    return check


async def test_gate_timeline_records_each_forwards_queue_and_tenants(backbones) -> None:
    gate = DeviceGate()
    tiny = backbones["tiny"]
    reqs = requests(5, words=4)
    tenants = ["alice", "bob", "alice", "carol", "bob"]
    prepared = [tiny.prepare(replace(r, tenant=t)) for r, t in zip(reqs, tenants, strict=True)]
    await forward_grouped_on(gate, "inference", tiny, prepared)
    await forward_grouped_on(gate, "train", tiny, prepared[:2])
    records = list(gate.timeline.records)
    assert [r.queue for r in records] == ["inference", "train"]
    assert sorted(records[0].tenants) == sorted(tenants) and records[1].tenants == ("alice", "bob")
    assert records[0].end_s <= records[1].start_s and all(r.busy_s > 0 for r in records)
    assert sum(r.busy_s for r in records) == pytest.approx(gate.busy_s["inference"] + gate.busy_s["train"],
                                                           rel=0.05, abs=1e-3)


def test_forward_log_round_trips_and_refuses_other_formats(tmp_path: Path) -> None:
    log = ForwardLog(maxlen=3)
    for i in range(5):
        log.add("train" if i % 2 else "inference", i * 1.0, i + 0.5, ["a"] * (i + 1))
    assert log.dropped == 2 and len(log.records) == 3
    back = load_forwards(log.dump(tmp_path / "forwards.json"))
    assert back == list(log.records)
    (tmp_path / "other.json").write_text(json.dumps({"format": "something-else", "forwards": []}))
    with pytest.raises(ValueError, match="other.json"):
        load_forwards(tmp_path / "other.json")


def test_records_of_another_clock_carry_that_clocks_origin(tmp_path: Path) -> None:
    """A benchmark dumps records relative to its own start: the file must name that start, not
    the moment of the dump (traces once said a time 20 minutes after the run's)."""
    records = [ForwardRecord("inference", 1.0, 1.5, ("a",))]
    path = ForwardLog().dump(tmp_path / "forwards.json", records, origin_unix=1_000.0)
    assert json.loads(path.read_text())["origin_unix"] == 1_000.0
    assert ForwardLog().to_json(records)["origin_unix"] > 1_000.0  # default: the log's own origin


def test_exported_timelines_are_read_back_by_window_across_files(tmp_path: Path) -> None:
    # two device hosts (or one restarted) append to their own files; a report reads one window
    first, second = ForwardLog(), ForwardLog()
    first.add("inference", 1.0, 1.5, ["a"])
    first.add("train", 2.0, 2.5, ["a", "b"])
    assert first.export_jsonl(tmp_path / f"d0{JSONL_SUFFIX}") == 2
    assert first.export_jsonl(tmp_path / f"d0{JSONL_SUFFIX}") == 0  # nothing new: nothing written
    first.add("inference", 3.0, 3.25, ["b"])
    second.add("inference", 0.5, 0.75, ["c"])
    first.export_jsonl(tmp_path / f"d0{JSONL_SUFFIX}")
    second.export_jsonl(tmp_path / f"d1{JSONL_SUFFIX}")
    with (tmp_path / f"d1{JSONL_SUFFIX}").open("a") as f:
        f.write('["inference", 12')  # a process killed mid-line
    since = first.origin_unix + 1.5
    got = read_window(tmp_path, since, first.origin_unix + 2.5)
    assert [(r.queue, r.tenants) for r in got] == [("train", ("a", "b"))]
    assert got[0].start_s == pytest.approx(0.5, abs=1e-5) and got[0].busy_s == pytest.approx(0.5, abs=1e-5)
    everything = read_window(tmp_path, min(first.origin_unix, second.origin_unix))
    assert sorted(t for r in everything for t in r.tenants) == ["a", "a", "b", "b", "c"]


def test_an_export_above_its_size_limit_rotates(tmp_path: Path) -> None:
    log = ForwardLog()
    path = tmp_path / f"d0{JSONL_SUFFIX}"
    for i in range(3):
        log.add("inference", float(i), i + 0.5, ["a"] * 50)
        log.export_jsonl(path, max_bytes=100)
    assert (tmp_path / f"d0{JSONL_SUFFIX}.1").exists() and len(path.read_text().splitlines()) == 1
    assert len(read_window(tmp_path, log.origin_unix)) == 2  # the current file and the one before


def test_an_empty_run_dir_still_has_every_figure_saying_why(tmp_path: Path) -> None:
    page = build_report(tmp_path)
    for pid, _ in PLOTS:
        assert f'id="plot-{pid}"' in page
    assert "no forwards recorded in this run" in page and "no RL tenant in this run" in page


def test_the_render_check_sees_a_missing_figure(tmp_path: Path) -> None:
    # The browser check is only worth something if it notices a figure that is not there.
    chromium_or_skip()
    page = tmp_path / "report.html"
    html = build_report(tmp_path)
    page.write_text(re.sub(r'<figure class="plot" id="plot-groups".*?</figure>', "", html, flags=re.S))
    check = rendered(page, tmp_path / "profile")
    assert set(check["found"]) == {pid for pid, _ in PLOTS} - {"groups"}


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.timeout(1800)  # the demo starts every role as its own process
async def test_demo_quick_run_renders_every_plot_in_headless_chromium(settings, tmp_path: Path) -> None:
    from infra.runtime.demo import run_demo

    chromium_or_skip()
    demo_settings = settings.model_copy(update={"backbone": "tiny", "home": tmp_path / "home",
                                             "bootstrap_servers": settings.bootstrap})
    # ManiSkill is left out here (its own tests cover it; it adds minutes on 2 cores): two Reach PPO
    # tenants and one SFT tenant exercise every figure.
    summary = await run_demo(demo_settings, quick=True, maniskill=False, console=Console(file=io.StringIO()))
    assert all(t["phase"] == "completed" for t in summary["tenants"]), summary["tenants"]
    (run_dir,) = list((demo_settings.run_dir).iterdir())
    assert (run_dir / "report.html").exists()  # the demo writes it
    assert "run directory" not in (run_dir / "demo.log").read_text()  # log lines, not the console's
    assert (run_dir / "demo.log").stat().st_size > 0
    assert {p.name.split("-")[0] for p in (run_dir / "logs").glob("*.log")} >= {"device", "master", "env"}
    service = summary["service"]  # how full the forwards were while the jobs trained together
    for queue in ("inference", "train"):
        assert service[f"{queue}_group_forwards"] > 0
        assert 1 <= service[f"{queue}_group_p50_rows"] <= service[f"{queue}_group_p90_rows"]
        assert service[f"{queue}_group_p90_rows"] <= service[f"{queue}_group_max_rows"]
    assert 0 < service["inference_group_multi_tenant_share"] <= 1
    forwards = load_forwards(run_dir / "forwards.json")
    tenants = {t["tenant"] for t in summary["tenants"]}
    assert {q.queue for q in forwards} == {"inference", "train"}
    assert {t for f in forwards for t in f.tenants} == tenants  # every tenant's rows went through the gate
    assert any(len(set(f.tenants)) > 1 for f in forwards), "no forward was shared between tenants"
    page = write_report(run_dir, tmp_path / "again.html")  # `joynexus report` does this
    text = page.read_text()
    assert not re.search(r'(src|href)="(https?:)?//', text), "the page must not reference anything outside"
    for tenant in tenants:
        assert tenant in text
    _check_page(page, tmp_path)


def test_report_cli_writes_the_page(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from infra.cli import app
    from infra.logging import configure_logging

    (tmp_path / "jobs.json").write_text(json.dumps({"t1": {"job_id": "j", "phase": "completed", "history": [
        {"step": 1.0, "iteration": 0, "mean_return": 1.0, "success_rate": 0.0},
        {"step": 2.0, "iteration": 1, "mean_return": 2.0, "success_rate": 0.5},
        {"step": 3.0, "steps": 4, "train_loss": 0.7}]}}))
    try:
        result = CliRunner().invoke(app, ["report", str(tmp_path), "-o", str(tmp_path / "r.html")])
        missing = CliRunner().invoke(app, ["report", str(tmp_path / "nope")])
    finally:
        # the CLI configures logging onto CliRunner's stream, which is closed after invoke: every
        # later log line of this test session would raise "I/O operation on closed file"
        configure_logging("INFO", "json")
    assert result.exit_code == 0, result.output
    assert 'id="plot-return"' in (tmp_path / "r.html").read_text()
    assert missing.exit_code == 1
