"""Policy lineage and policies that cannot run, end to end against the real broker (the whole
service in this process, the tiny backbone).

Promised: every checkpoint records the backbone its modules were trained against; a job that would
run a lineage of another backbone is rejected with a field error before anything starts; a policy
that fails in inference fails its job with the reason within seconds (the env no longer asks
forever and ``follow`` returns), and its sessions are closed."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from schemas import events as ev
from tenants.config import HeadConfig, TenantConfig
from tenants.policy_store import MODEL_FILE
from tenants.slot import TenantSlot
from tests.helpers import wait_for
from tests.service_helpers import SMALL_ENV, SMALL_RL, Stack, running_stack

pytestmark = [pytest.mark.broker, pytest.mark.slow]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(settings, model_root, tmp_path_factory) -> AsyncIterator[Stack]:
    async with running_stack(settings, model_root, tmp_path_factory.mktemp("lineage-home")) as s:
        yield s


def eval_spec(tenant: str, job_id: str, version: int) -> dict:
    return {"kind": "eval", "tenant": tenant, "job_id": job_id, "env": SMALL_ENV,
            "eval": {"policy_version": version, "episodes": 2}}


def foreign_version(stack: Stack, tenant: str, *, backbone_id: str | None, hidden: int) -> int:
    """A checkpoint as another service would have written it (another backbone, or no lineage
    record at all, as before checkpoints had one)."""
    config = TenantConfig(tenant_id=tenant, hidden_size=hidden,
                          head=HeadConfig(kind="gaussian_actor_critic", action_dim=2, proprio_dim=4))
    slot = TenantSlot(config)
    slot.version = stack.store.latest_version(tenant) or 0
    return stack.store.save(slot, source_offsets={}, backbone_id=backbone_id).meta.version


# ---------------------------------------------------------------------------------------------- 1
async def test_checkpoints_record_their_backbone_and_foreign_lineages_are_rejected(
        stack: Stack, unique: str) -> None:
    here = stack.service.backbone
    tenant = f"lin-{unique}"
    done = await stack.run(stack.rl_spec(tenant, "trained-here"))
    assert done.policy_version == 3
    # the master's initial version starts the lineage; the optimizer's versions inherit it
    assert [m.backbone_id for m in stack.store.list(tenant)] == [here.backbone_id] * 3

    other = f"small@{'0' * 12}"
    foreign = foreign_version(stack, tenant, backbone_id=other, hidden=here.hidden_size)
    assert stack.store.meta(tenant, foreign).backbone_id == other
    await stack.ensure_tenant(f"old-{unique}")
    legacy = foreign_version(stack, f"old-{unique}", backbone_id=None, hidden=here.hidden_size * 2)

    cases = [
        (tenant, eval_spec(tenant, "eval-foreign", foreign), "eval.policy_version", other),
        (tenant, stack.rl_spec(tenant, "continue-foreign", init_version=foreign), "init_version", other),
        (f"old-{unique}", eval_spec(f"old-{unique}", "eval-legacy", legacy), "eval.policy_version",
         f"{here.hidden_size * 2}-wide"),
    ]
    versions_before = {t: stack.store.versions(t) for t in (tenant, f"old-{unique}")}
    for who, spec, loc, words in cases:
        rejected = await stack.run(spec, expect="rejected")
        events = [e for e in await stack.events(who, "status")
                  if getattr(e, "job_id", None) == spec["job_id"]]
        assert [type(e) for e in events] == [ev.JobRejected], events
        (error,) = events[0].errors
        assert error.loc == loc and words in error.message and here.backbone_id in error.message, error
        assert words in rejected.reason
    assert {t: stack.store.versions(t) for t in versions_before} == versions_before  # nothing added

    # the lineage of this backbone still runs
    assert (await stack.run(eval_spec(tenant, "eval-here", 3))).phase == "completed"


# ---------------------------------------------------------------------------------------------- 2
async def test_a_policy_that_fails_in_inference_fails_its_job_within_seconds(
        stack: Stack, unique: str) -> None:
    tenant = f"broken-{unique}"
    await stack.run(stack.rl_spec(tenant, "train", rl={**SMALL_RL, "iterations": 1}))
    version = stack.store.latest_version(tenant)
    # The version's weights become unreadable after the master's checks (which read metadata only)
    # would pass: every load in inference fails, as a policy that cannot run does.
    model = stack.store.root / tenant / f"v{version:08d}" / MODEL_FILE
    model.write_bytes(b"\0" * len(model.read_bytes()))

    started = time.monotonic()
    job = await stack.client.submit(eval_spec(tenant, "eval-broken", version))
    state = await stack.client.follow(job, timeout_s=60)  # before: accepted forever
    took = time.monotonic() - started
    print(f"submit -> failed in {took:.1f} s")
    assert state.phase == "failed", (state.phase, state.reason)
    assert state.reason.startswith("inference: CheckpointCorrupt"), state.reason
    assert f"policy version {version} cannot run" in state.reason and MODEL_FILE in state.reason

    failed = [e for e in await stack.events(tenant, "status")
              if isinstance(e, ev.JobFailed) and e.job_id == job.job_id]
    assert len(failed) == 1 and failed[0].stage == "inference", failed
    await wait_for(lambda: not stack.client.book.get(*job).open_sessions, 30, "the sessions to close")
    closed = [e for e in await stack.events(tenant, "sessions")
              if isinstance(e, ev.EnvSessionClosed) and e.job_id == job.job_id]
    assert closed and all(e.reason == "failed" for e in closed), closed
