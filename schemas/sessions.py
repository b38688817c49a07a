"""Session ids of a job's env sessions, and the key their rollout records travel under.

Part of the job model (like ``jobspec.py``): the master names sessions, the
env worker keys rollouts, the rollout role finds an iteration's sessions, all
by these rules, so they are pure string functions with no imports beyond the
standard library (the env worker imports no torch).

``<tenant>.<job>`` prefixes every session of a job (job ids are unique only
within a tenant). Sync RL iteration k is ``<prefix>-it<k>`` when one session
collects it, or ``<prefix>-it<k>-s<j>`` for part j of ``rl.envs`` parallel
sessions; async sessions are ``<prefix>-env<i>``, evaluations ``<prefix>-eval``.

Rollout records are keyed by :func:`rollout_key`: the iteration's id for all of
its parts, so every part of an iteration lands on one rollouts partition and
one rollout instance assembles the whole iteration; any other session keys by
its own id.
"""

from __future__ import annotations

import re

__all__ = ["eval_session_id", "is_eval_rollout_key", "iteration_of", "part_slices", "rl_session_id",
           "rollout_key", "session_prefix"]

_EVAL = "-eval"
_ITERATION = re.compile(r"^(?P<base>.+-it(?P<k>\d+))(?:-s(?P<j>\d+))?$")


def session_prefix(tenant: str, job_id: str) -> str:
    # Session ids key records in shared consumers (env, inference): they must be unique across
    # tenants, and job ids are only unique within a tenant.
    return f"{tenant}.{job_id}"


def rl_session_id(tenant: str, job_id: str, iteration: int, part: int | None = None) -> str:
    """Sync RL iteration ``iteration``; ``part`` names one of its parallel sessions (None: the only one)."""
    base = f"{session_prefix(tenant, job_id)}-it{iteration}"
    return base if part is None else f"{base}-s{part}"


def eval_session_id(tenant: str, job_id: str) -> str:
    """An evaluation job's one session."""
    return f"{session_prefix(tenant, job_id)}{_EVAL}"


def is_eval_rollout_key(key: bytes | None) -> bool:
    """Whether a rollout record's key (``rollout_key``, UTF-8) is an evaluation session's: the
    evaluator reads every tenant's rollouts and decodes only these."""
    return key is not None and key.endswith(_EVAL.encode())


def iteration_of(session_id: str, prefix: str) -> tuple[int, int | None] | None:
    """(iteration, part) of a sync RL session of the job with ``prefix``; None for any other session."""
    if not session_id.startswith(f"{prefix}-it"):
        return None
    match = _ITERATION.match(session_id)
    if match is None or match["base"] != f"{prefix}-it{match['k']}":
        return None
    return int(match["k"]), None if match["j"] is None else int(match["j"])


def rollout_key(session_id: str) -> str:
    """What a session's rollout records are keyed by: its iteration's id for a part, else its own id."""
    match = _ITERATION.match(session_id)
    return match["base"] if match is not None and match["j"] is not None else session_id


def part_slices(episodes: int, envs: int) -> list[tuple[int, int]]:
    """(first episode, count) of each parallel session: ``min(envs, episodes)`` contiguous runs, the
    first ones one longer when they do not divide evenly; together they are episodes 0..episodes-1
    in order."""
    parts = max(1, min(envs, episodes))
    size, extra = divmod(episodes, parts)
    out, first = [], 0
    for j in range(parts):
        count = size + (1 if j < extra else 0)
        out.append((first, count))
        first += count
    return out
