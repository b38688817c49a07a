"""The whole service end to end, in one process against the real broker: every role under ONE
Supervisor (role consumer groups have fixed names, so one per module), tenants submitting through
the SDK client. What a tenant is promised: a bad spec is rejected field by field and costs nobody
anything; a cancel stops a job without touching its neighbours; training improves the policy;
sharing the service with other tenants changes nothing in a tenant's result, bit for bit;
evaluation reads the policy store and never writes it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition

from infra.connection import client_options
from infra.topics import tenant_topic
from producers.client.sdk import JobHandle
from producers.dataset.generate import generate_dataset
from producers.producer import EventProducer
from schemas import events as ev
from schemas.jobstate import JobState
from schemas.tensors import from_numpy, to_numpy
from tests.helpers import read_topic, wait_for
from tests.service_helpers import (
    SMALL_ENV,
    Stack,
    assert_same_state,
    held_out,
    iteration_returns,
    running_stack,
    tree_digest,
)

pytestmark = [pytest.mark.broker, pytest.mark.slow]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(settings, model_root, tmp_path_factory) -> AsyncIterator[Stack]:
    """Every role in this process (one RoleHost for the module), the tiny backbone, a fresh store."""
    async with running_stack(settings, model_root, tmp_path_factory.mktemp("service-home")) as s:
        yield s


@pytest.fixture(scope="module")
def reach_demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Scripted-expert demonstrations of the built-in Reach task, at the env's image size."""
    path = tmp_path_factory.mktemp("demos") / "reach"
    generate_dataset("joynexus/Reach-v0", path, episodes=8, seed=11, image_size=32, max_episode_steps=20,
                     progress=False)
    return path


def sft_spec(tenant: str, job_id: str, demos: Path, **sft) -> dict:
    return {"kind": "sft", "tenant": tenant, "job_id": job_id, "dataset": {"path": str(demos)},
            "sft": {"epochs": 2, "batch_size": 16, "publish_every": 4, **sft}}


# ---------------------------------------------------------------------------------------------- 1
async def test_invalid_spec_is_rejected_with_field_errors_and_disturbs_nobody(
        stack: Stack, unique: str) -> None:
    bad_tenant, good_tenant = f"bad-{unique}", f"good-{unique}"
    await stack.ensure_tenant(bad_tenant)
    bad = JobHandle(bad_tenant, f"job-bad-{unique}")
    spec = stack.rl_spec(bad_tenant, bad.job_id)
    spec["rl"] = {**spec["rl"], "minibatch_size": -1, "minibach": 3}  # a bad value and a typo
    await stack.client.submit_raw(bad_tenant, bad.job_id, "RL", json.dumps(spec))
    good = await stack.client.submit(stack.rl_spec(good_tenant, f"job-good-{unique}"))

    rejected = await stack.follow(bad, expect="rejected")
    assert "rl.minibatch_size" in rejected.reason and "rl.minibach" in rejected.reason, rejected.reason
    events = [e for e in await stack.events(bad_tenant, "status") if getattr(e, "job_id", None) == bad.job_id]
    assert [type(e) for e in events] == [ev.JobRejected], events  # the rejection and nothing else
    assert {f.loc for f in events[0].errors} == {"rl.minibatch_size", "rl.minibach"}, events[0].errors
    assert all(f.message for f in events[0].errors)
    assert stack.store.versions(bad_tenant) == []  # no initial checkpoint...
    assert await stack.events(bad_tenant, "sessions") == []  # ...no env session

    done = await stack.follow(good)
    assert done.policy_version == 3  # the initial version + one per iteration
    assert stack.store.versions(good_tenant) == [1, 2, 3]
    assert sorted(iteration_returns(done)) == [0, 1]


# ---------------------------------------------------------------------------------------------- 2
async def test_cancel_stops_a_job_and_others_finish(stack: Stack, unique: str) -> None:
    doomed_t, other_t = f"cancel-{unique}", f"keep-{unique}"
    # big enough that the cancel lands while iteration 0 is still being collected
    doomed = await stack.client.submit(stack.rl_spec(
        doomed_t, f"job-cancel-{unique}", env={"max_episode_steps": 20},
        rl={"iterations": 4, "episodes_per_iteration": 8, "minibatch_size": 32, "ppo_epochs": 1}))
    other = await stack.client.submit(stack.rl_spec(other_t, f"job-keep-{unique}"))
    book = stack.client.book

    await wait_for(lambda: (s := book.get(*doomed)) is not None and s.phase != "submitted", 120,
                   "the job to be accepted")
    accepted = book.get(*doomed)
    assert accepted.phase == "accepted", accepted.reason
    (first,) = accepted.resources["sessions"].split(",")  # sync RL: iteration 0's session
    await stack.client.cancel(doomed, reason="changed my mind")

    cancelled = await stack.follow(doomed, expect="cancelled")
    assert "changed my mind" in cancelled.reason
    await wait_for(lambda: not book.get(*doomed).open_sessions, 60, "the job's sessions to close")
    closed = [e for e in await stack.events(doomed_t, "sessions") if isinstance(e, ev.EnvSessionClosed)]
    assert [e.session_id for e in closed] == [first], closed  # the running iteration, closed once
    assert closed[0].reason == "cancelled"
    settled = stack.store.versions(doomed_t)

    done = await stack.follow(other)
    assert done.policy_version == 3 and stack.store.versions(other_t) == [1, 2, 3]
    # the cancelled job never got further: no new version, no next iteration, no completion
    assert stack.store.versions(doomed_t) == settled and len(settled) < 5, settled
    final = book.get(*doomed)
    assert final.phase == "cancelled" and not final.open_sessions, final
    assert not [s for s in final.sessions if s != first], final.sessions
    status = [type(e) for e in await stack.events(doomed_t, "status")
              if getattr(e, "job_id", None) == doomed.job_id]
    assert ev.JobCompleted not in status and ev.JobFailed not in status, status


# ---------------------------------------------------------------------------------------------- 3
# Learning a user can see: SUCCESS on held-out episodes (the same for every version, the policy acting
# deterministically), not only return. Reach with the progress + success reward (envs/builtin.py),
# tiny backbone, 30-step episodes, 10 PPO epochs, gamma 0.95: 20 iterations of 16 episodes, as the
# demo plays them. The run is one reproducible draw PER KIND OF CPU, not across them (MKL and torch pick
# kernels by CPU): 8 episodes an iteration gave held-out success 0.58 where this test was tuned (an
# earlier VM of this workplace), passed CI at 3c67717 on an AMD EPYC VM, and gave 0.21 on the Intel
# Xeon VM of 2026-12-04 (3c67717 and later alike), failing the threshold there. With 16
# (benchmarks/ppo_tuning.py, the bus-free replica, which reproduced the service's 0.21 to the digit),
# on that Xeon: success 0.92 / 0.71 / 0.71 for seeds 0 / 1 / 2 (8 episodes: 0.21 / - / -; 30 iterations
# of 8: 0.38 / 0.29 / 0.58). THRESHOLD (RL): final success >= first + 0.3, and the held-out return
# rises. SFT (8 expert demos, rgb only: the goal must come from image + instruction): the loss of the
# last publish window is below the first one's, and the trained policy's actions are closer to the
# expert's on held-out demonstrations than the untrained policy's (measured here: mean L1 0.859 ->
# 0.737). Its held-out Reach return did NOT beat the untrained policy's (-4.78 vs -3.12 after 6 epochs
# over 8 demos), so that is not asserted.
RL_ENV = {"max_episode_steps": 30}
RL_LEARNS = {"iterations": 20, "episodes_per_iteration": 16, "minibatch_size": 64, "ppo_epochs": 10,
             "gamma": 0.95, "envs": 8}
RL_SEED = 0
HELD_OUT = 24  # episodes
RL_SUCCESS_MARGIN = 0.3


async def test_rl_success_and_sft_policy_improve(stack: Stack, unique: str, reach_demos: Path,
                                                 tmp_path: Path) -> None:
    # A fixed seed: sampled actions depend on the spec's seed alone, so the run is one reproducible draw.
    rl = await stack.client.submit(stack.rl_spec(f"rl-up-{unique}", "job-rl-learns", seed=RL_SEED,
                                                 env=RL_ENV, rl=RL_LEARNS, optim={"lr": 3e-3}))
    sft = await stack.client.submit(sft_spec(f"sft-up-{unique}", f"job-sft-up-{unique}", reach_demos,
                                             epochs=6))

    sft_state = await stack.follow(sft)
    losses = [h["train_loss"] for h in sft_state.history if "train_loss" in h]
    assert len(losses) >= 3, sft_state.history
    assert losses[-1] < losses[0], losses
    held_out_demos = tmp_path / "held-out-demos"
    await asyncio.to_thread(generate_dataset, "joynexus/Reach-v0", held_out_demos, episodes=4, seed=99,
                            image_size=32, max_episode_steps=20, progress=False)
    sft_scores = {}
    for version in (1, sft_state.policy_version):
        policy = stack.client.load_policy(sft.tenant, version, backbone=stack.service.backbone)
        sft_scores[version] = await asyncio.to_thread(action_error, policy, held_out_demos)

    state = await stack.client.follow(rl, timeout_s=900)
    assert state.phase == "completed", (state.phase, state.reason)
    returns = iteration_returns(state)
    assert sorted(returns) == list(range(RL_LEARNS["iterations"])), returns
    first, last = 1, state.policy_version
    assert last == first + RL_LEARNS["iterations"]
    scores = {}
    for version in (first, last):
        policy = stack.client.load_policy(rl.tenant, version, backbone=stack.service.backbone)
        scores[version] = await asyncio.to_thread(held_out, policy, episodes=HELD_OUT,
                                                  max_steps=RL_ENV["max_episode_steps"])
    sampled = [round(r, 2) for r in returns.values()]
    print(f"RL held-out (return, success) {scores}; sampled returns {sampled}; "
          f"SFT held-out {sft_scores}; SFT losses {[round(x, 4) for x in losses]}")
    (ret0, success0), (ret1, success1) = scores[first], scores[last]
    assert success1 >= success0 + RL_SUCCESS_MARGIN, scores
    assert ret1 > ret0, scores
    assert sft_scores[sft_state.policy_version] < sft_scores[1], sft_scores


def action_error(policy, demos: Path) -> float:
    """Mean L1 distance between the policy's actions and the expert's on held-out demonstrations."""
    from producers.dataset.format import Dataset

    dataset, errors = Dataset(demos), []
    for k in range(dataset.num_episodes):
        episode = dataset.episode(k)
        for t in range(len(episode.actions)):
            action = policy.act(list(episode.images[t]), episode.instruction, episode.proprio[t]).reshape(-1)
            errors.append(float(np.abs(action - episode.actions[t].reshape(-1)).mean()))
    return float(np.mean(errors))


# ---------------------------------------------------------------------------------------------- 4
async def test_grouped_run_equals_run_alone(stack: Stack, unique: str, reach_demos: Path) -> None:
    """The "no chaos" claim: a job's checkpoints are a function of its spec alone (the tenant aside),
    whoever shares the backbone's forwards with it. The same spec (under another job id: ids must not
    matter either) runs for tenant A alone, then for tenant B next to another RL tenant and an SFT
    tenant."""
    rl = {"iterations": 2, "episodes_per_iteration": 3, "minibatch_size": 16, "ppo_epochs": 2}
    env = {"max_episode_steps": 15}
    alone_t, grouped_t = f"alone-{unique}", f"grouped-{unique}"
    job_id = f"job-same-{unique}"
    alone = await stack.run(stack.rl_spec(alone_t, job_id, seed=7, env=env, rl=rl))

    # Backbone-train holds the three tenants' gradient jobs until the grouped tenant's first ones and
    # the SFT peer's are both queued, so its first poll mixes tenants for sure: how fast each role
    # runs must not decide whether this test proves anything (it proved nothing 1 run in 2 once the
    # rollout role got faster).
    peers = (f"peer-{unique}", f"sft-peer-{unique}")
    held = [TopicPartition(tenant_topic(stack.settings, t, "gradient-jobs"), 0) for t in (grouped_t, *peers)]
    for tenant in (grouped_t, *peers):
        await stack.ensure_tenant(tenant)
    train = stack.supervisor.roles["backbone-train"]
    await wait_for(lambda: set(held) <= train.consumer.assignment(), 60,
                   "backbone-train assigned the new tenants' gradient jobs")
    train.consumer.pause(*held)
    jobs = [await stack.client.submit(spec) for spec in (
        stack.rl_spec(grouped_t, f"{job_id}-again", seed=7, env=env, rl=rl),
        stack.rl_spec(peers[0], f"job-peer-{unique}", seed=8, env=env, rl=rl),
        sft_spec(peers[1], f"job-sft-peer-{unique}", reach_demos, epochs=15, batch_size=4, publish_every=20),
    )]

    async def both_queued() -> bool:
        return all([await read_topic(stack.settings, tp.topic) for tp in (held[0], held[2])])
    await wait_for(both_queued, 120, "the grouped tenant's and the SFT peer's gradient jobs")
    train.consumer.resume(*held)
    states = [await stack.follow(job) for job in jobs]
    grouped = states[0]

    features = [e for e in await stack.events(grouped_t, "features") if isinstance(e, ev.FeatureBatch)]
    assert max(f.group_size for f in features) > 1, "no training poll mixed tenants: the test proved nothing"
    versions = stack.store.versions(alone_t)
    assert versions == stack.store.versions(grouped_t) == [1, 2, 3]

    def same(version: int) -> None:  # the modules, and the optimizer state with the slot's RNG
        assert_same_state(stack.store.load(alone_t, version).state,
                          stack.store.load(grouped_t, version).state, f"version {version}")

    same(1)  # the initial modules: the seed alone
    # the episodes: same resets, same sampled actions, whoever shared the inference forwards
    first_a, first_b = await first_step(stack, alone), await first_step(stack, grouped)
    for part in ("image", "proprio", "state"):
        assert np.array_equal(to_numpy(getattr(first_a.observation, part)),
                              to_numpy(getattr(first_b.observation, part))), f"first reset differs: {part}"
    assert np.array_equal(to_numpy(first_a.action), to_numpy(first_b.action)), (
        "same job, same policy, same observation, yet a different sampled action: the action noise "
        f"depends on the tenant or its neighbours ({first_a.episode_id} vs {first_b.episode_id})")
    assert iteration_returns(grouped) == iteration_returns(alone)
    for version in versions[1:]:  # every update, whoever shared the training forwards
        same(version)


async def test_parallel_env_sessions_change_nothing_in_the_result(stack: Stack, unique: str) -> None:
    """``rl.envs``: the same spec collected by one session per iteration, and by four sessions at once
    (5 episodes over 4 sessions: 2+1+1+1), gives bit-identical checkpoints:
    episodes keep their seeds and action noise, and the iteration's batch is assembled in episode
    order whichever session finished first."""
    rl = {"iterations": 2, "episodes_per_iteration": 5, "minibatch_size": 16, "ppo_epochs": 2}
    env = {"max_episode_steps": 12}
    one_t, four_t = f"envs1-{unique}", f"envs4-{unique}"
    one, four = [await stack.client.submit(stack.rl_spec(tenant, f"job-envs-{unique}", seed=5, env=env,
                                                         rl={**rl, "envs": n}))
                 for tenant, n in ((one_t, 1), (four_t, 4))]
    one_state, four_state = await stack.follow(one), await stack.follow(four)

    assert len(one_state.resources["sessions"].split(",")) == 1
    assert len(four_state.resources["sessions"].split(",")) == 4, four_state.resources
    sessions = [e for e in await stack.events(four_t, "sessions") if isinstance(e, ev.EnvSessionRequested)]
    assert sorted(s.episodes for s in sessions) == [1, 1, 1, 1, 1, 1, 2, 2], "two iterations of 2+1+1+1"
    rollouts = [e for e in await stack.events(four_t, "rollouts") if isinstance(e, ev.RolloutRecord)]
    assert len({r.session_id for r in rollouts}) == 8, "every session played its episodes"

    assert iteration_returns(one_state) == iteration_returns(four_state)
    # both trained through an optimizer worker; with nothing left to train, neither keeps one
    host = stack.supervisor.roles["optimizer"]
    await wait_for(lambda: not {one_t, four_t} & (host.workers.keys() | host.live.keys()), timeout_s=30,
                   what="the finished tenants' optimizer workers stopped")
    versions = stack.store.versions(one_t)
    assert versions == stack.store.versions(four_t) == [1, 2, 3]
    for version in versions:
        assert_same_state(stack.store.load(one_t, version).state, stack.store.load(four_t, version).state,
                          f"version {version} with envs=4")


async def first_step(stack: Stack, job: JobState) -> ev.RolloutRecord:
    """A sync RL job's first step: iteration 0 (the session its JobAccepted names), first episode."""
    (session,) = job.resources["sessions"].split(",")
    records = [e for e in await stack.events(job.tenant, "rollouts")
               if isinstance(e, ev.RolloutRecord) and e.session_id == session and e.step == 0]
    assert records, f"no first step of {job.tenant} on its rollouts topic"
    return min(records, key=lambda r: r.reset_seed)


# ---------------------------------------------------------------------------------------------- 5
async def test_evaluation_never_changes_the_store_and_pins_versions(stack: Stack, unique: str) -> None:
    tenant = f"eval-{unique}"
    trained = await stack.run(stack.rl_spec(tenant, f"job-train-{unique}"))
    versions = stack.store.versions(tenant)
    assert versions == [1, 2, 3] and trained.policy_version == 3
    before = tree_digest(stack.settings.policy_dir)

    def eval_spec(job_id: str, version: int | None) -> dict:
        return {"kind": "eval", "tenant": tenant, "job_id": job_id, "env": SMALL_ENV,
                "eval": {"episodes": 3} | ({"policy_version": version} if version else {})}

    handles = {name: await stack.client.submit(eval_spec(f"ev-{name}-{unique}", version))
               for name, version in (("v1", 1), ("v1-again", 1), ("latest", None))}
    results = {name: await stack.follow(job) for name, job in handles.items()}

    assert tree_digest(stack.settings.policy_dir) == before  # same files, same bytes
    assert stack.store.versions(tenant) == versions
    pinned = {"v1": 1, "v1-again": 1, "latest": 3}
    for name, state in results.items():
        assert state.policy_version == pinned[name], (name, state)
        assert state.metrics["policy_version"] == pinned[name], (name, state.metrics)
        assert state.metrics["episodes"] == 3
        acted = {e.policy_version for e in await stack.events(tenant, "rollouts")
                 if isinstance(e, ev.RolloutRecord) and e.session_id == state.resources["sessions"]}
        assert acted == {pinned[name]}, (name, acted)  # every action came from the pinned version
    assert results["v1"].metrics == results["v1-again"].metrics  # deterministic: same seeds, same acts


# ---------------------------------------------------------------------------------------------- 6
def poisoned_job(job: JobState, batch: int = 8) -> ev.GradientJob:
    """A well-formed PPO minibatch whose advantages are NaN (a broken producer upstream)."""
    proprio = int(job.resources["proprio_dim"])
    rng = np.random.default_rng(0)
    return ev.GradientJob(
        envelope=ev.Envelope(tenant_id=job.tenant, correlation_id=job.job_id), job_id=job.job_id,
        batch_id=f"{job.job_id}/poison", sequence=0, policy_version=1,
        instructions=("reach the red target",) * batch,
        images=from_numpy(rng.integers(0, 255, (batch, 1, 32, 32, 3), dtype=np.uint8)),
        proprio=from_numpy(np.zeros((batch, proprio), np.float32)),
        targets={"actions": from_numpy(np.zeros((batch, 1, 2), np.float32)),
                 "old_log_probs": from_numpy(np.zeros(batch, np.float32)),
                 "advantages": from_numpy(np.full(batch, np.nan, np.float32)),
                 "returns": from_numpy(np.zeros(batch, np.float32))},
        publish=True)


async def test_an_env_asking_again_gets_the_same_action_and_costs_no_forward(stack: Stack,
                                                                            unique: str) -> None:
    """An env re-asks after 10 s without an answer; under overload the first answer is only late, so
    a repeat must not add a forward to the queue that made it late."""
    tenant = f"repeat-{unique}"
    await stack.run(stack.rl_spec(tenant, f"job-{unique}", rl={"iterations": 1, "episodes_per_iteration": 1,
                                                                "minibatch_size": 8, "ppo_epochs": 1}))
    obs = (await stack.events(tenant, "observations"))[-1]
    inference = stack.supervisor.roles["inference"]
    answered, repeats = inference.answered, inference.repeats
    async with EventProducer(stack.settings) as producer:
        for _ in range(2):
            await producer.send(tenant_topic(stack.settings, tenant, "observations"), obs, key=obs.session_id)
    await wait_for(lambda: inference.repeats == repeats + 2, 60, "both repeats")

    async def answers() -> list[ev.Action]:
        return [a for a in await stack.events(tenant, "actions") if isinstance(a, ev.Action)
                and (a.session_id, a.episode_id, a.step) == (obs.session_id, obs.episode_id, obs.step)]

    async def all_three() -> bool:
        return len(await answers()) >= 3

    await wait_for(all_three, 60, "the repeated answers")
    first, *again = await answers()
    assert all(to_numpy(a.action).tobytes() == to_numpy(first.action).tobytes() for a in again)
    assert {a.policy_version for a in again} == {first.policy_version}
    assert inference.answered == answered  # no action was computed for the repeats


async def test_inference_commits_only_the_partitions_it_read(stack: Stack, unique: str) -> None:
    """Inference commits after every poll; a bare commit would write every assigned observations
    partition (three per tenant, of every tenant) to the broker's offsets log each time. Only the
    partitions it read are committed, each to the end of what it read."""
    tenant = f"commits-{unique}"
    await stack.run(stack.rl_spec(tenant, f"job-{unique}", rl={"iterations": 1, "episodes_per_iteration": 1,
                                                                "minibatch_size": 8, "ppo_epochs": 1}))
    topic = tenant_topic(stack.settings, tenant, "observations")
    ends: dict[int, int] = {}
    for record in await read_topic(stack.settings, topic):
        ends[record.partition] = record.offset + 1
    assert len(ends) == 1  # one session: one partition of three has observations

    async def committed() -> dict[int, int]:
        admin = AIOKafkaAdminClient(**client_options(stack.settings))
        await admin.start()
        try:
            offsets = await admin.list_consumer_group_offsets("inference")
        finally:
            await admin.close()
        return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic}

    async def caught_up() -> bool:
        return await committed() == ends
    await wait_for(caught_up, 30, f"the inference group's commits of {topic}")


async def test_nan_loss_fails_that_tenant_alone(stack: Stack, unique: str) -> None:
    good = await stack.client.submit(stack.rl_spec(f"calm-{unique}", f"job-calm-{unique}", seed=3))
    bad = await stack.client.submit(stack.rl_spec(f"nan-{unique}", f"job-nan-{unique}", seed=2))

    async def accepted() -> bool:
        state = await stack.client.status(bad)
        return state is not None and state.phase == "accepted"

    await wait_for(accepted, timeout_s=60, what="the job to be accepted")
    state = await stack.client.status(bad)
    # ahead of the rollout role's first minibatch, which needs a whole iteration of episodes first
    await stack.client.producer.send(tenant_topic(stack.settings, bad.tenant, "gradient-jobs"),
                                     poisoned_job(state), key=bad.tenant)
    failed = await stack.follow(bad, expect="failed")
    assert "optimizer" in failed.reason and "NonFiniteLoss" in failed.reason, failed.reason
    assert stack.store.versions(bad.tenant) == [1]  # the initial modules only: nothing poisoned was saved
    await stack.follow(good)
    assert stack.store.versions(good.tenant) == [1, 2, 3]


# ---------------------------------------------------------------------------------------------- 7
async def test_dataset_evaluation_reports_action_error(stack: Stack, unique: str, reach_demos: Path,
                                                       tmp_path: Path) -> None:
    """Evaluation on a dataset instead of episodes: action error of a pinned version, read-only.

    On the training demonstrations the error must fall with SFT (the eval computes what the loss
    optimises). On unseen episodes it is only reported: measured 0.98 (v1) -> 1.14 after 4 epochs on
    8 episodes; the tiny random backbone does not generalise from so little data."""
    held_out = tmp_path / "held-out"
    generate_dataset("joynexus/Reach-v0", held_out, episodes=3, seed=99, image_size=32, max_episode_steps=20,
                     progress=False)
    tenant = f"sft-eval-{unique}"
    trained = await stack.run(sft_spec(tenant, f"job-sft-eval-{unique}", reach_demos, epochs=4))
    before = tree_digest(stack.settings.policy_dir)
    errors = {}
    for name, data in (("train", reach_demos), ("held-out", held_out)):
        for version in (1, trained.policy_version):
            spec = {"kind": "eval", "tenant": tenant, "job_id": f"eval-{name}-v{version}-{unique}",
                    "dataset": {"path": str(data)}, "eval": {"policy_version": version, "episodes": 8}}
            state = await stack.run(spec)
            assert state.metrics["policy_version"] == version and state.metrics["samples"] > 0
            errors[(name, version)] = round(state.metrics["action_l1"], 4)
    print(f"dataset action L1 by (data, version): {errors}")
    assert tree_digest(stack.settings.policy_dir) == before  # evaluation is read-only
    # THRESHOLD: after SFT the action error on its own demonstrations is lower than the initial modules'
    assert errors[("train", trained.policy_version)] < errors[("train", 1)], errors


# ---------------------------------------------------------------------------------------------- 8
async def test_async_rl_trains_while_collecting_and_closes_its_sessions(stack: Stack, unique: str) -> None:
    rl = {"mode": "async", "envs": 2, "iterations": 3, "episodes_per_iteration": 2, "minibatch_size": 16,
          "ppo_epochs": 1, "max_policy_lag": 1}
    state = await stack.run(stack.rl_spec(f"async-{unique}", f"job-async-{unique}", seed=4, rl=rl))
    iterations = [h for h in state.history if "collected_version" in h and "train_loss" not in h]
    assert sorted(h["iteration"] for h in iterations) == [0.0, 1.0, 2.0], state.history
    for h in iterations:
        # no iteration trains on episodes more than max_policy_lag versions behind the newest one
        assert h["latest_version"] - h["collected_version"] <= rl["max_policy_lag"], iterations
    assert stack.store.versions(f"async-{unique}") == [1, 2, 3, 4]

    async def closed() -> bool:
        job = await stack.client.status(JobHandle(f"async-{unique}", f"job-async-{unique}"))
        return job is not None and len(job.sessions) == 2 and not job.open_sessions

    await wait_for(closed, timeout_s=60, what="the async sessions to close")
