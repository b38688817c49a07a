"""Session ids of a job (``schemas/sessions.py``): how an RL iteration is split between parallel
sessions, and the rollout key that keeps an iteration's parts on one partition."""

from __future__ import annotations

import pytest

from schemas.sessions import (
    eval_session_id,
    is_eval_rollout_key,
    iteration_of,
    part_slices,
    rl_session_id,
    rollout_key,
)


@pytest.mark.parametrize(("episodes", "envs", "expected"), [
    (8, 1, [(0, 8)]),
    (8, 4, [(0, 2), (2, 2), (4, 2), (6, 2)]),
    (5, 4, [(0, 2), (2, 1), (3, 1), (4, 1)]),
    (3, 8, [(0, 1), (1, 1), (2, 1)]),  # never an empty session
])
def test_an_iteration_is_split_into_contiguous_runs_in_order(episodes, envs, expected) -> None:
    slices = part_slices(episodes, envs)
    assert slices == expected
    assert [e for first, count in slices for e in range(first, first + count)] == list(range(episodes))


def test_iteration_ids_parse_back_and_parts_share_a_rollout_key() -> None:
    prefix = "acme.job-it3-s2"  # a job id that looks like a part must not confuse the parser
    only, part = rl_session_id("acme", "job-it3-s2", 7), rl_session_id("acme", "job-it3-s2", 7, 2)
    assert iteration_of(only, prefix) == (7, None)
    assert iteration_of(part, prefix) == (7, 2)
    assert iteration_of(f"{prefix}-eval", prefix) is None
    assert iteration_of(f"{prefix}-env0", prefix) is None
    assert iteration_of(rl_session_id("acme", "other", 7), prefix) is None
    assert rollout_key(part) == rollout_key(rl_session_id("acme", "job-it3-s2", 7, 0)) == only
    assert rollout_key(only) == only
    assert rollout_key(f"{prefix}-eval") == f"{prefix}-eval"


def test_only_evaluation_sessions_have_an_evaluation_rollout_key() -> None:
    """The evaluator decodes the rollouts whose key says evaluation, and nothing else."""
    evaluation = rollout_key(eval_session_id("acme", "job-eval")).encode()
    assert is_eval_rollout_key(evaluation)
    for training in (rl_session_id("acme", "job-eval", 0), rl_session_id("acme", "job-eval", 0, 1),
                     "acme.job-eval-env0"):
        assert not is_eval_rollout_key(rollout_key(training).encode())
    assert not is_eval_rollout_key(None)


@pytest.mark.parametrize("envs", [1, 3, 8])
def test_iteration_parts_name_the_sessions_the_master_requests(envs) -> None:
    """The rollout role waits on ``iteration_parts``; the master requests ``iteration_sessions``:
    the same sessions, playing consecutive seeds, whatever the split."""
    from consumers.master import plan
    from schemas.jobspec import JobSpec

    spec = JobSpec.parse({"kind": "rl", "tenant": "acme", "job_id": "j", "seed": 1,
                          "env": {"env_id": "joynexus/Reach-v0"},
                          "rl": {"episodes_per_iteration": 5, "envs": envs}})
    parts, sessions = plan.iteration_parts(spec, 3), plan.iteration_sessions(spec, 3, 2, "test")
    assert [(p[0], p[2]) for p in parts] == [(s.session_id, s.episodes) for s in sessions]
    seeds = [s.seed + i for s in sessions for i in range(s.episodes)]
    assert seeds == list(range(seeds[0], seeds[0] + 5))
