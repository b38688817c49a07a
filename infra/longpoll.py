"""Long polls that hold nothing else up: what a consumer needs for a long ``fetch_max_wait_ms``.

A fetch that finds nothing waits at the broker up to ``fetch_max_wait_ms``; a record arriving
on one of ITS partitions answers it at once. Two things in aiokafka make a long wait cost
latency elsewhere, and ``fetch_apart(consumer)`` (called before ``start``) takes both away:

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

Still bounded by the wait: a partition resumed after ``pause`` or moved by ``seek`` while a
fetch is held (rewinds after a failed transaction) is fetched when that fetch returns, and
aiokafka sends no offset reset (``seek_to_beginning``/``seek_to_end``, which wait for it) to a
broker while a fetch is held there: a rebalance listener that awaits two such seeks can wait
two whole waits without heartbeats (why ``fetch_max_wait_ms`` stays at 500 ms by default).

Guarantees: what is fetched, and in which order, is aiokafka's; only when and on which
connection differ. It relies on aiokafka 0.14 internals (``AIOKafkaClient.send(...,
group=...)`` keying connections by ``(node_id, group)``, the fetcher's ``_prefetch_backoff``),
pinned in ``infra/requirements.lock``; ``tests/test_bus.py`` fails if they change.
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
    send, start = client.send, consumer.start

    async def send_apart(node_id, request, *, group=ConnectionGroup.DEFAULT):
        if group != ConnectionGroup.DEFAULT or not isinstance(request, FetchRequest):
            return await send(node_id, request, group=group)
        try:
            return await send(node_id, request, group=FETCHES)
        except asyncio.CancelledError:
            conn = client._conns.get((node_id, FETCHES))
            if conn is not None:
                conn.close(reason=CloseReason.SHUTDOWN)
            raise

    async def start_apart() -> None:
        await start()  # the fetcher exists from here on
        consumer._fetcher._prefetch_backoff = consumer._fetch_max_wait_ms / 1000

    client.send = send_apart
    consumer.start = start_apart
    return consumer
