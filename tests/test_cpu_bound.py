"""The CPU-bound fit: lines recovered from passes that lie on known lines, the target solved
back (by hand and by round trip), every kind of answer ``cpu_for`` gives, and the benchmark's
own JSON format read from files."""

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
    runs = [_pass("isolated", c, 0.7 * c + 10 + noise * s) for c, s in zip(iso_cpu, SIGNS, strict=False)]
    runs += [_pass("shared", c, 0.65 * c + noise * s) for c, s in zip(sha_cpu, SIGNS, strict=False)]
    iso = statistics.median(0.7 * c + 10 for c in iso_cpu)  # the benchmark's saving: of medians
    sha = statistics.median(0.65 * c for c in sha_cpu)
    return {"runs": runs, "device_time_saving": 1 - sha / iso}


def test_the_lines_are_recovered_and_the_target_solved_back() -> None:
    docs = {"a": _doc([40, 42, 44, 46], [36, 38, 40, 42]), "b": _doc([60, 62, 64, 66], [54, 56, 58, 60])}
    result = cb.summarize(docs, target=0.40)
    iso, sha = result["lines"]["isolated"], result["lines"]["shared"]
    assert iso["slope"] == pytest.approx(0.7) and iso["intercept"] == pytest.approx(10.0)
    assert sha["slope"] == pytest.approx(0.65) and abs(sha["intercept"]) < 1e-9
    assert iso["residual_sd"] < 1e-9 and iso["passes"] == sha["passes"] == 8
    for f in result["files"].values():  # passes on the lines: measured == fitted
        assert f["fitted_saving"] == pytest.approx(f["measured_saving"])
    ratio = result["cpu_ratio_shared_to_isolated"]
    assert ratio == pytest.approx(statistics.median([39 / 43, 57 / 63]))  # medians of each file's passes
    # by hand: 0.6 (0.7 C + 10) = 0.65 r C  ->  C = 6 / (0.65 r - 0.42), met below it
    assert result["reach"] == {"where": "at most", "cpu": pytest.approx(6 / (0.65 * ratio - 0.42))}
    lines, cpu = (cb.Line(**iso), cb.Line(**sha)), result["reach"]["cpu"]
    assert cb.saving(*lines, ratio, cpu) == pytest.approx(0.40)
    # less CPU, more saved: the isolated pass's 10 s of waits are overlapped when shared
    assert cb.saving(*lines, ratio, cpu * 0.9) > 0.40 > cb.saving(*lines, ratio, cpu * 1.1)
    assert result["least_isolated_cpu"] == 40


@pytest.mark.parametrize(("shared", "where"), [
    (cb.Line(0.7, 0.0, 0.0, 3), "never"),  # no waits to overlap, 0.9 of the CPU: 10% at any CPU
    (cb.Line(0.7, 9.0, 0.0, 3), "never"),  # and shared has waits of its own
    (cb.Line(0.3, 0.0, 0.0, 3), "always"),  # shared at under half the cost per CPU second
    (cb.Line(0.3, 10.0, 0.0, 3), "at least"),  # shared's waits weigh less as CPU grows
])
def test_every_kind_of_answer(shared: cb.Line, where: str) -> None:
    isolated = cb.Line(0.7, 0.0, 0.0, 3)
    reach = cb.cpu_for(isolated, shared, ratio=0.9, target=0.40)
    assert reach.where == where
    if where == "at least":  # 0.6 x 0.7 C = 0.3 x 0.9 C + 10  ->  C = 10 / 0.15
        assert reach.cpu == pytest.approx(10 / 0.15)
        assert cb.saving(isolated, shared, 0.9, reach.cpu * 1.1) > 0.40 > cb.saving(isolated, shared, 0.9,
                                                                                      reach.cpu * 0.9)
    else:
        assert reach.cpu is None
        met = [cb.saving(isolated, shared, 0.9, c) >= 0.40 for c in (1.0, 40.0, 1000.0)]
        assert met == [where == "always"] * 3


def test_the_answer_in_words() -> None:
    assert "at least 66.7 CPU s" in cb.reach_words({"where": "at least", "cpu": 10 / 0.15}, 40.0)
    assert "already met" in cb.reach_words({"where": "at most", "cpu": 69.1}, 43.5)
    assert "(19% less than" in cb.reach_words({"where": "at most", "cpu": 35.1}, 43.5)
    assert cb.reach_words({"where": "never", "cpu": None}, 43.5) == "at no CPU"


def test_a_line_needs_three_passes_with_two_cpu_figures() -> None:
    with pytest.raises(ValueError, match="two different CPU totals"):
        cb.fit([(40.0, 38.0), (40.0, 39.0), (40.0, 37.0)])
    with pytest.raises(ValueError, match="at least three passes"):
        cb.fit([(40.0, 38.0), (41.0, 39.0)])


def test_the_cli_reads_benchmark_json_and_writes_its_own(tmp_path, capsys) -> None:
    paths = []
    docs = {"a": _doc([40, 42, 44, 46], [36, 38, 40, 42], noise=0.5),
            "b": _doc([60, 62, 64, 66], [54, 56, 58, 60], noise=0.5)}
    for name, doc in docs.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        paths.append(str(path))
    twin = tmp_path / "a-again.json"  # the same run under its run directory's path: counted once
    twin.write_text(json.dumps(docs["a"]))
    in_process = tmp_path / "in-process.json"  # no CPU per process kind: its passes are left out
    in_process.write_text(json.dumps({"runs": [{"mode": "isolated", "makespan_s": 5.0},
                                               {"mode": "shared", "makespan_s": 9.0}]}))
    out = tmp_path / "fit.json"
    result = cb.main([*paths, str(twin), str(in_process), "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    for line in result["lines"].values():  # 8 passes, residuals +-0.5: sqrt(8 x 0.25 / (8 - 2))
        assert line["passes"] == 8 and line["residual_sd"] == pytest.approx((8 * 0.25 / 6) ** 0.5)
    assert set(result["files"]) == set(paths)
    assert "a 40% saving by the lines: an isolated pass of at most" in capsys.readouterr().out


def test_the_cli_says_what_is_missing(tmp_path, capsys) -> None:
    one = tmp_path / "one-repeat.json"
    one.write_text(json.dumps(_doc([40], [36])))
    with pytest.raises(SystemExit):
        cb.main([str(one)])
    assert "at least three passes" in capsys.readouterr().err
    in_process = tmp_path / "in-process.json"
    in_process.write_text(json.dumps({"runs": [{"mode": "shared", "makespan_s": 9.0}]}))
    with pytest.raises(SystemExit):
        cb.main([str(in_process)])
    assert "no file holds passes of both modes" in capsys.readouterr().err
