"""Test-session fixtures: ONE real Apache Kafka broker (the project's own local
broker) on free ports with its own data directory, stopped at the end of the
session whether the tests pass or fail. No Kafka mock or fake anywhere."""

from __future__ import annotations

import asyncio
import socket
import uuid
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from infra.broker import LocalBroker
from infra.errors import BrokerError
from infra.logging import configure_logging
from infra.settings import Settings
from infra.topics import TopicAdmin

_SESSION_BROKER: list[LocalBroker] = []  # the session's broker, once a module has asked for it


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def started_broker(home, **overrides) -> Iterator[LocalBroker]:
    """A local broker of the project's own on free ports under ``home``, stopped at the end."""
    for attempt in range(3):
        # A free port can be taken by someone else between our check and the broker's bind.
        settings = Settings(home=home, broker_port=free_port(), controller_port=free_port(),
                            max_attempts=2, retry_backoff_s=0.05, _env_file=None, **overrides)
        local = LocalBroker(settings)
        try:
            local.up()
            break
        except BrokerError:
            local.down()
            if attempt == 2:
                raise
    try:
        yield local
    finally:
        local.down()


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    configure_logging("INFO", "json")
    brokers = started_broker(tmp_path_factory.mktemp("joynexus-home"))
    local = next(brokers)
    _SESSION_BROKER.append(local)
    yield local
    _SESSION_BROKER.clear()
    next(brokers, None)  # stops it


@pytest.fixture(scope="module", autouse=True)
def _no_tenant_topics_after_the_module() -> Iterator[None]:
    """Each module leaves the session's broker without tenant topics. The roles of a later module
    subscribe by pattern to every tenant's topics, so earlier modules' idle tenants cost them CPU:
    80 idle tenants' topics made test_service.py 2.2x slower, its RL test 122 -> 330 s (one VM,
    2026-12-08), as slow as it was inside the whole suite (319 s)."""
    yield
    if _SESSION_BROKER:
        with ThreadPoolExecutor(1) as pool:  # the session's event loop may not be running here
            pool.submit(asyncio.run, _delete_tenant_topics(_SESSION_BROKER[0].settings)).result()


async def _delete_tenant_topics(settings: Settings) -> None:
    try:
        async with TopicAdmin(settings) as admin:
            topics = [topic for tenant in await admin.tenants()
                      for topic in await admin.tenant_topics(tenant)]
            await admin.delete_topics(topics)
    except Exception as exc:  # a later module then runs slower, not wrongly: say so, fail nothing
        warnings.warn(f"tenant topics left on the session broker: {type(exc).__name__}: {exc}",
                      stacklevel=1)


@pytest.fixture(scope="session")
def settings(broker: LocalBroker) -> Settings:
    return broker.settings


@pytest.fixture
def unique() -> str:
    """A short unique suffix for topic and group names, so tests never share state."""
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="session")
def model_root(tmp_path_factory: pytest.TempPathFactory):
    """Backbone presets are built once per test session, here."""
    torch.set_num_threads(1)
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def backbones(model_root):
    from backbone.model import Backbone

    return {name: Backbone.from_preset(name, model_root)
            for name in ("tiny", "tiny-paligemma", "tiny-llava", "tiny-qwen25vl", "tiny-qwen3vl",
                         "tiny-smolvlm")}
