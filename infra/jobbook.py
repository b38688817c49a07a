"""The job book: every job's state, kept current by following the tenants' jobs, status and sessions
topics from the beginning.

The state and its fold live in ``schemas/jobstate.py``; this is the reader
that applies the log to them, so any process (a role, the tenant client, the
CLI) builds the same book and a restarted one rebuilds it from the log.
"""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord

from infra.follow import TopicFollower
from infra.settings import Settings
from infra.topics import tenant_stream_pattern, tenant_topic
from schemas import events as ev
from schemas.jobstate import JobState, fold

__all__ = ["JobBook"]


class JobBook:
    """Every job of every tenant, kept current from the log (``start`` / ``stop``)."""

    def __init__(self, settings: Settings, settle_s: float = 0.0):
        """``settle_s``: see ``infra.follow``; the roles' books settle, a client's follows at once."""
        self.settings = settings
        self.jobs: dict[tuple[str, str], JobState] = {}
        self.follower = TopicFollower(settings, tenant_stream_pattern(settings, "jobs|status|sessions"),
                                      self._apply, name="jobbook", settle_s=settle_s)

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
