"""Long polls that hold nothing else up: what a consumer needs for a long ``fetch_max_wait_ms``.

A fetch that finds nothing waits at the broker up to ``fetch_max_wait_ms``; a record arriving
on one of ITS partitions answers it at once. Three things in aiokafka make a long wait cost
latency elsewhere, and ``fetch_apart(consumer)`` (called before ``start``) takes them away:

* A broker answers one connection's requests in the order they came, and aiokafka sends a
  consumer's fetches, list-offsets (``end_offsets``, offset resets) and metadata requests on
  ONE connection per broker, so each would queue behind a held fetch. Fetches go on a second
  connection per broker instead. A fetch cancelled while the broker still holds it (a
  rebalance, ``stop``) closes that connection, so the next fetch does not queue behind a
  request nobody waits for. (Group coordination has its own connection already: at most three
  per broker.)
* Prefetching: while the application has not yet taken the records of partition P, aiokafka
  sends, 100 ms later, a fetch for the broker's OTHER partitions; P's next records then wait for
  that fetch to come back, up to the whole wait (measured: gradient jobs p90 0.6 s -> 5.0 s at a
  5 s wait). Here no fetch goes to a broker while any of its partitions' records are unread
  (up to the wait): the next one, for all of them, leaves as soon as the application reads.
* A partition whose position moves while a fetch is held (``seek``, ``seek_to_beginning`` /
  ``seek_to_end``, ``resume``) would be fetched only when that fetch returns, and aiokafka sends no
  offset reset to a broker while a fetch is held there, so those seeks waited up to the whole wait
  (an env worker's rebalance listener awaits two: at 5 s, two workers expelled each other from
  their group). Here a move cancels the consumer's held fetches (closing their connection, as
  above): the reset, and the fetch from the new position, leave at once. Records the cancelled
  fetch would have brought are fetched again: positions move only when the application reads.

Guarantees: what is fetched, and in which order, is aiokafka's; only when and on which
connection differ. It relies on aiokafka 0.14 internals (``AIOKafkaClient.send(...,
group=...)`` keying connections by ``(node_id, group)``, the fetcher's ``_prefetch_backoff``,
the fetcher's ``request_offset_reset`` and ``seek_to``), pinned in ``infra/requirements.lock``;
``tests/test_bus.py`` fails if they change.
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer
from aiokafka.client import ConnectionGroup
from aiokafka.conn import CloseReason
from aiokafka.protocol.fetch import FetchRequest

__all__ = ["FETCHES", "fetch_apart"]

FETCHES = max(ConnectionGroup) + 1  # a connection-group key aiokafka itself never uses


def fetch_apart(consumer: AIOKafkaConsumer) -> AIOKafkaConsumer:
    """Long polls for ``consumer`` (before ``start``): see the module's docstring."""
    client = consumer._client
    send, start, resume = client.send, consumer.start, consumer.resume
    held: dict[int, asyncio.Task] = {}  # broker -> the task awaiting that broker's fetch response

    async def send_apart(node_id, request, *, group=ConnectionGroup.DEFAULT):
        if group != ConnectionGroup.DEFAULT or not isinstance(request, FetchRequest):
            return await send(node_id, request, group=group)
        task = held[node_id] = asyncio.current_task()
        try:
            return await send(node_id, request, group=FETCHES)
        except asyncio.CancelledError:
            conn = client._conns.get((node_id, FETCHES))
            if conn is not None:
                conn.close(reason=CloseReason.SHUTDOWN)
            raise
        finally:
            if held.get(node_id) is task:
                del held[node_id]

    def cancel_held() -> None:
        # Only while the task awaits the response: aiokafka's fetch task takes a cancel there
        # as "no longer of interest"; anywhere else it would end aiokafka's fetch loop.
        for task in held.values():
            task.cancel()

    def resume_now(*partitions) -> None:
        resume(*partitions)
        cancel_held()

    async def start_apart() -> None:
        await start()  # the fetcher exists from here on
        fetcher = consumer._fetcher
        fetcher._prefetch_backoff = consumer._fetch_max_wait_ms / 1000
        reset, seek_to = fetcher.request_offset_reset, fetcher.seek_to

        def reset_now(tps, strategy):
            waiters = reset(tps, strategy)
            cancel_held()
            return waiters

        def seek_now(tp, offset) -> None:
            seek_to(tp, offset)
            cancel_held()

        fetcher.request_offset_reset, fetcher.seek_to = reset_now, seek_now

    client.send = send_apart
    consumer.start = start_apart
    consumer.resume = resume_now
    return consumer
