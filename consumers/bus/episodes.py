"""Rollout records back into whole episodes, and the offsets that are safe to commit.

The env commits an episode's records in one transaction, so a read_committed
consumer sees whole episodes; but episodes of many sessions interleave on a
partition. A collector keeps the records of sessions it has not finished
with, and ``safe_offsets`` says, per partition, how far the log may be
committed without losing any of them: up to the first record still held. A
restarted consumer reads the held records again; whatever was already
acted on is recognised downstream (deterministic ids and sequences).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from aiokafka.structs import ConsumerRecord, TopicPartition

from consumers.bus.loop import commit_within
from infra.errors import SchemaError, TenantMismatch
from infra.logging import get_logger
from infra.topics import check_tenant
from schemas import events as ev
from schemas.codec import Codec

__all__ = ["Episode", "EpisodeCollector", "RolloutReader"]

log = get_logger("consumers.bus.episodes")


@dataclass
class Episode:
    episode_id: str
    records: list[ev.RolloutRecord] = field(default_factory=list)

    @property
    def order(self) -> tuple[int, str]:
        # a session's episode k resets with seed + k: the seed orders episodes whatever their ids
        return (self.records[0].reset_seed if self.records else -1, self.episode_id)

    @property
    def done(self) -> bool:
        last = self.records[-1] if self.records else None
        return last is not None and (last.terminated or last.truncated)

    @property
    def total_reward(self) -> float:
        return float(sum(r.reward for r in self.records))

    @property
    def success(self) -> bool:
        return any(r.success for r in self.records)


@dataclass
class _Session:
    episodes: dict[str, Episode] = field(default_factory=dict)
    first_offset: dict[TopicPartition, int] = field(default_factory=dict)


class EpisodeCollector:
    def __init__(self) -> None:
        self._sessions: dict[str, _Session] = {}
        self._released: set[str] = set()
        self._read: dict[TopicPartition, int] = {}

    def skip(self, record: ConsumerRecord) -> TopicPartition:
        """A record read and not wanted: it holds nothing back."""
        tp = TopicPartition(record.topic, record.partition)
        self._read[tp] = record.offset + 1
        return tp

    def add(self, record: ConsumerRecord, event: ev.RolloutRecord) -> None:
        tp = self.skip(record)
        if event.session_id in self._released:
            return
        session = self._sessions.setdefault(event.session_id, _Session())
        session.first_offset.setdefault(tp, record.offset)
        episode = session.episodes.setdefault(event.episode_id, Episode(event.episode_id))
        if any(r.step == event.step for r in episode.records):
            return  # the same step again (a re-read after a restart)
        episode.records.append(event)
        episode.records.sort(key=lambda r: r.step)

    def done_episodes(self, session_id: str) -> list[Episode]:
        session = self._sessions.get(session_id)
        if session is None:
            return []
        return sorted((e for e in session.episodes.values() if e.done), key=lambda e: e.order)

    def take(self, session_id: str, episodes: list[Episode]) -> None:
        """Forget episodes that were acted on (async RL keeps collecting the session)."""
        session = self._sessions.get(session_id)
        if session:
            for episode in episodes:
                session.episodes.pop(episode.episode_id, None)

    def release(self, session_id: str) -> None:
        """The session is finished with: its records no longer hold the commit position back."""
        self._sessions.pop(session_id, None)
        self._released.add(session_id)

    def sessions(self) -> list[str]:
        return list(self._sessions)

    def safe_offsets(self) -> dict[TopicPartition, int]:
        held: dict[TopicPartition, int] = defaultdict(lambda: 1 << 62)
        for session in self._sessions.values():
            for tp, offset in session.first_offset.items():
                held[tp] = min(held[tp], offset)
        return {tp: min(read, held[tp]) if tp in held else read for tp, read in self._read.items()}


class RolloutReader:
    """A consumer of the rollouts topics feeding an ``EpisodeCollector``, committing only what the
    collector no longer holds (the rollout role and the evaluator each run one, in their own group).
    ``wants(key)``, if given, picks the records worth decoding by their key; the others are skipped
    undecoded (decoding a record costs more than everything else the reader does with it)."""

    def __init__(self, consumer, codec: Codec, wants: Callable[[bytes | None], bool] | None = None):
        self.consumer = consumer
        self.codec = codec
        self.wants = wants
        self.collector = EpisodeCollector()
        self.read = 0  # records read: the reader's progress
        self._committed: dict[TopicPartition, int] = {}

    async def poll(self) -> None:
        batches = await self.consumer.getmany(timeout_ms=200)
        for records in batches.values():
            self.read += len(records)
            for record in records:
                if self.wants is not None and not self.wants(record.key):
                    self.collector.skip(record)
                    continue
                try:
                    event = self.codec.decode(record.value)
                except SchemaError as exc:
                    log.error("undecodable rollout record skipped", topic=record.topic,
                              partition=record.partition, offset=record.offset, error=str(exc)[:200])
                    continue
                if isinstance(event, ev.RolloutRecord):
                    try:
                        check_tenant(record.topic, event.tenant_id)
                    except TenantMismatch:  # logged as a security event; never collected
                        continue
                    self.collector.add(record, event)

    async def commit(self) -> None:
        """Commit the safe offsets that moved since the last commit. Only those: every commit is an
        append to the broker's offsets log, and the roles call this after every poll."""
        owned = self.consumer.assignment()
        offsets = {tp: o for tp, o in self.collector.safe_offsets().items()
                   if tp in owned and self._committed.get(tp) != o}
        if not offsets:
            return
        try:
            await commit_within(self.consumer, offsets)
        except Exception as exc:  # a re-read is harmless: held records are read again, deduped downstream
            log.warning("commit failed", error_class=type(exc).__name__)
            return
        self._committed.update(offsets)
