"""A PPO iteration as ONE gradient job (its rows once, its minibatches as row indices): backbone-train
turns it into the feature batches that one job per minibatch gives, byte for byte; its images travel
by reference when large; a schedule naming rows the job lacks is dead-lettered, not trained on."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest

from consumers.backbone_train import BackboneTrainRole
from consumers.bus.episodes import Episode
from consumers.convert import minibatch_targets
from consumers.rollout import SEQUENCE_STRIDE, iteration_job
from consumers.service import Service
from infra.settings import Settings
from infra.topics import TopicAdmin, tenant_topic
from producers.producer import EventProducer
from schemas import events as ev
from schemas.codec import Codec
from schemas.jobspec import JobSpec
from schemas.tensors import from_numpy, to_numpy
from tests.helpers import read_topic, running, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow]

EPISODES, STEPS = 3, 7  # 21 rows: minibatches of 8 leave a remainder of 5


@pytest.fixture
async def service(settings: Settings, backbones, tmp_path) -> Service:
    # a small inline limit sends the iteration's images by reference, as large ones go in the service
    local = settings.model_copy(update={"home": tmp_path, "backbone": "tiny",
                                        "tensor_inline_max_bytes": 4096})
    service = await Service.open(local, backbones["tiny"])
    yield service
    await service.close()


async def _provision(settings: Settings, *tenants: str) -> None:
    async with TopicAdmin(settings) as admin:
        await admin.ensure_shared()
        for tenant in tenants:
            await admin.ensure_tenant(tenant)


def _episodes(tenant: str) -> list[Episode]:
    rng = np.random.default_rng(7)
    episodes = []
    for e in range(EPISODES):
        records = []
        for step in range(STEPS):
            obs = ev.Observation(envelope=ev.Envelope(tenant_id=tenant), session_id="s", episode_id=f"s/{e}",
                                 step=step, instruction=("reach", "push")[e % 2],
                                 image=from_numpy(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)),
                                 proprio=from_numpy(rng.standard_normal(4).astype(np.float32)))
            records.append(ev.RolloutRecord(
                envelope=ev.Envelope(tenant_id=tenant), session_id="s", episode_id=obs.episode_id, step=step,
                reset_seed=e, observation=obs, action=from_numpy(rng.standard_normal(2).astype(np.float32)),
                reward=float(rng.random()), terminated=False, truncated=step == STEPS - 1, success=False,
                policy_version=1, log_prob=float(rng.standard_normal()), value=float(rng.standard_normal())))
        episodes.append(Episode(f"s/{e}", records))
    return episodes


def _iteration(tenant: str) -> ev.GradientJob:
    spec = JobSpec.parse(json.dumps({"kind": "rl", "tenant": tenant, "job_id": "j", "seed": 5, "env": {},
                                     "rl": {"iterations": 1, "minibatch_size": 8, "ppo_epochs": 3}}))
    return iteration_job(spec, 0, _episodes(tenant), "test")


def _per_minibatch(job: ev.GradientJob) -> list[ev.GradientJob]:
    """The same iteration as one job per minibatch (how the rollout sent it before 2026-12-02)."""
    images, proprio = to_numpy(job.images), to_numpy(job.proprio)
    jobs = []
    for j, rows in enumerate(np.asarray(r) for r in job.minibatches):
        last = j == len(job.minibatches) - 1
        jobs.append(job.model_copy(update={
            "batch_id": f"{job.batch_id}/mb{j}", "sequence": job.sequence + j,
            "instructions": tuple(job.instructions[i] for i in rows),
            "images": from_numpy(images[rows]), "proprio": from_numpy(proprio[rows]),
            "targets": minibatch_targets(job.targets, rows), "publish": last, "final": job.final and last,
            "minibatches": ()}))
    return jobs


async def _batches(service: Service, tenant: str) -> list[ev.FeatureBatch]:
    records = await read_topic(service.settings, tenant_topic(service.settings, tenant, "features"))
    return [r.event for r in records if isinstance(r.event, ev.FeatureBatch)]


async def _features(service: Service, tenant: str, n: int) -> list[ev.FeatureBatch]:
    async def enough() -> bool:
        return len(await _batches(service, tenant)) >= n

    await wait_for(enough, timeout_s=120, what=f"{n} feature batches of {tenant}")
    return await _batches(service, tenant)


def _bytes(service: Service, tensors: dict[str, ev.Tensor]) -> dict[str, tuple]:
    resolved = {name: service.tensors.resolve(t) for name, t in tensors.items()}
    return {name: (t.dtype, tuple(t.shape), t.data) for name, t in resolved.items()}


async def test_an_iteration_job_gives_the_feature_batches_of_one_job_per_minibatch(
        service: Service, unique: str) -> None:
    settings = service.settings
    whole, split = f"it-{unique}", f"mb-{unique}"
    await _provision(settings, whole, split)
    iteration = _iteration(whole)
    assert len(iteration.minibatches) == 9 and sorted(len(m) for m in iteration.minibatches)[:3] == [5, 5, 5]
    sent = iteration.model_copy(update={"images": service.tensors.offload(iteration.images)})
    assert sent.images.ref is not None and sent.images.data == b""  # by reference, as the rollout sends it
    minibatches = _per_minibatch(_iteration(split))
    async with EventProducer(settings, Codec()) as producer:
        await producer.send(tenant_topic(settings, whole, "gradient-jobs"), sent, key=whole)
        for job in minibatches:
            await producer.send(tenant_topic(settings, split, "gradient-jobs"), job, key=split)
    role = BackboneTrainRole(service)
    async with running(role):
        got, want = await _features(service, whole, 9), await _features(service, split, 9)
    assert len(got) == len(want) == 9
    assert role.rows_requested == 21 + 3 * 21  # the iteration's rows once; per minibatch, every epoch
    for g, w in zip(got, want, strict=True):
        assert (g.batch_id, g.sequence, g.publish, g.final) == (w.batch_id, w.sequence, w.publish, w.final)
        assert g.metrics == w.metrics and g.policy_version == w.policy_version
        assert _bytes(service, g.targets) == _bytes(service, w.targets), g.batch_id
        assert _bytes(service, g.features) == _bytes(service, w.features), g.batch_id
    assert [g.sequence for g in got] == list(range(9)) and got[-1].publish and got[-1].final
    assert not any(g.publish for g in got[:-1])
    assert iteration.sequence == 0 * SEQUENCE_STRIDE


async def test_a_schedule_naming_rows_the_job_lacks_is_dead_lettered(service: Service, unique: str) -> None:
    settings = service.settings
    tenant = f"bad-{unique}"
    await _provision(settings, tenant)
    bad = _iteration(tenant).model_copy(update={"minibatches": ((0, 1), (2, 21))})  # row 21 of 21
    async with EventProducer(settings, Codec()) as producer:
        await producer.send(tenant_topic(settings, tenant, "gradient-jobs"), bad, key=tenant)
    role = BackboneTrainRole(service)
    async with running(role):
        await wait_for(lambda: role.committed >= 1, timeout_s=120, what="the bad job's transaction")
    source = tenant_topic(settings, tenant, "gradient-jobs").encode()
    letters = await read_topic(settings, settings.dlq_topic)
    dead = [r for r in letters if dict(r.headers).get("dlq.source.topic") == source]
    assert len(dead) == 1
    reason = dict(dead[0].headers)["dlq.error.message"].decode()
    assert "minibatch 1" in reason and "[0, 21)" in reason, reason
    assert await _batches(service, tenant) == []  # nothing trained on half a job


async def test_a_job_whose_rows_are_all_cached_does_not_wait_for_another_tenants_forward(
        service: Service, unique: str) -> None:
    """An RL iteration whose rows inference already forwarded is published while the device is
    held, though an SFT-like job that needs a forward came in the same poll; that job follows when
    the device frees up, and the cached job's features are the bytes a forward gives."""
    settings = service.settings
    rl, sft = f"rl-{unique}", f"sft-{unique}"
    await _provision(settings, rl, sft)
    first = _iteration(rl)
    again = first.model_copy(update={"batch_id": f"{first.batch_id}-again", "sequence": SEQUENCE_STRIDE})
    async with EventProducer(settings, Codec()) as producer:
        await producer.send(tenant_topic(settings, rl, "gradient-jobs"), first, key=rl)
    role = BackboneTrainRole(service)
    async with running(role):  # forwards the rl tenant's rows once: the feature cache has them now
        forwarded = await _features(service, rl, 9)
    async with EventProducer(settings, Codec()) as producer:  # both waiting before the next poll
        await producer.send(tenant_topic(settings, rl, "gradient-jobs"), again, key=rl)
        await producer.send(tenant_topic(settings, sft, "gradient-jobs"), _iteration(sft), key=sft)
    role = BackboneTrainRole(service)
    async with contextlib.AsyncExitStack() as device:
        await device.enter_async_context(service.gate.use("inference", rows=1))  # no forward can start
        async with running(role):
            try:
                cached = (await _features(service, rl, 18))[9:]
                assert await _batches(service, sft) == []  # its forward waits for the device
                assert {b.group_size for b in cached} == {2}  # polled together with the sft job
            finally:
                await device.aclose()  # the device is free: the sft job's forward runs
            assert len(await _features(service, sft, 9)) == 9
    assert role.hits == 21  # the second rl iteration's rows; the sft tenant's are its own (scope)
    for c, f in zip(cached, forwarded, strict=True):
        assert _bytes(service, c.features) == _bytes(service, f.features), c.batch_id
