"""The producer wrapper against the real broker: what it does when a topic it wrote to is deleted."""

from __future__ import annotations

import logging

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from infra.connection import client_options
from infra.settings import Settings
from infra.topics import TopicAdmin
from producers.producer import EventProducer

pytestmark = pytest.mark.broker


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


async def test_a_deleted_topic_is_reported_once_then_forgotten(settings: Settings, unique: str) -> None:
    doomed, kept = f"test.doomed.{unique}", f"test.kept.{unique}"
    errors = _Records()
    logging.getLogger("aiokafka.cluster").addHandler(errors)
    try:
        async with EventProducer(settings) as producer:
            # created after the producer started, as a tenant's are for the roles: aiokafka then
            # names them in every metadata request (ones it saw at start it would not)
            async with TopicAdmin(settings) as admin:
                await admin.ensure_topic(doomed, 1)
                await admin.ensure_topic(kept, 1)
            await producer.send_raw(doomed, b"before")
            await producer.send_raw(kept, b"before")
            deleter = AIOKafkaAdminClient(**client_options(settings))
            await deleter.start()
            try:
                await deleter.delete_topics([doomed])
            finally:
                await deleter.close()
            client = producer._producer.client  # the refreshes a long-running role gets over hours
            for _ in range(4):
                await client.force_metadata_update()
            about_doomed = [m for m in errors.messages if doomed in m]
            assert len(about_doomed) <= 1, about_doomed  # aiokafka alone: one line per refresh
            assert (await producer.send_raw(kept, b"after")).offset == 1
            async with TopicAdmin(settings) as admin:  # the tenant comes back: writing tracks it again
                await admin.ensure_topic(doomed, 1)
            assert (await producer.send_raw(doomed, b"again")).offset == 0
    finally:
        logging.getLogger("aiokafka.cluster").removeHandler(errors)
