"""The secure broker profile against a real broker with SASL/SCRAM and the standard authorizer: a
second local broker (its own home and ports) started by this module, every role of the service
authenticated as the service principal, tenants provisioned by ``TenantManager``.

What a tenant is promised: with its credentials it can submit to its own jobs topic and read its
own topics, and nothing else (another tenant's topics, the shared service topics, the service's
consumer groups all answer with an authorization error); a tenant that floods is slowed to its
quota while another tenant's job completes; ``tenant delete`` leaves nothing of the tenant behind;
passwords appear once on the creating command's stdout and never in a log; a record whose envelope
names another tenant than its topic is dead-lettered as a security event and changes nothing; SFT
datasets are read only from the tenant's own datasets root."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    TopicAuthorizationFailedError,
)
from pydantic import SecretStr

from backbone.model import Backbone
from consumers.service import Service
from infra.broker import LocalBroker
from infra.connection import client_options
from infra.errors import BrokerError
from infra.runtime.host import RoleHost
from infra.runtime.tenancy import TenantExists, TenantManager
from infra.security_admin import SecurityAdmin
from infra.settings import Settings
from infra.topics import TopicAdmin, shared_topic, tenant_topic
from producers.client.sdk import Client
from producers.dataset.generate import generate_dataset
from producers.dataset.upload import install_dataset
from producers.producer import EventProducer
from schemas import events as ev
from tests.conftest import started_broker
from tests.helpers import dead_letters_from
from tests.service_helpers import SMALL_ENV, SMALL_RL

pytestmark = [pytest.mark.broker, pytest.mark.slow]

QUOTA = 32 * 1024  # bytes/s a tenant may produce, small so a flood shows within seconds
FLOOD_S = 12.0


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    yield from started_broker(tmp_path_factory.mktemp("secure-home"), broker_secure=True,
                              tenant_produce_byte_rate=QUOTA)


@pytest.fixture(scope="module")
def service_settings(secure_broker: LocalBroker) -> Settings:
    return secure_broker.service_settings().model_copy(update={"backbone": "tiny"})


def as_tenant(settings: Settings, tenant: str, password: str) -> Settings:
    """What a tenant's SDK/CLI runs with: its own user, no admin password."""
    return settings.model_copy(update={"sasl_username": tenant, "sasl_password": SecretStr(password),
                                       "admin_password": None})


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tenants(service_settings: Settings) -> dict[str, str]:
    async with TenantManager(service_settings) as tm:
        return {t: await tm.create(t) for t in ("alice", "bob", "flood")}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def service(service_settings: Settings, model_root, tenants) -> AsyncIterator[Service]:
    """Every role in this process, authenticated as the service principal."""
    backbone = await asyncio.to_thread(Backbone.from_preset, "tiny", model_root)
    svc = await Service.open(service_settings, backbone)
    supervisor = RoleHost(svc.settings, service=svc)
    await supervisor.start()
    try:
        yield svc
    finally:
        await supervisor.stop()
        await svc.close()
    assert all(n == 0 for n in supervisor.restarts.values()), f"roles crashed: {supervisor.restarts}"


def rl_spec(tenant: str, job_id: str) -> dict:
    return {"kind": "rl", "tenant": tenant, "job_id": job_id, "seed": 0, "env": SMALL_ENV, "rl": SMALL_RL}


async def _read_one(settings: Settings, topic: str, group: str | None) -> None:
    consumer = AIOKafkaConsumer(topic, **client_options(settings), group_id=group,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        await consumer.start()
        await consumer.getmany(timeout_ms=5000)
    finally:
        await consumer.stop()


# ---------------------------------------------------------------------------------------------- 1
def test_cli_prints_credentials_once_and_never_logs_them(secure_broker: LocalBroker) -> None:
    env = {**os.environ, **secure_broker.secrets(), "JOYNEXUS_HOME": str(secure_broker.settings.home),
           "JOYNEXUS_BROKER_PORT": str(secure_broker.settings.broker_port), "JOYNEXUS_LOG_LEVEL": "DEBUG"}
    cli = [sys.executable, "-m", "infra", "tenant"]
    made = subprocess.run([*cli, "create", "cli-made"], env=env, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    lines = dict(line.split("=", 1) for line in made.stdout.splitlines())
    password = lines["JOYNEXUS_SASL_PASSWORD"]
    assert lines["JOYNEXUS_SASL_USERNAME"] == "cli-made" and len(password) >= 24
    listed = subprocess.run([*cli, "list", "--json"], env=env, capture_output=True, text=True, timeout=120)
    deleted = subprocess.run([*cli, "delete", "cli-made", "--yes"], env=env, capture_output=True,
                             text=True, timeout=120)
    assert '"tenant": "cli-made"' in listed.stdout and deleted.returncode == 0, deleted.stderr[-2000:]
    secrets = [password, env["JOYNEXUS_ADMIN_PASSWORD"], env["JOYNEXUS_SASL_PASSWORD"]]
    assert made.stdout.count(password) == 1
    for run in (made, listed, deleted):
        for secret in secrets:
            assert secret not in run.stderr
    for secret in secrets[:1]:
        assert secret not in listed.stdout + deleted.stdout
    assert secrets[1] not in made.stdout


def test_a_work_directory_never_switches_profile(tmp_path) -> None:
    plain = LocalBroker(Settings(home=tmp_path, _env_file=None))
    plain.data_dir.mkdir(parents=True)
    (plain.data_dir / "meta.properties").write_text("formatted")  # as a plain `up` leaves it
    secure = LocalBroker(Settings(home=tmp_path, broker_secure=True, _env_file=None))
    with pytest.raises(BrokerError, match="plain profile"):
        secure._check_profile()
    plain._check_profile()  # the profile it was formatted with is fine


# ---------------------------------------------------------------------------------------------- 2
async def test_a_tenant_reaches_only_its_own_topics_while_its_job_runs(
        service_settings: Settings, tenants: dict[str, str], service: Service) -> None:
    alice = as_tenant(service_settings, "alice", tenants["alice"])
    async with Client(alice, requested_by="alice") as client:
        job = await client.submit(rl_spec("alice", "own-job"))

        # reading bob's rollouts, writing bob's jobs, reading a shared topic, joining a service group
        with pytest.raises(TopicAuthorizationFailedError):
            await _read_one(alice, tenant_topic(alice, "bob", "rollouts"), None)
        with pytest.raises(TopicAuthorizationFailedError):
            await client.submit_raw("bob", "forged", "RL", "{}")
        for shared in ("usage", "health", "dlq", "tenants"):
            with pytest.raises(TopicAuthorizationFailedError):
                await _read_one(alice, shared_topic(alice, shared), None)
        for group in ("master", "inference", "optimizer.alice"):
            with pytest.raises(GroupAuthorizationFailedError):
                await _read_one(alice, tenant_topic(alice, "alice", "status"), group)
        # writing its own status (only the service may) is refused too
        async with EventProducer(alice) as producer:
            with pytest.raises(TopicAuthorizationFailedError):
                await producer.send(tenant_topic(alice, "alice", "status"), ev.JobCancelled(
                    envelope=ev.Envelope(tenant_id="alice", producer_id="forger"), job_id="own-job",
                    requested_by="forger", reason=None), key="alice")
        # a consumer group of its own prefix is allowed
        await _read_one(alice, tenant_topic(alice, "alice", "status"), "nexus.t.alice.watcher")

        state = await client.follow(job, timeout_s=240)
        assert state.phase == "completed", state.reason
        assert state.policy_version == 3
        # alice's job book sees only alice's topics
        assert {s.tenant for s in client.book.of_tenant("alice")} == {"alice"}
        assert client.book.of_tenant("bob") == []


# ---------------------------------------------------------------------------------------------- 3
async def test_a_flooding_tenant_is_throttled_while_another_completes(
        service_settings: Settings, tenants: dict[str, str], service: Service) -> None:
    flood = as_tenant(service_settings, "flood", tenants["flood"])
    bob = as_tenant(service_settings, "bob", tenants["bob"])
    sent = 0
    async with Client(bob, requested_by="bob") as client:
        job = await client.submit(rl_spec("bob", "beside-a-flood"))
        async with EventProducer(flood) as producer:
            topic = tenant_topic(flood, "flood", "jobs")
            started = time.monotonic()
            while time.monotonic() - started < FLOOD_S:
                # distinct random bytes: compression must not shrink the flood on the wire. Not
                # events: the master dead-letters each one, losing nothing.
                records = [os.urandom(1024) for _ in range(16)]
                await asyncio.gather(*(producer.send_raw(topic, r) for r in records))
                sent += sum(map(len, records))
            elapsed = time.monotonic() - started
        # The broker measures a user's rate over quota.window.num (11) samples of 1 s, so a burst
        # of up to ~11 s worth of quota passes before throttling; beyond that it holds the rate.
        allowed = QUOTA * (elapsed + 11)
        print(f"flood: {sent} B acknowledged in {elapsed:.1f} s ({sent / elapsed:.0f} B/s); quota "
              f"{QUOTA} B/s allows at most ~{allowed:.0f} B")
        assert sent <= allowed, (sent, allowed)
        state = await client.follow(job, timeout_s=240)
        assert state.phase == "completed", state.reason


# ---------------------------------------------------------------------------------------------- 4
async def test_tenant_delete_leaves_nothing(service_settings: Settings, tenants, service: Service) -> None:
    """While the service runs (its roles subscribe to every tenant's topics by pattern)."""
    async with TenantManager(service_settings) as tm:
        password = await tm.create("gone")
        with pytest.raises(TenantExists):
            await tm.create("gone")
        gone = as_tenant(service_settings, "gone", password)
        async with EventProducer(gone) as producer:  # the credentials work before the delete
            await producer.send_raw(tenant_topic(gone, "gone", "jobs"), b"x")
        files = [service_settings.policy_dir / "gone" / "v00000001" / "meta.json",
                 service_settings.datasets_root / "gone" / "demo" / "index.json"]
        for path in files:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("{}")

        removed = await tm.delete("gone")
        assert removed["credentials"] == 1 and removed["topics"] == 9 and removed["acls"] == 5, removed
        info = await tm.info("gone")
        assert not info.has_credentials and info.topics == [] and info.acls == [] and info.quotas == {}
        assert "gone" not in {i.tenant for i in await tm.list()}
        assert not any(p.exists() for p in files)
        assert not (service_settings.policy_dir / "gone").exists()
        assert await tm.delete("gone") == {"credentials": 0, "topics": 0, "acls": 0, "quotas": 0,
                                           "tensor_blobs": 0, "checkpoint_dirs": 0, "dataset_dirs": 0}
    async with TopicAdmin(service_settings) as admin:
        assert await admin.tenant_topics("gone") == []
    async with SecurityAdmin(tm.admin) as sec:
        assert "gone" not in await sec.users()
    with pytest.raises(KafkaConnectionError):  # the old password is dead: no bootstrap
        async with EventProducer(gone) as producer:
            await producer.send_raw(tenant_topic(gone, "alice", "jobs"), b"x")


# ---------------------------------------------------------------------------------------------- 5
async def test_a_forged_envelope_is_dead_lettered_and_changes_nothing(
        service_settings: Settings, tenants: dict[str, str], service: Service) -> None:
    """alice may write her own jobs topic, and puts bob in the envelope of a cancel for bob's
    running job: the roles take the tenant from the topic, so it is a security event, not a cancel."""
    alice = as_tenant(service_settings, "alice", tenants["alice"])
    bob = as_tenant(service_settings, "bob", tenants["bob"])
    async with Client(bob, requested_by="bob") as bobs, EventProducer(alice) as forger:
        job = await bobs.submit(rl_spec("bob", "not-yours-to-cancel"))
        forged = ev.JobCancelled(envelope=ev.Envelope(tenant_id="bob", producer_id="client/bob"),
                                 job_id=job.job_id, requested_by="bob", reason="forged")
        sent = await forger.send(tenant_topic(alice, "alice", "jobs"), forged, key="bob")
        state = await bobs.follow(job, timeout_s=240)
        assert state.phase == "completed" and not state.cancel_requested, state

    source = tenant_topic(alice, "alice", "jobs")
    letters = [dict(r.headers) for r in await dead_letters_from(service_settings, source)]
    mine = [h for h in letters if h["dlq.source.offset"] == str(sent.offset).encode()]
    assert len(mine) == 1, letters
    assert mine[0]["dlq.stage"] == b"security" and mine[0]["dlq.error.class"] == b"TenantMismatch", mine
    assert service.book.get("bob", job.job_id).cancel_requested is False  # the roles' read model too


# ---------------------------------------------------------------------------------------------- 6
async def test_datasets_come_only_from_the_tenants_datasets_root(
        service_settings: Settings, tenants: dict[str, str], service: Service, tmp_path) -> None:
    alice = as_tenant(service_settings, "alice", tenants["alice"])
    demos = tmp_path / "reach"
    await asyncio.to_thread(generate_dataset, "joynexus/Reach-v0", demos, episodes=3, seed=5,
                            image_size=32, max_episode_steps=10, progress=False)
    bobs = install_dataset(demos, service_settings.datasets_root, "bob", "reach")
    install_dataset(demos, service_settings.datasets_root, "alice", "reach")

    def sft(job_id: str, path: str) -> dict:
        return {"kind": "sft", "tenant": "alice", "job_id": job_id, "dataset": {"path": path},
                "sft": {"epochs": 1, "batch_size": 8}}

    async with Client(alice, requested_by="alice") as client:
        for job_id, path in (("abs-outside", str(demos)), ("other-tenant", str(bobs)),
                             ("climbs-out", "../bob/reach"), ("secret", "/etc")):
            state = await client.follow(await client.submit(sft(job_id, path)), timeout_s=120)
            assert state.phase == "rejected" and state.reason.startswith("dataset.path:"), state.reason
        done = await client.follow(await client.submit(sft("installed", "reach")), timeout_s=240)
        assert done.phase == "completed", done.reason
