"""``benchmarks/multi_tenant.py --deployment processes`` end to end on the smoke scenario: the service
as OS processes under the supervisor (device host and optimizer pinned to one CPU, the rest to the
others), a warm-up, one isolated and
one shared run, figures read from the device host's timeline file, bit-identical final parameters,
the step trace, and every output file. No assertion on time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_processes_deployment_runs_end_to_end(settings, tmp_path: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the processes deployment needs two CPUs (device host + the rest)")
    run_dir, out = tmp_path / "run", tmp_path / "mt.json"
    started = time.time()
    env = {**os.environ, "JOYNEXUS_HOME": str(tmp_path / "home"),
           "JOYNEXUS_BOOTSTRAP_SERVERS": settings.bootstrap, "JOYNEXUS_BACKBONE": "tiny",
           "JOYNEXUS_LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.multi_tenant", "--deployment", "processes", "--scenario", "smoke",
         "--no-maniskill", "--repeats", "1", "--env-workers", "1", "--step-trace", "--json", str(out),
         "--run-dir", str(run_dir)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["deployment"] == "processes" and result["tenants"] == 3
    # the default plan: the device's work (forwards, optimizer steps) on one core, all else beside it
    affinity = result["cpu_affinity"]
    assert affinity["optimizer"] == affinity["device"] and not set(affinity["device"]) & set(affinity["rest"])
    assert result["bit_identical"] == [True] * 3
    assert [r["mode"] for r in result["runs"]] == ["isolated", "shared"]
    for run in result["runs"]:
        # the device host's own forwards, read from its timeline file in another process
        assert run["forwards_inference"] > 0 and run["forwards_train"] > 0
        assert run["busy_total_s"] == pytest.approx(run["busy_train_s"] + run["busy_inference_s"])
        assert run["busy_fraction_total"] == pytest.approx(run["busy_total_s"] / run["device_time_s"])
        # the same seconds as the device host's heartbeats count (rounded to ms there)
        assert run["busy_total_s_heartbeats"] == pytest.approx(run["busy_total_s"], rel=0.02, abs=0.05)
        # the training service: backbone training forwards + every tenant's metered optimizer steps
        assert run["busy_optimizer_s"] > 0 and run["optimizer_steps"] > 0
        assert run["busy_training_service_s"] == pytest.approx(run["busy_train_s"] + run["busy_optimizer_s"])
        assert run["busy_fraction_training_service"] == pytest.approx(
            run["busy_training_service_s"] / run["device_time_s"])
    # CPU seconds per process kind, read from /proc: every supervised kind and the client
    for mode in ("isolated", "shared"):
        cpu = result["cpu_medians"][mode]
        assert {"cpu_device_s", "cpu_env_s", "cpu_optimizer_s", "cpu_client_s"} <= cpu.keys()
        assert cpu["cpu_device_s"] > 0 and cpu["cpu_env_s"] > 0
        # and the seconds each kind waited for a CPU (run queue, /proc/<pid>/task/*/schedstat)
        waits = result["runqueue_wait_medians"][mode]
        assert {k.replace("cpu_", "rqwait_", 1) for k in cpu} == waits.keys()
        assert all(w >= 0 for w in waits.values())
        if Path("/proc/self/schedstat").exists():  # a kernel with schedstats: some process queued
            assert sum(waits.values()) > 0
    assert "where the cores' time goes" in done.stdout
    assert all(run["steal_s"] >= 0 for run in result["runs"]) and "CPU stolen by the VM's host" in done.stdout
    assert all(0 <= run["steal_share"] <= 1 for run in result["runs"])
    assert "stolen, share of the CPUs' time" in done.stdout
    assert "CPU seconds of the whole service per pass" in done.stdout
    assert all(skew >= 0 for skew in result["work_skew"].values())  # one pass a mode: 0
    assert "cores the service kept busy" in done.stdout
    assert all(cores > 0 for cores in result["cores_busy"].values())
    # fixed work per tenant: the same optimizer steps in both modes
    assert len({run["optimizer_steps"] for run in result["runs"]}) == 1
    ratio = result["medians"]["shared"]["device_time_s"] / result["medians"]["isolated"]["device_time_s"]
    assert result["ratios"]["device_time_s"] == pytest.approx(ratio)
    assert "CPU affinity" in done.stdout and "training service" in done.stdout
    for name in ("multi_tenant.json", "comparison.json", "traces.json", "forwards.json", "jobs.json",
                 "report.html"):
        assert (run_dir / name).exists(), name
    assert "deployment processes" in json.loads((run_dir / "comparison.json").read_text())["note"]
    # the step trace: every step the device host answered in a pass, once, split into its stages
    traces = json.loads((run_dir / "traces.json").read_text())
    for run, trace in zip(result["runs"], traces, strict=True):
        rows = sum(len(f[3]) for f in trace["forwards"]["forwards"] if f[0] == "inference")
        assert run["steps_traced"] == rows > 0, (run["mode"], run["steps_traced"], rows)
    for mode in ("isolated", "shared"):
        stages = result["step_stages"][mode]
        assert set(stages) == {"bus_in", "lookup", "device", "head", "ack", "total"}
        assert all(s["steps"] == stages["total"]["steps"] and s["mean_ms"] >= 0 for s in stages.values())
        parts = sum(s["mean_ms"] for name, s in stages.items() if name != "total")
        assert parts == pytest.approx(stages["total"]["mean_ms"])
        assert stages["device"]["mean_ms"] > 0  # a forward takes time
    assert "where an env step's round trip goes" in done.stdout
    # each pass's forwards are relative to the run's start, and the file names that wall time
    path = run_dir / "traces.json"
    for trace in json.loads(path.read_text()):
        origin, spans = trace["forwards"]["origin_unix"], trace["spans"]
        assert started < origin + spans[0][0] < origin + max(end for _, end in spans) <= path.stat().st_mtime


def test_a_run_the_vm_host_stole_more_from_one_mode_says_so() -> None:
    from rich.console import Console

    from benchmarks.multi_tenant import METRICS, print_steal, summarise

    def runs(isolated: list[float], shared: list[float]) -> list[dict]:
        return [{**dict.fromkeys(METRICS, 1.0), "mode": mode, "repeat": i, "steal_s": 2 * 100 * x,
                 "steal_share": x} for mode, shares in (("isolated", isolated), ("shared", shared))
                for i, x in enumerate(shares)]

    def printed(r: list[dict]) -> str:
        console = Console(record=True, width=200)
        print_steal(console, r, summarise(r)["medians"])
        return console.export_text()

    # the 2026-12-02 10:04 run's shares: isolated 6.2 / 2.7 / 12.7%, shared 2.5 / 2.8 / 4.1%
    flattered = runs([0.062, 0.027, 0.127], [0.025, 0.028, 0.041])
    medians = summarise(flattered)["medians"]
    assert (medians["isolated"]["steal_share"], medians["shared"]["steal_share"]) == (0.062, 0.028)
    assert "stole more from the isolated passes" in printed(flattered) and "flattered" in printed(flattered)
    assert "understated" in printed(runs([0.01], [0.08]))
    even = printed(runs([0.051, 0.050, 0.031], [0.054, 0.036, 0.044]))  # the 06:15 run's shares
    assert "isolated 5.0%, shared 4.4%" in even and "warning" not in even


def test_iterations_caps_every_rl_tenant_and_leaves_the_sft_tenant_alone(tmp_path: Path) -> None:
    # gpu.sh runs the quick scenario with --iterations 3: at gpu-2b on an H200 a Reach iteration
    # took 10-15 s, and the full quick scenario does not fit the step's limit
    from benchmarks.multi_tenant import bench_scenario

    quick = bench_scenario("quick", tmp_path, maniskill=True)
    capped = bench_scenario("quick", tmp_path, maniskill=True, iterations=3)
    assert [s["tenant"] for s in capped] == [s["tenant"] for s in quick]
    for full, short in zip(quick, capped, strict=True):
        if full["kind"] == "rl":
            assert short["rl"]["iterations"] == min(3, full["rl"]["iterations"])
            assert {**short["rl"], "iterations": 0} == {**full["rl"], "iterations": 0}
        else:
            assert short == full
    assert {s["rl"]["iterations"] for s in quick if s["kind"] == "rl"} == {8, 2}  # the cap bites
    pushed = bench_scenario("quick", tmp_path, maniskill=False, builtin_third=True, iterations=3)
    assert [s["rl"]["iterations"] for s in pushed if s["kind"] == "rl"] == [3, 3, 3]


def test_a_run_whose_passes_cost_different_cpu_for_the_same_work_says_so() -> None:
    from rich.console import Console

    from benchmarks.multi_tenant import cores_busy, print_work, skew_warning, work_skew

    def runs(isolated: list[float], shared: list[float]) -> list[dict]:
        # split over two kinds, as /proc gives it: the total is what counts; the makespans are
        # those of 1.1 cores busy isolated and 1.5 shared
        return [{"mode": mode, "repeat": i, "cpu_device_s": x / 2, "cpu_env_s": x / 2,
                 "makespan_s": x / (1.1 if mode == "isolated" else 1.5)}
                for mode, totals in (("isolated", isolated), ("shared", shared))
                for i, x in enumerate(totals)]

    def printed(r: list[dict]) -> str:
        console = Console(record=True, width=300)
        print_work(console, r, work_skew(r))
        return console.export_text()

    # the service's CPU s per pass of two 2026-12-07 runs: 06:52 (the VM slowing) and 06:42 (steady)
    moved = runs([56.7, 68.7, 65.7], [47.4, 45.5, 52.3])
    assert work_skew(moved)["isolated"] == pytest.approx(68.7 / 56.7 - 1)
    assert "one isolated pass took 21% more CPU" in printed(moved)
    # the same words go into comparison.json's note, under the report's busy bars
    assert "one isolated pass took 21% more CPU" in skew_warning(work_skew(moved))
    steady = runs([57.0, 56.9, 58.5], [51.9, 52.6, 54.3])
    assert "isolated 1: 57.0" in printed(steady) and "warning" not in printed(steady)
    assert "isolated 1.100, shared 1.500 (1.36x)" in printed(steady)
    assert cores_busy(steady) == pytest.approx({"isolated": 1.1, "shared": 1.5})
    assert "shared / isolated: 0.923" in printed(steady)  # 52.6 / 57.0
    # the median pass, not the mean nor the first: one pass of each mode kept more cores busy
    uneven = [{**r, "makespan_s": r["makespan_s"] * (0.5 if r["repeat"] == 0 else 1.0)} for r in steady]
    assert cores_busy(uneven) == pytest.approx({"isolated": 1.1, "shared": 1.5})
    one_each = [steady[0], steady[3]]  # one pass a mode: saving = 1 - CPU ratio / cores ratio
    busy = cores_busy(one_each)
    saving = 1 - one_each[1]["makespan_s"] / one_each[0]["makespan_s"]
    assert saving == pytest.approx(1 - (51.9 / 57.0) / (busy["shared"] / busy["isolated"]))
    assert skew_warning(work_skew(steady)) is None
    in_process = [{"mode": "isolated", "repeat": 0, "makespan_s": 9.0},
                  {"mode": "shared", "repeat": 0, "makespan_s": 6.0}]
    assert work_skew(in_process) == cores_busy(in_process) == {
        "isolated": None, "shared": None}  # in-process: no CPU per kind, nothing printed
    assert printed(in_process) == ""
