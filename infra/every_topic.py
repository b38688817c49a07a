"""A pattern subscription keeps seeing every topic after asking about a deleted one.

aiokafka's client asks the broker for the metadata of the topics it tracks, and tracking none
means "every topic": what a pattern subscription needs, since it matches its pattern against
the whole list. When the fetcher looks up the offsets of a partition the client has no leader
for (``end_offsets``, ``position``, an offset reset), it calls ``client.add_topic(topic)``, which
turns "every topic" into "that one topic". From then on each metadata refresh lists only that
topic; the pattern matches only what the refresh lists, so the subscription shrinks to it, the
group rebalances, and the consumer is assigned nothing but that topic, for good. A tenant deleted
while a shared role looked up its offsets therefore took every other tenant's partitions away
from that role: measured 2026-12-03 (aiokafka 0.14.0), an env worker left with 18 of its 106
topics, the CI failure of 9efc2b0; `tests/test_bus.py` has the three-topic version.

``track_every_topic(consumer)`` (before ``start``) makes ``add_topic`` keep an empty tracked set
empty: every topic is already asked for, so the wanted one is in the next refresh, which it
still forces. A client that tracks named topics (a manual assignment) is unchanged.

Guarantees: which records are fetched is aiokafka's; only the metadata request's topic list
differs, and only where aiokafka would have narrowed "every topic". It relies on aiokafka 0.14
internals (``AIOKafkaClient.add_topic`` and ``_topics``, pinned in ``infra/requirements.lock``);
``tests/test_bus.py`` fails if they change.
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer

__all__ = ["track_every_topic"]


def track_every_topic(consumer: AIOKafkaConsumer) -> AIOKafkaConsumer:
    """See the module's docstring."""
    client = consumer._client
    add_topic = client.add_topic

    def add_topic_to_all(topic: str) -> asyncio.Future:
        if not client._topics:  # "every topic": already tracked
            return client.force_metadata_update()
        return add_topic(topic)

    client.add_topic = add_topic_to_all
    return consumer
