"""Extension points: what a role writes to plug into the consume loops.

* ``Handler``: consume an event and act on it (at least once: the loop commits
  after the handler returns, so a handler must be idempotent, e.g. dedupe on
  ``envelope.event_id``).
* ``Transform``: turn an event into output events; ``TransformWorker`` publishes
  them and commits the input offset in ONE Kafka transaction (exactly once).

Either may be a coroutine function, or a plain function, which the loops run
in a worker thread so CPU-bound work never starves the consumer's heartbeats.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Protocol

from schemas.events import Event

__all__ = ["Handler", "Output", "RecordContext", "Transform"]


@dataclass(frozen=True)
class RecordContext:
    """Where a record came from; bound to every log line while it is processed."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    group_id: str | None
    attempt: int = 1


@dataclass(frozen=True)
class Output:
    """One event a ``Transform`` wants published."""

    topic: str
    event: Event
    key: str | bytes | None = None


class Handler(Protocol):
    def __call__(self, event: Event, ctx: RecordContext) -> Awaitable[None] | None: ...


class Transform(Protocol):
    def __call__(
        self, event: Event, ctx: RecordContext
    ) -> Awaitable[Sequence[Output]] | Sequence[Output]: ...
