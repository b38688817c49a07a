"""A job's state as a fold over its events: the job model every role, the client and the CLI share.

``JobState`` is what ``joynexus status`` shows and what roles consult before
spending work on a job (is it cancelled? which sessions are open?). ``fold``
is a pure function of (state, event): the same events in the same order give
the same state, in any process (``infra/jobbook.py`` keeps one current from
the log).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from schemas import events as ev
from schemas.jobspec import JobSpec

__all__ = ["TERMINAL", "JobState", "fold"]

TERMINAL = frozenset({"rejected", "completed", "failed", "cancelled"})


@dataclass
class JobState:
    tenant: str
    job_id: str
    kind: str = "UNKNOWN"
    spec_json: str = "{}"
    phase: str = "submitted"  # submitted, accepted, then one of TERMINAL
    submitted_at: datetime | None = None
    updated_at: datetime | None = None
    step: int = 0
    total_steps: int | None = None
    policy_version: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # the latest progress
    history: list[dict[str, float]] = field(default_factory=list)  # every progress, in order
    reason: str | None = None  # why it was rejected, failed or cancelled
    resources: dict[str, str] = field(default_factory=dict)
    sessions: dict[str, str] = field(default_factory=dict)  # session id -> SessionStatus value
    cancel_requested: bool = False
    _parsed: tuple[str, JobSpec] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def spec(self) -> JobSpec:
        """``spec_json`` parsed, once per text: the rollout role and the evaluator read every
        running job's spec after every poll, and YAML parsing was half the rollout role's CPU."""
        if self._parsed is None or self._parsed[0] != self.spec_json:
            self._parsed = (self.spec_json, JobSpec.parse(self.spec_json))
        return self._parsed[1]

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL

    @property
    def open_sessions(self) -> list[str]:
        return [sid for sid, status in self.sessions.items() if status in ("REQUESTED", "RUNNING")]


def _terminal(state: JobState, phase: str, reason: str | None) -> None:
    if not state.terminal:  # the first terminal event wins; later ones are late echoes
        state.phase, state.reason = phase, reason


def fold(state: JobState, event: ev.Event) -> JobState:
    """Apply one event to a job's state (mutates and returns it)."""
    state.updated_at = event.envelope.occurred_at
    match event:
        case ev.JobSubmitted():
            state.kind, state.spec_json = event.kind.value, event.spec_json
            state.submitted_at = state.submitted_at or event.envelope.occurred_at
        case ev.JobAccepted():
            if state.phase == "submitted":
                state.phase = "accepted"
            state.kind, state.resources = event.kind.value, dict(event.resources)
        case ev.JobRejected():
            _terminal(state, "rejected", event.reason)
        case ev.JobProgress():
            state.step, state.total_steps = event.step, event.total_steps
            if event.policy_version is not None:
                state.policy_version = event.policy_version
            state.metrics = {**state.metrics, **event.metrics}
            state.history.append({"step": float(event.step), **event.metrics})
        case ev.JobCompleted():
            state.metrics = {**state.metrics, **event.metrics}
            if event.final_policy_version is not None:
                state.policy_version = event.final_policy_version
            _terminal(state, "completed", None)
        case ev.JobFailed():
            _terminal(state, "failed", f"{event.stage}: {event.error_class}: {event.reason}")
        case ev.JobCancelled():
            state.cancel_requested = True
            if event.envelope.producer_id.startswith("master"):  # the master's confirmation
                _terminal(state, "cancelled", event.reason or f"cancelled by {event.requested_by}")
        case ev.EnvSessionRequested():
            state.sessions.setdefault(event.session_id, "REQUESTED")
        case ev.EnvSessionProgress():
            # a closed or failed session stays so: a progress commit may land after the close
            if state.sessions.get(event.session_id) not in ("CLOSED", "FAILED"):
                state.sessions[event.session_id] = event.status.value
        case ev.EnvSessionClosed():
            if state.sessions.get(event.session_id) in (None, "REQUESTED", "RUNNING"):
                state.sessions[event.session_id] = "CLOSED"
    return state
