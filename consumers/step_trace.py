"""The step trace: where one RL/eval step's time goes between an env's observation and its action.

Off by default (``settings.step_trace``, ``JOYNEXUS_STEP_TRACE=true``). When on, the inference role
marks each observation it answers at five points and appends one JSON line per answered step to
``<timeline_dir>/<instance>.steps.jsonl`` (every few seconds, beside the forward timeline)::

    {"tenant": "alice", "session": "s-1", "episode": "s-1/0", "step": 7,
     "t": [created, read, submitted, feature, acted, acked]}

The marks are Unix seconds: ``created`` is the observation's ``occurred_at`` (set by the env, in
milliseconds: the first stage is only as fine as that), the others are the device host's clock.
Consecutive marks give the stages (``STAGES``):

- ``bus_in``: created -> read: the env's produce, the broker, the fetch, the task starting;
- ``lookup``: read -> submitted: decoding, the session and the policy found;
- ``device``: submitted -> feature: preparation, waiting for the group and the device, the forward;
- ``head``: feature -> acted: the tenant's own head on its rows;
- ``ack``: acted -> acked: the action produced until the broker acknowledged it (the env may
  already have it: this is the device host's interpreter busy with the send).

Repeated asks (an env that waited too long) and failed steps are not traced. A torn last line (a
process killed mid-write) is skipped on reading. Pure bookkeeping: no Kafka, no torch.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from infra.jsonl import append_lines, read_rows

__all__ = ["MARKS", "STAGES", "STEPS_SUFFIX", "StepRecord", "StepTrace", "read_steps", "stage_summary"]

STEPS_SUFFIX = ".steps.jsonl"
MARKS = ("created", "read", "submitted", "feature", "acted", "acked")
STAGES = ("bus_in", "lookup", "device", "head", "ack")


@dataclass(frozen=True, slots=True)
class StepRecord:
    tenant: str
    session: str
    episode: str
    step: int
    t: tuple[float, ...]  # one Unix time per name in MARKS

    def stages_ms(self) -> dict[str, float]:
        """Each stage's milliseconds, and ``total`` (created -> acked)."""
        out = {name: 1000 * (b - a) for name, a, b in zip(STAGES, self.t[:-1], self.t[1:], strict=True)}
        out["total"] = 1000 * (self.t[-1] - self.t[0])
        return out


class StepTrace:
    """The steps answered since the last ``export``, kept in memory between exports."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def add(self, tenant: str, session: str, episode: str, step: int, marks: list[float]) -> None:
        if len(marks) != len(MARKS):
            raise ValueError(f"a step has {len(MARKS)} marks ({', '.join(MARKS)}), got {len(marks)}")
        self._lines.append(json.dumps({"tenant": tenant, "session": session, "episode": episode, "step": step,
                                       "t": [round(m, 6) for m in marks]}, separators=(",", ":")))

    def export(self, path: Path, max_bytes: int = 64 * 2**20) -> int:
        """Appends the steps added since the last export to ``path``; returns how many. A file above
        ``max_bytes`` is moved to ``<name>.1`` first (the one before is dropped)."""
        lines, self._lines = self._lines, []
        return append_lines(path, lines, max_bytes)


def read_steps(directory: Path, since_unix: float, until_unix: float | None = None) -> list[StepRecord]:
    """The traced steps of every instance in ``directory`` whose observation was created in
    [since, until], in creation order."""
    out = []
    for row in read_rows(directory, STEPS_SUFFIX):
        try:
            record = StepRecord(row["tenant"], row["session"], row["episode"], int(row["step"]),
                                tuple(float(x) for x in row["t"]))
        except (ValueError, TypeError, KeyError):
            continue
        if len(record.t) == len(MARKS) and record.t[0] >= since_unix and (
                until_unix is None or record.t[0] <= until_unix):
            out.append(record)
    return sorted(out, key=lambda r: r.t[0])


def stage_summary(records: Iterable[StepRecord]) -> dict[str, dict[str, float]]:
    """Per stage (and ``total``): mean and median milliseconds over ``records``, and their count."""
    by_stage: dict[str, list[float]] = {name: [] for name in (*STAGES, "total")}
    for record in records:
        for name, ms in record.stages_ms().items():
            by_stage[name].append(ms)
    return {name: {"steps": float(len(values)), "mean_ms": statistics.fmean(values),
                   "p50_ms": statistics.median(values)}
            for name, values in by_stage.items() if values}
