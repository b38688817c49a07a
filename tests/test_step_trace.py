"""The step trace's file format: written in batches, read back by window, torn lines skipped,
stages as differences of consecutive marks (the inference role's side is exercised end to end by
``test_multi_tenant_processes.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.step_trace import STAGES, STEPS_SUFFIX, StepTrace, read_steps, stage_summary


def marks(t0: float, *gaps_ms: float) -> list[float]:
    out = [t0]
    for gap in gaps_ms:
        out.append(out[-1] + gap / 1000)
    return out


def test_steps_round_trip_by_window_and_split_into_stages(tmp_path: Path) -> None:
    trace = StepTrace()
    trace.add("alice", "s-1", "s-1/0", 0, marks(1000.0, 3, 0.5, 9, 1, 2))
    trace.add("bob", "s-2", "s-2/0", 4, marks(1001.0, 1, 1, 1, 1, 1))
    path = tmp_path / f"device-0{STEPS_SUFFIX}"
    assert trace.export(path) == 2
    assert trace.export(path) == 0  # nothing new: nothing appended
    trace.add("alice", "s-1", "s-1/0", 1, marks(1002.0, 2, 2, 2, 2, 2))
    assert trace.export(path) == 1
    with path.open("a") as f:
        f.write('{"tenant": "carol", "t": [1003.0, 10')  # a process killed mid-line

    steps = read_steps(tmp_path, 1000.5)
    assert [(s.tenant, s.step) for s in steps] == [("bob", 4), ("alice", 1)]
    assert [s.step for s in read_steps(tmp_path, 999.0, 1001.5)] == [0, 4]
    first = read_steps(tmp_path, 999.0)[0]
    assert (first.session, first.episode) == ("s-1", "s-1/0")
    stages = first.stages_ms()
    assert list(stages) == [*STAGES, "total"]
    assert [round(stages[s], 6) for s in STAGES] == [3, 0.5, 9, 1, 2]
    assert stages["total"] == pytest.approx(15.5)


def test_stage_summary_is_mean_and_median_per_stage(tmp_path: Path) -> None:
    trace = StepTrace()
    for i, device_ms in enumerate((4, 6, 20)):
        trace.add("alice", "s", "s/0", i, marks(10.0 + i, 1, 1, device_ms, 1, 1))
    trace.export(tmp_path / f"x{STEPS_SUFFIX}")
    summary = stage_summary(read_steps(tmp_path, 0.0))
    assert summary["device"]["steps"] == 3
    assert summary["device"]["mean_ms"] == pytest.approx(10.0)
    assert summary["device"]["p50_ms"] == pytest.approx(6.0)
    assert summary["total"]["mean_ms"] == pytest.approx(14.0)
    assert stage_summary([]) == {}


def test_a_step_needs_every_mark_and_a_full_file_is_rotated(tmp_path: Path) -> None:
    trace = StepTrace()
    with pytest.raises(ValueError, match="6 marks"):
        trace.add("alice", "s", "s/0", 0, [1.0, 2.0])
    path = tmp_path / f"d{STEPS_SUFFIX}"
    trace.add("alice", "s", "s/0", 0, marks(1.0, 1, 1, 1, 1, 1))
    trace.export(path)
    trace.add("alice", "s", "s/0", 1, marks(2.0, 1, 1, 1, 1, 1))
    trace.export(path, max_bytes=1)  # over the limit: moved aside, then a fresh file
    assert path.with_name(path.name + ".1").exists()
    assert [s.step for s in read_steps(tmp_path, 0.0)] == [0, 1]  # both files are read
