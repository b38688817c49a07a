"""The one Kafka producer wrapper: idempotent (acks=all), compressed, Avro-encoded.

``send`` encodes an ``Event`` with the codec and returns once the broker has
acknowledged it. ``send_raw`` publishes bytes as they are (the DLQ keeps the
original bytes of a record it could not decode). With a ``transactional_id``
the same class is the transactional producer of consume-transform-produce.

Topics deleted under it (a tenant that left) are forgotten after one INFO line
(``producers/deleted_topics.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.structs import RecordMetadata, TopicPartition

from infra.connection import client_options
from infra.settings import Settings
from producers.deleted_topics import WrittenTopics
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
        self.codec = codec or Codec.for_settings(settings)
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
        self._topics = WrittenTopics()

    async def start(self) -> None:
        # With a transactional id this also runs InitProducerId, fencing any
        # older producer (a zombie worker) that used the same id.
        await self._producer.start()
        self._topics.attach(self._producer.client)

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
        self._topics.add(topic)
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
        self._topics.add(topic)
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
