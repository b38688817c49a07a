"""The one Kafka producer wrapper: idempotent (acks=all), compressed, Avro-encoded.

``send`` encodes an ``Event`` with the codec and returns once the broker has
acknowledged it. ``send_raw`` publishes bytes as they are (the DLQ keeps the
original bytes of a record it could not decode). With a ``transactional_id``
the same class is the transactional producer of consume-transform-produce.

Deleted topics are forgotten: aiokafka names every topic a producer has written to
in each of its metadata requests for the producer's lifetime, and logs an error
for each one that no longer exists at every refresh, so one deleted tenant would
fill every long-running role's log. Here a topic that was in the metadata and then
vanished is dropped after the refresh that noticed (one error line per topic and
producer); writing to it again tracks it again.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.cluster import ClusterMetadata
from aiokafka.structs import RecordMetadata, TopicPartition

from infra.connection import client_options
from infra.settings import Settings
from schemas.codec import Codec
from schemas.events import Event

__all__ = ["EventProducer", "Headers"]

Headers = Sequence[tuple[str, bytes]]
MAX_REQUEST_BYTES = 8 * 1024 * 1024  # matches the local broker's message.max.bytes


def _key(key: str | bytes | None) -> bytes | None:
    return key.encode() if isinstance(key, str) else key


class EventProducer:
    """Async context manager around ``AIOKafkaProducer``."""

    def __init__(
        self,
        settings: Settings,
        codec: Codec | None = None,
        *,
        transactional_id: str | None = None,
        client_id: str | None = None,
    ):
        self.settings = settings
        self.codec = codec or Codec()
        self.transactional_id = transactional_id
        self._producer = AIOKafkaProducer(
            **client_options(settings),
            client_id=client_id or settings.client_id,
            acks="all",
            enable_idempotence=True,
            transactional_id=transactional_id,
            compression_type=settings.compression_type,
            request_timeout_ms=settings.request_timeout_ms,
            max_request_size=MAX_REQUEST_BYTES,
            linger_ms=settings.producer_linger_ms,
        )
        self._written: set[str] = set()  # the topics aiokafka tracks for this producer
        self._seen: set[str] = set()  # of those, the ones the broker's metadata has listed

    async def start(self) -> None:
        # With a transactional id this also runs InitProducerId, fencing any
        # older producer (a zombie worker) that used the same id.
        await self._producer.start()
        self._producer.client.cluster.add_listener(self._forget_deleted)

    def _forget_deleted(self, cluster: ClusterMetadata) -> None:
        """After each metadata refresh: stop tracking written topics that have vanished.
        Only seen ones: a topic created a moment ago may not be in the metadata yet."""
        present = cluster.topics()
        self._seen |= self._written & present
        gone = self._seen - present
        if gone:
            self._seen -= gone
            self._written -= gone
            self._producer.client.set_topics(self._written)  # empty: every topic, no errors

    async def stop(self) -> None:
        await self._producer.stop()

    async def __aenter__(self) -> EventProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def send(
        self, topic: str, event: Event, key: str | bytes | None = None,
        headers: Headers = (), partition: int | None = None,
    ) -> RecordMetadata:
        """Encode and publish one event; returns once the broker acknowledged it."""
        return await self.send_raw(topic, self.codec.encode(event), key, headers, partition)

    async def send_raw(
        self, topic: str, value: bytes | None, key: str | bytes | None = None,
        headers: Headers = (), partition: int | None = None, timestamp_ms: int | None = None,
    ) -> RecordMetadata:
        self._written.add(topic)
        future = await self._producer.send(
            topic, value=value, key=_key(key), headers=list(headers),
            partition=partition, timestamp_ms=timestamp_ms,
        )
        return await future

    async def enqueue(
        self, topic: str, event: Event, key: str | bytes | None = None, headers: Headers = (),
    ) -> None:
        """Publish without waiting for the acknowledgement: inside a transaction
        the commit is the acknowledgement, and waiting per record would be slow."""
        await self.enqueue_raw(topic, self.codec.encode(event), key, headers)

    async def enqueue_raw(
        self, topic: str, value: bytes | None, key: str | bytes | None = None,
        headers: Headers = (), timestamp_ms: int | None = None, partition: int | None = None,
    ) -> None:
        self._written.add(topic)
        await self._producer.send(topic, value=value, key=_key(key), headers=list(headers),
                                  timestamp_ms=timestamp_ms, partition=partition)

    # --- transactions (only with a transactional_id)
    def transaction(self):
        """``async with producer.transaction():`` begins, then commits or aborts."""
        return self._producer.transaction()

    async def send_offsets_to_transaction(self, offsets: dict[TopicPartition, int], group_id: str) -> None:
        await self._producer.send_offsets_to_transaction(offsets, group_id)

    async def flush(self) -> None:
        await self._producer.flush()
