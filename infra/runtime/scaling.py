"""How many env workers a machine should run: a pure function of what its workers report.

The backlog is what the env workers of this machine hold (running sessions) and
what waits for them (their consumer lag on the sessions and actions topics).
The target is enough workers for ``per_worker`` sessions each, one more while
records wait unread, always between ``lo`` and ``hi``. The supervisor scales up
at once and down only after the target stayed lower for a while (hysteresis),
so a short lull between RL iterations does not shuffle sessions back and forth.
"""

from __future__ import annotations

import math

__all__ = ["LAG_HIGH", "env_target"]

#: Unread sessions/actions records across the workers that count as "work waits".
LAG_HIGH = 50


def env_target(workers: int, sessions: int, lag: int, *, per_worker: int, lo: int, hi: int) -> int:
    wanted = math.ceil(sessions / per_worker)
    if lag > LAG_HIGH:
        wanted = max(wanted, workers + 1)
    return max(lo, min(hi, wanted))
