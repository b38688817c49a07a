"""The demo's live table: one row per tenant, redrawn as its jobs' states change.

A row follows its tenant through the run: the training job (phase, step of
total, the latest return / success / loss of its progress events, the policy
version it published), then each evaluation (``eval v<N>``, episodes done,
the evaluated success rate). The board only reads ``JobState``s handed to it by
``Client.follow`` callbacks; it never talks to Kafka, so it renders the same
whether the states come from a live run or a replay.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rich.progress_bar import ProgressBar
from rich.table import Table

from schemas.jobstate import JobState

__all__ = ["DemoBoard"]


@dataclass
class _Row:
    tenant: str
    kind: str
    task: str
    phase: str = "waiting"
    step: int = 0
    total: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    version: int | None = None
    eval_success: dict[int, float] = field(default_factory=dict)  # evaluated version -> success rate
    evaluating: set[int] = field(default_factory=set)  # versions whose evaluation runs now


def _phase(job: str, state: JobState) -> str:
    return job if state.phase == "accepted" else f"{job} {state.phase}"


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


class DemoBoard:
    def __init__(self, specs: list[dict[str, Any]]):
        self.rows = {s["tenant"]: _Row(s["tenant"], s["kind"], s.get("env", {}).get("env_id", "dataset"))
                     for s in specs}

    def train(self, state: JobState) -> None:
        row = self.rows[state.tenant]
        row.phase = _phase("train", state)
        row.step, row.total = state.step, state.total_steps
        row.metrics.update(state.metrics)
        row.version = state.policy_version or row.version

    def evaluate(self, state: JobState, version: int) -> None:
        row = self.rows[state.tenant]
        if not state.terminal:
            row.evaluating.add(version)
            row.phase = _phase(f"eval v{version}", state)
            row.step, row.total = state.step, state.total_steps
            return
        row.evaluating.discard(version)
        if state.phase == "completed" and "success_rate" in state.metrics:
            row.eval_success[version] = state.metrics["success_rate"]
        if state.phase != "completed":
            row.phase = _phase(f"eval v{version}", state)
        elif not row.evaluating:
            row.phase, row.step, row.total = "done", 0, None

    def snapshot(self) -> list[dict[str, Any]]:
        """Where every tenant is, as plain data (``partial.json`` of an interrupted demo)."""
        return [{**asdict(row), "evaluating": sorted(row.evaluating)} for row in self.rows.values()]

    def __rich__(self) -> Table:
        table = Table("tenant", "kind", "task", "phase", "progress", "", "return", "success (train)",
                      "loss", "version", "eval success", title="joynexus demo", title_justify="left")
        for row in self.rows.values():
            done = f"{row.step}/{row.total}" if row.total else str(row.step or "")
            evals = " -> ".join(f"v{v}: {s:.2f}" for v, s in sorted(row.eval_success.items())) or "-"
            table.add_row(
                row.tenant,
                row.kind,
                row.task,
                row.phase,
                ProgressBar(total=float(row.total or 1), completed=float(row.step if row.total else 0),
                            width=20),
                done,
                _num(row.metrics.get("mean_return"), 2),
                _num(row.metrics.get("success_rate"), 2),
                _num(row.metrics.get("train_loss"), 4),
                "-" if row.version is None else str(row.version),
                evals,
            )
        return table
