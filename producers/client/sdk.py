"""The tenant's Python client: submit, follow, status, cancel, versions, and a policy to act with.

    async with Client(settings) as client:
        job = await client.submit({"kind": "rl", "tenant": "alice", "env": {}})
        state = await client.follow(job)          # until the job is terminal
        versions = client.versions("alice")
        policy = client.load_policy("alice", backbone=backbone)
        action = policy.act(images, "reach the red target", proprio)

Everything goes through the tenant's Kafka topics: a submission is a
``JobSubmitted`` event, a cancellation a ``JobCancelled``; status is the job
book, a fold over the tenant's status topic. Only ``load_policy`` reads the
policy store directly (checkpoints travel by reference).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from infra.jobbook import JobBook
from infra.logging import get_logger
from infra.settings import Settings
from infra.topics import TopicAdmin, tenant_topic
from producers.producer import EventProducer
from schemas import events as ev
from schemas.jobspec import JobSpec
from schemas.jobstate import JobState

__all__ = ["Client", "JobHandle"]

log = get_logger("producers.client")


class JobHandle(tuple):
    """(tenant, job_id) of a submitted job."""

    def __new__(cls, tenant: str, job_id: str):
        return super().__new__(cls, (tenant, job_id))

    @property
    def tenant(self) -> str:
        return self[0]

    @property
    def job_id(self) -> str:
        return self[1]


class Client:
    REBUILD_AFTER_S = 20.0

    def __init__(self, settings: Settings, requested_by: str = "sdk"):
        self.settings = settings
        self.requested_by = requested_by
        self.producer = EventProducer(settings, client_id="joynexus-client")
        self.book = JobBook(settings)

    async def __aenter__(self) -> Client:
        await self.producer.start()
        await self.book.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.book.stop()
        await self.producer.stop()

    async def submit(self, spec: JobSpec | dict[str, Any] | str) -> JobHandle:
        """Publish a JobSubmitted; raises JobSpecInvalid here already for a spec that cannot parse."""
        spec = JobSpec.parse(spec)
        if not self.settings.secure:
            # On a secure broker `joynexus tenant create` provisioned the topics, and a tenant's
            # credentials may not create or configure topics.
            async with TopicAdmin(self.settings) as admin:
                await admin.ensure_tenant(spec.tenant)
        await self.submit_raw(spec.tenant, spec.job_id, spec.kind.upper(), spec.to_json())
        return JobHandle(spec.tenant, spec.job_id)

    async def submit_raw(self, tenant: str, job_id: str, kind: str, spec_json: str) -> None:
        """Submit without client-side checks (the master validates; for tools and tests)."""
        event = ev.JobSubmitted(
            envelope=ev.Envelope(
                tenant_id=tenant, producer_id=f"client/{self.requested_by}", correlation_id=job_id
            ),
            job_id=job_id,
            kind=ev.JobKind(kind),
            spec_json=spec_json,
        )
        await self.producer.send(tenant_topic(self.settings, tenant, "jobs"), event, key=tenant)

    async def cancel(self, job: JobHandle, reason: str | None = None) -> None:
        await self.producer.send(
            tenant_topic(self.settings, job.tenant, "jobs"),
            ev.JobCancelled(
                envelope=ev.Envelope(
                    tenant_id=job.tenant, producer_id=f"client/{self.requested_by}", correlation_id=job.job_id
                ),
                job_id=job.job_id,
                requested_by=self.requested_by,
                reason=reason,
            ),
            key=job.tenant,
        )

    async def status(self, job: JobHandle) -> JobState | None:
        await self.book.sync(job.tenant)
        return self.book.get(job.tenant, job.job_id)

    async def jobs(self, tenant: str) -> list[JobState]:
        await self.book.sync(tenant)
        return self.book.of_tenant(tenant)

    async def follow(
        self,
        job: JobHandle,
        on_update: Callable[[JobState], None] | None = None,
        timeout_s: float | None = None,
        poll_s: float = 0.2,
    ) -> JobState:
        """Wait until the job is terminal, calling ``on_update`` whenever its state changed."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with contextlib.suppress(TimeoutError):  # a new tenant's topics: seen now, not at the next refresh
            await self.book.sync(job.tenant, timeout_s=10.0)
        seen = None
        unseen_since = time.monotonic()
        while True:
            state = self.book.get(job.tenant, job.job_id)
            if state is None and time.monotonic() - unseen_since > self.REBUILD_AFTER_S:
                await self._rebuild_book(job)
                unseen_since = time.monotonic()
            if state is not None:
                mark = (state.phase, state.step, len(state.history), state.updated_at)
                if mark != seen and on_update:
                    on_update(state)
                seen = mark
                if state.terminal:
                    return state
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"job {job.job_id} of {job.tenant} not finished in {timeout_s}s "
                    f"(phase {state.phase if state else 'unknown'})"
                )
            await asyncio.sleep(poll_s)

    async def _rebuild_book(self, job: JobHandle) -> None:
        # Seen twice in tests: a long-lived group-less pattern subscription never picked up one new
        # tenant's topics although the roles did. A fresh subscription does; until the cause is
        # found, a job the book has not seen for a while gets the book rebuilt from the log.
        log.warning("job not in the job book; rebuilding it", tenant=job.tenant, job=job.job_id)
        old, self.book = self.book, JobBook(self.settings)
        await old.stop()
        await self.book.start()

    def versions(self, tenant: str) -> list[Any]:
        """Metadata of the tenant's policy versions, oldest first."""
        from tenants.policy_store import PolicyStore

        return PolicyStore(self.settings.policy_dir).list(tenant)

    def load_policy(self, tenant: str, version: int | None = None, *, backbone: Any):
        """A read-only policy (backbone + the tenant's modules at ``version``, latest if None)."""
        from tenants.policy_store import PolicyStore
        from tenants.served import ServedPolicy

        slot = PolicyStore(self.settings.policy_dir).restore(tenant, version).mount(backbone.device)
        return ServedPolicy(backbone, slot)
