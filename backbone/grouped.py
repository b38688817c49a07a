"""Bucket-then-forward: the one way a list of prepared requests becomes features.

Rows of one bucket (same camera count, same padded length: ``backbone.inputs``)
share a forward; rows of different buckets never do. ``forward_grouped`` runs
ONE forward per bucket, buckets in key order, and returns the features in the
order of its input, so a caller never sees the grouping. A row's feature is
what that row computes alone (same shapes), whatever else shares its forward.

``forward_grouped_on`` does the same through a ``DeviceGate`` queue: inside a
service every forward goes through the gate, which is what makes the gate's
"one forward at a time", inference-first order and busy-second accounting
true. A bucket larger than ``gate.chunk_rows(queue)`` runs as several
forwards of at most that many rows, each taking the gate anew, so inference
can go between them (the gate sizes chunks to its latency budget); features
are the same, row for row. ``forward_grouped`` (no gate) is for a policy
served in a user's own process, where nothing else shares the backbone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from backbone.feature import VLAFeature
from backbone.gate import DeviceGate
from backbone.inputs import BucketKey, Prepared

__all__ = ["BucketForward", "buckets", "forward_grouped", "forward_grouped_on"]


@dataclass(frozen=True)
class BucketForward:
    """What one forward did: its bucket, the input rows it computed, its device seconds."""

    key: BucketKey
    rows: tuple[int, ...]
    busy_s: float


def buckets(prepared: Sequence[Prepared]) -> list[tuple[BucketKey, list[int]]]:
    """Input indices grouped by bucket key, keys in sorted order, indices in input order."""
    by_key: dict[BucketKey, list[int]] = {}
    for i, p in enumerate(prepared):
        by_key.setdefault(p.key, []).append(i)
    return sorted(by_key.items())


def forward_grouped(backbone, prepared: Sequence[Prepared]) -> list[VLAFeature]:
    """One forward per bucket, no gate; features in input order."""
    features: list[VLAFeature | None] = [None] * len(prepared)
    for _, rows in buckets(prepared):
        for i, feature in zip(rows, backbone.forward([prepared[i] for i in rows]), strict=True):
            features[i] = feature
    return features  # type: ignore[return-value]


async def forward_grouped_on(
    gate: DeviceGate | None, queue: str, backbone, prepared: Sequence[Prepared]
) -> tuple[list[VLAFeature], list[BucketForward]]:
    """One forward per bucket, each holding ``gate`` on ``queue`` and run in a worker thread
    (the event loop and its Kafka heartbeats stay free); features in input order, and what each
    forward did. ``gate=None`` runs without one (a batcher outside a service)."""
    features: list[VLAFeature | None] = [None] * len(prepared)
    done: list[BucketForward] = []
    for key, bucket in buckets(prepared):
        start = 0
        while start < len(bucket):
            limit = gate.chunk_rows(queue) if gate is not None else None  # re-read: it learns as it goes
            rows = bucket[start:] if limit is None else bucket[start : start + limit]
            start += len(rows)
            group = [prepared[i] for i in rows]
            if gate is None:
                began = time.perf_counter()
                out = await asyncio.to_thread(backbone.forward, group)
                busy_s = time.perf_counter() - began
            else:
                async with gate.use(queue, rows=len(group), tenants=[p.tenant for p in group]):
                    began = time.perf_counter()
                    out = await asyncio.to_thread(backbone.forward, group)
                    busy_s = time.perf_counter() - began  # inside the gate: never more than it counts
            done.append(BucketForward(key, tuple(rows), busy_s))
            for i, feature in zip(rows, out, strict=True):
                features[i] = feature
    return features, done  # type: ignore[return-value]
