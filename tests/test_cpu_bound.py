"""The CPU-bound fit: lines recovered from passes that lie on known lines, the target solved
back, and the benchmark's own JSON format read from files."""

from __future__ import annotations

import json
import statistics

import pytest

from benchmarks import cpu_bound as cb


def _pass(mode: str, cpu: float, makespan: float) -> dict:
    # the fields multi_tenant.py writes for a processes pass: CPU per process kind, makespan
    return {"mode": mode, "makespan_s": makespan, "cpu_device_s": cpu * 0.4, "cpu_broker_s": cpu * 0.6}


SIGNS = (1, -1, -1, 1)  # with evenly spaced CPU figures: noise with no mean and no slope


def _doc(iso_cpu: list[float], sha_cpu: list[float], noise: float = 0.0) -> dict:
    runs = [_pass("isolated", c, 0.7 * c + 10 + noise * s) for c, s in zip(iso_cpu, SIGNS, strict=True)]
    runs += [_pass("shared", c, 0.65 * c + noise * s) for c, s in zip(sha_cpu, SIGNS, strict=True)]
    iso = statistics.median(0.7 * c + 10 for c in iso_cpu)  # the benchmark's saving: of medians
    sha = statistics.median(0.65 * c for c in sha_cpu)
    return {"runs": runs, "device_time_saving": 1 - sha / iso}


def test_the_lines_are_recovered_and_the_target_solved_back() -> None:
    docs = {"a": _doc([40, 42, 44, 46], [36, 38, 40, 42]), "b": _doc([60, 62, 64, 66], [54, 56, 58, 60])}
    result = cb.summarize(docs, target=0.40)
    iso, sha = result["lines"]["isolated"], result["lines"]["shared"]
    assert iso["slope"] == pytest.approx(0.7) and iso["intercept"] == pytest.approx(10.0)
    assert sha["slope"] == pytest.approx(0.65) and abs(sha["intercept"]) < 1e-9
    assert iso["residual_sd"] < 1e-9 and iso["passes"] == 8
    for f in result["files"].values():  # passes on the lines: measured == fitted
        assert f["fitted_saving"] == pytest.approx(f["measured_saving"])
    ratio, cpu = result["cpu_ratio_shared_to_isolated"], result["isolated_cpu_for_target"]
    lines = cb.Line(**iso), cb.Line(**sha)
    assert cb.saving(*lines, ratio, cpu) == pytest.approx(0.40)
    # less CPU, more saved: the isolated pass's 10 s of waits are overlapped when shared
    assert cb.saving(*lines, ratio, cpu * 0.9) > 0.40 > cb.saving(*lines, ratio, cpu * 1.1)
    assert result["least_isolated_cpu"] == 40


def test_lines_that_never_reach_the_target_say_so() -> None:
    # shared costs as much per CPU second as isolated and has no waits to overlap: saving < target
    line = cb.Line(slope=0.7, intercept=0.0, residual_sd=0.0, passes=3)
    assert cb.cpu_for(line, line, ratio=0.9, target=0.40) is None
    assert cb.saving(line, line, 0.9, 50.0) == pytest.approx(0.1)


def test_a_line_needs_two_cpu_figures() -> None:
    with pytest.raises(ValueError, match="two different CPU totals"):
        cb.fit([(40.0, 38.0), (40.0, 39.0)])


def test_the_cli_reads_benchmark_json_and_writes_its_own(tmp_path) -> None:
    paths = []
    for name, doc in {"a": _doc([40, 42, 44, 46], [36, 38, 40, 42], noise=0.5),
                      "b": _doc([60, 62, 64, 66], [54, 56, 58, 60], noise=0.5)}.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        paths.append(str(path))
    in_process = tmp_path / "in-process.json"  # no CPU per process kind: its passes are left out
    in_process.write_text(json.dumps({"runs": [{"mode": "shared", "makespan_s": 9.0}]}))
    out = tmp_path / "fit.json"
    result = cb.main([*paths, str(in_process), "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["lines"]["isolated"]["residual_sd"] == pytest.approx(0.5)
    assert str(in_process) not in result["files"] and len(result["files"]) == 2
