"""Topics deleted under a long-running producer: forgotten after the refresh that noticed.

aiokafka names every topic a producer has written to in each of its metadata requests
for the producer's lifetime, and logs ``Topic X not found in cluster metadata`` at ERROR
for each one that no longer exists, at every refresh. A tenant's topics are deleted when
it leaves (and by the benchmark after every turn), so every long-running role logged
errors about it from then on: 1,164 lines in one 3-repeat benchmark run (2026-12-05).

Guarantees, per producer (``WrittenTopics``):

* a topic that was in the producer's metadata and then vanished is dropped from what it
  asks for, after the refresh that noticed; writing to it again tracks it again;
* a topic created a moment ago and not listed yet is never dropped (aiokafka's wait for
  its metadata would then never end);
* that refresh's one line is logged at INFO (``infra/deleted_topic_lines.py``).
"""

from __future__ import annotations

from typing import Any

from aiokafka.cluster import ClusterMetadata

from infra.deleted_topic_lines import remember_listed

__all__ = ["WrittenTopics"]


class WrittenTopics:
    """The topics one producer has written to; ``attach`` it to the started producer's client."""

    def __init__(self) -> None:
        self.written: set[str] = set()  # what aiokafka asks the broker about for this producer
        self.seen: set[str] = set()  # of those, the ones the broker's metadata has listed
        self._client: Any = None

    def attach(self, client: Any) -> None:
        self._client = client
        client.cluster.add_listener(self._refreshed)
        remember_listed(client)

    def add(self, topic: str) -> None:
        self.written.add(topic)

    def _refreshed(self, cluster: ClusterMetadata) -> None:
        present = cluster.topics()
        listed = self.written & present
        self.seen |= listed
        gone = self.seen - present
        if gone:
            self.seen -= gone
            self.written -= gone
            self._client.set_topics(self.written)  # empty: every topic, no errors
