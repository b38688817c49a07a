"""The producer wrapper against the real broker: what it does when a topic it wrote to is deleted."""

from __future__ import annotations

import asyncio
import logging

import pytest

from infra.settings import Settings
from infra.topics import TopicAdmin
from producers.producer import EventProducer
from tests.helpers import LogRecords

pytestmark = pytest.mark.broker


async def test_a_deleted_topic_is_reported_once_at_info_then_forgotten(
        settings: Settings, unique: str) -> None:
    doomed, kept = f"test.doomed.{unique}", f"test.kept.{unique}"
    lines = LogRecords()
    logging.getLogger("aiokafka.cluster").addHandler(lines)
    try:
        async with EventProducer(settings) as producer:
            # created after the producer started, as a tenant's are for the roles: aiokafka then
            # names them in every metadata request (ones it saw at start it would not)
            async with TopicAdmin(settings) as admin:
                await admin.ensure_topic(doomed, 1)
                await admin.ensure_topic(kept, 1)
            await producer.send_raw(doomed, b"before")
            await producer.send_raw(kept, b"before")
            async with TopicAdmin(settings) as admin:
                await admin.delete_topics([doomed])
            client = producer._producer.client  # the refreshes a long-running role gets over hours
            for _ in range(50):
                await client.force_metadata_update()
                if doomed not in client.cluster.topics():
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail(f"{doomed} still listed after its deletion")
            for _ in range(3):
                await client.force_metadata_update()
            about_doomed = [(r.levelno, r.getMessage()) for r in lines.records if doomed in r.getMessage()]
            # aiokafka alone: an ERROR at each of the 4 refreshes since the deletion showed
            assert about_doomed == [(logging.INFO, f"Topic {doomed} not found in cluster metadata "
                                                   "(deleted since this process saw it)")]
            assert (await producer.send_raw(kept, b"after")).offset == 1
            async with TopicAdmin(settings) as admin:  # the tenant comes back: writing tracks it again
                await admin.ensure_topic(doomed, 1)
            assert (await producer.send_raw(doomed, b"again")).offset == 0
    finally:
        logging.getLogger("aiokafka.cluster").removeHandler(lines)


async def test_a_topic_never_seen_stays_an_error(settings: Settings, unique: str) -> None:
    missing = f"test.never.{unique}"  # a typo: no producer of this process ever saw it exist
    lines = LogRecords()
    logging.getLogger("aiokafka.cluster").addHandler(lines)
    try:
        async with EventProducer(settings) as producer:
            producer._producer.client.add_topic(missing)
            await producer._producer.client.force_metadata_update()
        levels = {r.levelno for r in lines.records if missing in r.getMessage()}
        assert levels == {logging.ERROR}
    finally:
        logging.getLogger("aiokafka.cluster").removeHandler(lines)
