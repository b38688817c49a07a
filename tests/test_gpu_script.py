"""``benchmarks/gpu.sh --dry-run``: the GPU script's every step runs on the CPU with the tiny
preset against the test broker, and its results folder holds every figure the README takes
from a GPU run (group batching table, tenant-slot memory, shared vs isolated with bit-equality)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str], settings, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "JOYNEXUS_HOME": str(tmp_path / "home"),
           "JOYNEXUS_BOOTSTRAP_SERVERS": settings.bootstrap, "JOYNEXUS_LOG_LEVEL": "WARNING"}
    return subprocess.run(["bash", str(ROOT / "benchmarks/gpu.sh"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1500)


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_dry_run_produces_every_section(settings, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _run(["--dry-run", "--out", str(out)], settings, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["environment"]["dry_run"] == 1 and results["environment"]["cuda"] in (True, False)
    assert [(s["name"], s["status"]) for s in results["steps"]] == [
        ("environment", "ok"), ("presets", "ok"), ("multi_tenant", "ok"), ("group_batching_tiny", "ok"),
        ("projection", "ok"), ("tenant_memory", "ok")]
    rows = results["group_batching"]["tiny"]
    assert {(r["tenants"], r["local_batch"]) for r in rows} == {(1, 1), (1, 4), (8, 1), (8, 4)}
    for r in rows:
        assert r["device"] == "cpu" and r["grouped_s"] > 0 and r["separate_s"] > 0
        assert r["speedup"] == pytest.approx(r["separate_s"] / r["grouped_s"])
        assert 0 < r["grouped_host_s"] <= r["grouped_s"] * 1.05  # a CPU forward is all host work
    memory = results["tenant_memory"]
    assert {r["preset"] for r in memory} == {"tiny"} and len(memory) == 7
    mt = results["multi_tenant"]
    assert mt["backbone"] == "tiny" and mt["tenants"] == 3 and mt["bit_identical"] == [True] * 3
    assert [r["mode"] for r in mt["runs"]] == ["isolated", "shared"]
    ratio = mt["medians"]["shared"]["device_time_s"] / mt["medians"]["isolated"]["device_time_s"]
    assert mt["ratios"]["device_time_s"] == pytest.approx(ratio)
    iso = mt["runs"][0]
    assert iso["busy_fraction_total"] == pytest.approx(iso["busy_total_s"] / iso["device_time_s"])
    md = (out / "results.md").read_text()
    for heading in ("DRY RUN", "## Group batching", "## Tenant-slot memory", "## Shared vs isolated",
                    "bit-identical across runs: 3/3", "## PROJECTION (a model, not a measurement)"):
        assert heading in md
    assert (out / "multi_tenant_run" / "report.html").exists()
    proj = results["projection"]
    assert proj["gpu_source"].startswith("measured GPU forward times from group_batching_tiny.json")
    assert proj["measured"]["shared_device_time_s"] == pytest.approx(mt["medians"]["shared"]["makespan_s"])
    # the processes deployment recorded each turn's CPU, so the cores model played too
    assert proj["gpu_forward_share_source"] == "measured in group_batching_tiny.json"
    assert proj["projection_gpu_cores"]["shared"]["device_time_s"] > 0 and "Cores model" in md


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_dry_run_on_a_cpu_machine_it_stops_after_the_environment_check(settings, tmp_path) -> None:
    done = _run(["--out", str(tmp_path / "out")], settings, tmp_path)
    assert done.returncode == 1
    assert "no CUDA device" in done.stderr and "nothing else was run" in done.stderr
    assert not list((tmp_path / "out").glob("group_batching_*"))
