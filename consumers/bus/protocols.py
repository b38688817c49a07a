"""Extension points: what a role writes to plug into the consume loops and the process host.

* ``Handler``: consume an event and act on it (at least once: the loop commits
  after the handler returns, so a handler must be idempotent, e.g. dedupe on
  ``envelope.event_id``).
* ``Transform``: turn an event into output events; ``TransformWorker`` publishes
  them and commits the input offset in ONE Kafka transaction (exactly once).

Either may be a coroutine function, or a plain function, which the loops run
in a worker thread so CPU-bound work never starves the consumer's heartbeats.

* ``Role``: what ``infra/runtime/host.py`` runs in a process: ``start``, ``run(stop)``,
  ``stop``, and ``workload()``, which its heartbeats report (``Workload``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from schemas.events import Event

__all__ = ["Handler", "Output", "RecordContext", "Role", "Transform", "Workload"]


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


@dataclass(frozen=True)
class Workload:
    """What a role says of its work, for its heartbeats.

    ``consumers``: the Kafka consumers whose assignments and lag count; ``done``: a count of
    finished work that only grows (when it moves, the role made progress); ``waiting``: work the
    role holds and has not finished; ``details``: a few numbers worth showing.
    """

    consumers: tuple[Any, ...] = ()
    done: int = 0
    waiting: int = 0
    details: Mapping[str, object] = field(default_factory=dict)


class Role(Protocol):
    async def start(self) -> None: ...

    async def run(self, stop: asyncio.Event) -> None: ...

    async def stop(self) -> None: ...

    def workload(self) -> Workload: ...
