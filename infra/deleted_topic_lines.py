"""aiokafka's lines about a topic deleted under a running client: INFO, not ERROR.

A tenant's topics are deleted when it leaves (and by the benchmark after every turn). The
long-running roles' clients that still know such a topic then log about it as about a fault:

* a producer's metadata refresh: ``Topic X not found in cluster metadata`` (ERROR), until the
  producer forgets the topic (``producers/deleted_topics.py``): 150 lines in one 3-repeat
  benchmark run, one per topic and process;
* a consumer resetting a partition's offset before the rebalance takes the partition away:
  ``Received unknown topic or partition error in ListOffset request for partition ...``
  (WARNING) and ``Failed fetch offsets from N: [Error 3] UnknownTopicOrPartitionError: ...``
  (ERROR): 17 of each in the same run (2026-12-05, all in env workers).

Guarantees: ``remember_listed(client)`` (called for every producer and consumer the service
makes) records each topic the client's cluster metadata lists; those lines, when they name a
topic that a client of this process has seen listed, are logged at INFO with
``(deleted since this process saw it)`` added. A topic no client here has seen listed (a typo,
a missing grant) keeps aiokafka's level. No line is dropped: an operator still sees which
topics went away, but ERROR-level alerting does not fire on every tenant that leaves. The
lines are matched by aiokafka 0.14's message strings (pinned in ``infra/requirements.lock``);
``tests/test_producer.py`` and ``tests/test_bus.py`` fail if they change.
"""

from __future__ import annotations

import logging
from typing import Any

from aiokafka.cluster import ClusterMetadata
from aiokafka.errors import UnknownTopicOrPartitionError
from aiokafka.structs import TopicPartition

__all__ = ["remember_listed"]

_NOT_FOUND = "Topic %s not found in cluster metadata"  # aiokafka.cluster
_FAILED_OFFSETS = "Failed fetch offsets from %s: %s"  # aiokafka.consumer.fetcher, (node, error)
_UNKNOWN_IN_LIST_OFFSETS = "Received unknown topic or partition error in ListOffset request"  # (partition,)
_SEEN = " (deleted since this process saw it)"
_seen_here: set[str] = set()  # every topic a client of this process has seen listed


def _topic_named(record: logging.LogRecord) -> str | None:
    args = record.args if isinstance(record.args, tuple) else ()
    if record.msg == _NOT_FOUND and args:
        return args[0]
    if record.msg == _FAILED_OFFSETS and len(args) == 2:
        error = args[1]
        if isinstance(error, UnknownTopicOrPartitionError) and error.args \
                and isinstance(error.args[0], TopicPartition):
            return error.args[0].topic
    if isinstance(record.msg, str) and record.msg.startswith(_UNKNOWN_IN_LIST_OFFSETS) and args \
            and isinstance(args[0], TopicPartition):
        return args[0].topic
    return None


class _DeletedIsInfo(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO and _topic_named(record) in _seen_here:
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg = record.msg + _SEEN
        return True


_FILTER = _DeletedIsInfo()


def _listed(cluster: ClusterMetadata) -> None:
    _seen_here.update(cluster.topics())


def remember_listed(client: Any) -> None:
    """Record every topic ``client`` (an ``AIOKafkaClient``) sees listed, and have this process's
    aiokafka lines about such a topic, once deleted, logged at INFO (see the module's docstring)."""
    client.cluster.add_listener(_listed)
    for name in ("aiokafka.cluster", "aiokafka.consumer.fetcher"):
        logging.getLogger(name).addFilter(_FILTER)  # a logger's filters are a set: once each
