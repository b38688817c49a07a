"""The demo's terminal: the live board's rows follow each tenant's job states, and the summary's
group-size figures are what the device timeline says."""

from __future__ import annotations

import io

from rich.console import Console

from backbone.timeline import ForwardRecord, group_sizes
from infra.runtime.demo_board import DemoBoard
from schemas.jobstate import JobState

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
    assert row["version"] == 9 and row["eval_success"] == {1: 0.125, 9: 0.875}


def test_group_sizes_per_queue() -> None:
    rows = [("a",), ("a", "b"), ("a", "a", "a"), ("a", "b", "c", "c")]
    records = [ForwardRecord("inference", 0.0, 1.0, t) for t in rows]
    records.append(ForwardRecord("train", 0.0, 1.0, ("a",) * 9))
    stats = group_sizes(records, "inference")
    assert stats == {"forwards": 4.0, "mean_rows": 2.5, "p50_rows": 2.0, "p90_rows": 4.0, "max_rows": 4.0,
                     "multi_tenant_share": 0.5}
    assert group_sizes(records, "train")["mean_rows"] == 9.0
    assert group_sizes(records, "other") == {"forwards": 0.0}
