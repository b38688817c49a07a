"""A bounded poll that every partition with records waiting gets a share of.

aiokafka's ``getmany(max_records=n)`` serves the buffered partitions in the order their fetches
came back, and a partition keeps its place until its fetch is drained: a fetch that brought a
hundred records is served first, n at a time, and a record of any other partition waits behind
all of them. In backbone-train (polls of 16 jobs) an RL tenant's gradient job, on which its eight
sessions wait, took 374-811 ms to its first feature batch while an SFT tenant's 480 jobs were
being worked through, against 20-30 ms alone (2026-12-07, ``benchmarks/HISTORY.md``). What this
buys is isolation, not a faster benchmark: there, one tenant's backlog now delays another's job
by at most one poll, and the headline did not move (34.7% against 34.5% an hour before; the
first gap between RL iterations 1.2-1.9 s shared against 1.2-2.1 s, its larger part the optimizer
working through the same SFT steps).

``getmany_fair`` waits for a first record as ``getmany`` does, then takes one record from each
other partition that has one, then fills the poll's remaining room partition by partition. The
partitions are visited from a start that moves on each poll, so none is always last. Each
partition's records come in order and from where it was, so nothing is skipped or reordered
within a partition: a caller that commits per partition commits what it processed.
"""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord, TopicPartition

__all__ = ["getmany_fair"]


async def getmany_fair(consumer: AIOKafkaConsumer, limit: int, timeout_ms: int,
                       turn: int = 0) -> dict[TopicPartition, list[ConsumerRecord]]:
    """Up to ``limit`` records, shared among the partitions that have some; ``turn`` (a counter
    the caller increments per poll) rotates which partition is visited first."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    first = await consumer.getmany(timeout_ms=timeout_ms, max_records=1)
    out: dict[TopicPartition, list[ConsumerRecord]] = {tp: list(records) for tp, records in first.items()}
    if not out:
        return out
    room = limit - sum(map(len, out.values()))
    partitions = sorted(consumer.assignment())
    if partitions:
        k = turn % len(partitions)
        partitions = partitions[k:] + partitions[:k]
    for share in (1, None):  # one each first, then whatever room is left
        for tp in partitions:
            if room <= 0:
                return out
            if share == 1 and tp in out:
                continue
            got = await consumer.getmany(tp, timeout_ms=0, max_records=room if share is None else 1)
            for records in got.values():
                out.setdefault(tp, []).extend(records)
                room -= len(records)
    return out
