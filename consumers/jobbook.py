"""The job book: every job's state as a fold over the tenants' jobs, status and sessions topics.

``JobState`` is what ``joynexus status`` shows and what roles consult before
spending work on a job (is it cancelled? which sessions are open?). ``fold``
is a pure function of (state, event); ``JobBook`` keeps it current by
following the topics from the beginning, so any process can build the same
book and a restarted one rebuilds it from the log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from aiokafka.structs import ConsumerRecord

from consumers.follow import TopicFollower
from infra.settings import Settings
from infra.topics import tenant_stream_pattern, tenant_topic
from schemas import events as ev

__all__ = ["TERMINAL", "JobBook", "JobState", "fold"]

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


class JobBook:
    """Every job of every tenant, kept current from the log (``start`` / ``stop``)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.jobs: dict[tuple[str, str], JobState] = {}
        self.follower = TopicFollower(settings, tenant_stream_pattern(settings, "jobs|status|sessions"),
                                      self._apply, name="jobbook")

    async def start(self) -> None:
        await self.follower.start()

    async def stop(self) -> None:
        await self.follower.stop()

    async def __aenter__(self) -> JobBook:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _apply(self, event: ev.Event, record: ConsumerRecord) -> None:
        job_id = getattr(event, "job_id", None)
        tenant = event.tenant_id
        if job_id is None or tenant is None:
            return
        state = self.jobs.get((tenant, job_id)) or JobState(tenant, job_id)
        self.jobs[(tenant, job_id)] = fold(state, event)

    def get(self, tenant: str, job_id: str) -> JobState | None:
        return self.jobs.get((tenant, job_id))

    def find(self, job_id: str) -> JobState | None:
        """A job by id alone (job ids are unique in practice; the newest match wins)."""
        matches = [s for (_, j), s in self.jobs.items() if j == job_id]
        return max(matches, key=lambda s: s.updated_at or datetime.min) if matches else None

    def stopped(self, tenant: str, job_id: str) -> bool:
        """True once the job is terminal or a cancel was asked for: stop spending work on it."""
        state = self.get(tenant, job_id)
        return state is not None and (state.terminal or state.cancel_requested)

    def job_of_session(self, tenant: str, session_id: str) -> JobState | None:
        """The job a session serves (None until the book has read the session's request)."""
        return next((s for s in self.of_tenant(tenant) if session_id in s.sessions), None)

    def of_tenant(self, tenant: str) -> list[JobState]:
        return [s for (t, _), s in self.jobs.items() if t == tenant]

    async def sync(self, tenant: str, timeout_s: float = 30.0) -> None:
        """Wait until everything already written to the tenant's topics is in the book."""
        await self.follower.caught_up([tenant_topic(self.settings, tenant, s)
                                       for s in ("jobs", "status", "sessions")], timeout_s)
