"""Nearest-rank percentiles, the one definition behind every p50/p90/p99 the service reports
(group sizes from the device timeline, action waits from the env workers' heartbeats)."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["nearest_rank"]


def nearest_rank(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 < q <= 1) of values sorted ascending: the ceil(q * n)-th smallest."""
    if not ordered:
        raise ValueError("nearest_rank of no values")
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
