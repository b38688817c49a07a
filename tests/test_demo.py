"""The demo as a person runs it: the live board's rows follow each tenant's job states, the
summary's group-size figures are what the device timeline says, and Ctrl-C stops the demo and
every process it started, leaving where each tenant was in the run directory."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from backbone.timeline import ForwardRecord, group_sizes
from infra.runtime.demo import demo_backbone
from infra.runtime.demo_board import DemoBoard
from infra.settings import Settings
from infra.topics import tenant_topic
from schemas import events as ev
from schemas.jobstate import JobState
from tests.helpers import read_topic, wait_for

SPECS = [
    {"kind": "rl", "tenant": "reach-a", "env": {"env_id": "joynexus/Reach-v0"}},
    {"kind": "sft", "tenant": "sft-reach", "dataset": {"path": "/d"}},
]


def _render(board: DemoBoard) -> str:
    console = Console(file=io.StringIO(), width=200)
    console.print(board)
    return console.file.getvalue()


def test_board_rows_follow_training_then_evaluation() -> None:
    board = DemoBoard(SPECS)
    assert "waiting" in _render(board)
    board.train(JobState("reach-a", "train-1", phase="accepted", step=3, total_steps=8, policy_version=4,
                         metrics={"mean_return": 1.25, "success_rate": 0.5}))
    board.train(JobState("sft-reach", "train-1", phase="accepted", step=7, total_steps=20,
                         metrics={"train_loss": 0.1234}))
    text = _render(board)
    assert "3/8" in text and "1.25" in text and "0.50" in text and "7/20" in text and "0.1234" in text
    board.train(JobState("reach-a", "train-1", phase="completed", step=8, total_steps=8, policy_version=9))
    board.evaluate(JobState("reach-a", "eval-v1", phase="completed", metrics={"success_rate": 0.125}), 1)
    board.evaluate(JobState("reach-a", "eval-v9", phase="accepted", step=5, total_steps=24), 9)
    text = _render(board)
    assert "eval v9" in text and "5/24" in text and "v1: 0.12" in text
    board.evaluate(JobState("reach-a", "eval-v9", phase="completed", metrics={"success_rate": 0.875}), 9)
    assert "v1: 0.12 -> v9: 0.88" in _render(board)
    (row,) = [r for r in board.snapshot() if r["tenant"] == "reach-a"]
    assert row["version"] == 9 and row["eval_success"] == {1: 0.125, 9: 0.875} and row["phase"] == "done"


def test_the_demo_runs_tiny_without_a_gpu_unless_a_backbone_was_chosen(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("JOYNEXUS_BACKBONE", raising=False)
    unset = Settings(home=tmp_path, _env_file=None)
    assert demo_backbone(unset, gpu=False).backbone == "tiny"
    assert demo_backbone(unset, gpu=True).backbone == unset.backbone == "small"
    monkeypatch.setenv("JOYNEXUS_BACKBONE", "mini-pretrained")
    chosen = Settings(home=tmp_path, _env_file=None)
    assert demo_backbone(chosen, gpu=False).backbone == "mini-pretrained"
    # and the children the supervisor starts get it: it passes the settings on as JOYNEXUS_* variables
    assert demo_backbone(unset, gpu=False).as_env()["JOYNEXUS_BACKBONE"] == "tiny"


def test_group_sizes_per_queue() -> None:
    rows = [("a",), ("a", "b"), ("a", "a", "a"), ("a", "b", "c", "c")]
    records = [ForwardRecord("inference", 0.0, 1.0, t) for t in rows]
    records.append(ForwardRecord("train", 0.0, 1.0, ("a",) * 9))
    stats = group_sizes(records, "inference")
    assert stats == {"forwards": 4.0, "mean_rows": 2.5, "p50_rows": 2.0, "p90_rows": 4.0, "max_rows": 4.0,
                     "multi_tenant_share": 0.5}
    assert group_sizes(records, "train")["mean_rows"] == 9.0
    assert group_sizes(records, "other") == {"forwards": 0.0}


def _children_of(pid: int) -> list[int]:
    """Role processes started by the supervisor in process ``pid`` (they carry --parent-pid)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"--parent-pid" in args and args[args.index(b"--parent-pid") + 1] == str(pid).encode():
                found.append(int(entry.name))
    return found


@pytest.mark.broker
@pytest.mark.slow
async def test_ctrl_c_stops_the_demo_and_its_processes_and_says_where_it_was(settings: Settings,
                                                                              tmp_path: Path) -> None:
    home = tmp_path / "home"
    child = settings.model_copy(update={"backbone": "tiny", "home": home,
                                        "bootstrap_servers": settings.bootstrap})
    demo = subprocess.Popen([sys.executable, "-m", "infra", "demo", "--quick", "--no-maniskill"],
                            env={**os.environ, **child.as_env()}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        def collected() -> bool:  # a first RL iteration: the jobs are under way
            return any("iteration collected" in p.read_text(errors="replace")
                       for p in home.glob("runs/demo-*/logs/rollout-*.log"))

        await wait_for(collected, timeout_s=400, what="a first RL iteration")
        assert _children_of(demo.pid)
        asked = time.monotonic()
        demo.send_signal(signal.SIGINT)
        out, _ = demo.communicate(timeout=120)
        print(f"demo stopped {time.monotonic() - asked:.1f} s after SIGINT")
    finally:
        if demo.poll() is None:
            demo.kill()
    text = out.decode(errors="replace")
    assert demo.returncode == 130, text[-3000:]
    (run_dir,) = home.glob("runs/demo-*")
    partial = json.loads((run_dir / "partial.json").read_text())
    assert {row["kind"] for row in partial} == {"rl", "sft"}
    assert any(row["phase"].startswith("train") and row["step"] >= 1 for row in partial), partial
    assert "partial.json" in text and str(run_dir) in text.replace("\n", "")
    assert not _children_of(demo.pid)  # every role process went with it
    for row in partial:  # and its jobs do not resume under the next master on this broker
        cancels = [r.event for r in await read_topic(settings, tenant_topic(settings, row["tenant"], "jobs"))
                   if isinstance(r.event, ev.JobCancelled)]
        assert cancels and all(c.reason == "the demo was interrupted" for c in cancels), row["tenant"]
