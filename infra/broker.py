"""The local Apache Kafka broker: one KRaft node (broker + controller) on loopback.

Jars come from Maven Central through ``infra/kafka/pom.xml`` into
``<kafka_cache>/<version>/libs``; the broker runs on the machine's Java 17 with
its data, log file, config and pid file under ``<home>/kafka``. Storage is
formatted once and the cluster id is kept, so data survives ``down`` + ``up``.
``up`` is idempotent and ``down`` stops only the process this module started
(the pid file names it, and its command line must name our config file).

Secure profile (``broker_secure``, ``joynexus broker up --secure``): the client listener speaks
SASL_PLAINTEXT with SCRAM (the configured mechanism), the controller listener SASL/PLAIN (KRaft
controllers cannot check SCRAM: the credentials live in the metadata log they serve), and Kafka's
``StandardAuthorizer`` denies whatever no ACL allows. The super user ``admin_username`` is the
broker's own principal on both listeners; its SCRAM credential is written into the storage at
format time (``--add-scram``), because there is no one to create it later. After start the
service principal is (re)keyed with the ACLs of ``infra.acl_policy.service_acls``. Passwords come
from settings or are generated once and kept in ``<home>/kafka/secure.env`` (mode 600, the lines
a client sources); ``server.properties`` holds the admin password and is mode 600 too. The
profile is fixed when the storage is formatted: a work directory never switches profiles.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient
from pydantic import SecretStr

from infra.acl_policy import service_acls
from infra.connection import admin_settings, client_options
from infra.errors import BrokerError
from infra.logging import get_logger
from infra.security_admin import SCRAM_ITERATIONS, SecurityAdmin, salted_password
from infra.settings import Settings

__all__ = ["BrokerStatus", "LocalBroker"]

POM = Path(__file__).resolve().parent / "kafka" / "pom.xml"
LOG4J = Path(__file__).resolve().parent / "kafka" / "log4j.properties"
log = get_logger("infra.broker")


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    ready: bool
    pid: int | None
    bootstrap: str
    version: str
    data_dir: Path
    log_file: Path


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited child not yet reaped) is not a running broker.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


async def _describe_cluster(settings: Settings, timeout_ms: int = 3000) -> dict:
    admin = AIOKafkaAdminClient(**client_options(settings), request_timeout_ms=timeout_ms)
    try:
        await admin.start()
        return await admin.describe_cluster()
    finally:
        await admin.close()


def new_cluster_id() -> str:
    """Kafka's Uuid.randomUuid().toString(): url-safe base64 of 16 random bytes, unpadded, drawn again
    when it starts with "-" (the storage tool would read it as an option: 1 id in 64 failed the
    broker's first start)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (it may hold passwords)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an older file keeps its mode through O_TRUNC
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def _run_blocking(coro):
    """Run a coroutine to completion from sync code, also when the caller already runs an event
    loop (then in a helper thread with a loop of its own: ``asyncio.run`` refuses a nested loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="broker-check") as pool:
        return pool.submit(asyncio.run, coro).result()


class LocalBroker:
    """Fetch, format, start, check and stop the local single-node Kafka."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.root = settings.home / "kafka"
        self.data_dir = self.root / "data"
        self.log_dir = self.root / "logs"
        self.config_file = self.root / "server.properties"
        self.pid_file = self.root / "broker.pid"
        self.cluster_id_file = self.root / "cluster.id"
        self.libs = settings.kafka_cache / settings.kafka_version / "libs"
        self.bootstrap = f"{settings.broker_host}:{settings.broker_port}"
        self.secure = settings.broker_secure
        self.secrets_file = self.root / "secure.env"
        self.profile_file = self.root / "profile"

    # ------------------------------------------------------------------ fetch
    def fetch(self) -> Path:
        """Resolve the broker jars from Maven Central (once per version)."""
        marker = self.libs / ".complete"
        if marker.exists():
            return self.libs
        for tool in ("mvn", "java"):
            if shutil.which(tool) is None:
                raise BrokerError(f"`{tool}` is not on PATH; the local broker needs Java 17 and Maven")
        staging = self.libs.with_name(f"libs.tmp-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        log.info("fetching kafka jars", version=self.settings.kafka_version, into=str(self.libs))
        proc = subprocess.run(
            ["mvn", "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
             f"-Dkafka.version={self.settings.kafka_version}", f"-DoutputDirectory={staging}"],
            capture_output=True, text=True, check=False,
        )
        if proc.returncode != 0 or not any(staging.glob("kafka_2.13-*.jar")):
            tail = (proc.stdout + proc.stderr)[-2000:]
            raise BrokerError(f"maven could not resolve Kafka {self.settings.kafka_version}:\n{tail}")
        shutil.rmtree(self.libs, ignore_errors=True)
        staging.rename(self.libs)
        marker.write_text(self.settings.kafka_version)
        return self.libs

    # ----------------------------------------------------------------- status
    def pid(self) -> int | None:
        """Pid of the broker this module started, if it is still running."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        if not _pid_alive(pid):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return None
        # The pid may have been reused by an unrelated process since we wrote it.
        return pid if "kafka.Kafka" in cmdline and str(self.config_file) in cmdline else None

    def ready(self) -> bool:
        """Whether the broker answers a real request (DescribeCluster), not just a port."""
        if not _port_open(self.settings.broker_host, self.settings.broker_port):
            return False
        quiet = logging.getLogger("aiokafka")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)  # connection refusals are expected while polling
        try:
            _run_blocking(_describe_cluster(self.check_settings()))
        except Exception:
            return False
        finally:
            quiet.setLevel(level)
        return True

    def status(self) -> BrokerStatus:
        pid = self.pid()
        return BrokerStatus(
            running=pid is not None, ready=pid is not None and self.ready(), pid=pid,
            bootstrap=self.bootstrap, version=self.settings.kafka_version,
            data_dir=self.data_dir, log_file=self.log_dir / "server.log",
        )

    # --------------------------------------------------------------------- up
    def up(self) -> BrokerStatus:
        """Start the broker unless it already runs; return once it answers requests."""
        pid = self.pid()
        if pid is None:
            self._clean_stale_pid()
            if _port_open(self.settings.broker_host, self.settings.broker_port):
                raise BrokerError(
                    f"port {self.settings.broker_port} is taken by a process joynexus did not "
                    "start; stop it or set JOYNEXUS_BROKER_PORT"
                )
            self.fetch()
            self._check_profile()
            self._write_config()
            self._format_once()
            pid = self._spawn()
        else:
            log.info("broker already running", pid=pid, bootstrap=self.bootstrap)
        self._wait_ready(pid)
        if self.secure:
            _run_blocking(self._grant_service())
        return self.status()

    # ------------------------------------------------------------ secure profile
    def _check_profile(self) -> None:
        if not (self.data_dir / "meta.properties").exists():
            return
        formatted = self.profile_file.read_text().strip() if self.profile_file.exists() else "plain"
        wanted = "secure" if self.secure else "plain"
        if formatted != wanted:
            raise BrokerError(
                f"the broker storage in {self.data_dir} was formatted for the {formatted} profile; "
                f"{'`--secure` needs' if self.secure else 'a plain broker needs'} a work directory "
                "of its own (set JOYNEXUS_HOME), so no data changes its security by accident")

    def secrets(self) -> dict[str, str]:
        """The secure broker's credentials (admin and service), created once and kept mode 600.
        Passwords given in settings win over stored ones only when the storage is new."""
        stored: dict[str, str] = {}
        if self.secrets_file.exists():
            for line in self.secrets_file.read_text().splitlines():
                key, sep, value = line.partition("=")
                if sep and not key.startswith("#"):
                    stored[key.strip()] = value.strip()
        if "JOYNEXUS_ADMIN_PASSWORD" in stored:
            return stored
        s = self.settings
        service_pw = (s.sasl_password.get_secret_value()
                      if s.sasl_password and s.sasl_username == s.service_username else None)
        values = {
            "JOYNEXUS_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "JOYNEXUS_SASL_MECHANISM": s.sasl_mechanism,
            "JOYNEXUS_SASL_USERNAME": s.service_username,
            "JOYNEXUS_SASL_PASSWORD": service_pw or secrets.token_urlsafe(24),
            "JOYNEXUS_ADMIN_USERNAME": s.admin_username,
            "JOYNEXUS_ADMIN_PASSWORD": (s.admin_password.get_secret_value() if s.admin_password
                                        else secrets.token_urlsafe(24)),
        }
        self.root.mkdir(parents=True, exist_ok=True)
        body = "# Written by `joynexus broker up --secure`: the service principal and the super user.\n"
        body += "".join(f"{k}={v}\n" for k, v in values.items())
        _write_private(self.secrets_file, body)
        return values

    def check_settings(self) -> Settings:
        """Settings this module's own checks connect with (the super user when secure)."""
        if not self.secure:
            return self.settings.model_copy(update={"bootstrap_servers": self.bootstrap,
                                                    "security_protocol": "PLAINTEXT"})
        return admin_settings(self.settings.model_copy(update={
            "bootstrap_servers": self.bootstrap,
            "admin_password": SecretStr(self.secrets()["JOYNEXUS_ADMIN_PASSWORD"])}))

    def service_settings(self) -> Settings:
        """Settings of a role process on this broker: authenticated as the service principal."""
        if not self.secure:
            return self.settings
        values = self.secrets()
        return self.settings.model_copy(update={
            "security_protocol": "SASL_PLAINTEXT", "sasl_username": values["JOYNEXUS_SASL_USERNAME"],
            "sasl_password": SecretStr(values["JOYNEXUS_SASL_PASSWORD"]),
            "admin_password": SecretStr(values["JOYNEXUS_ADMIN_PASSWORD"])})

    async def _grant_service(self) -> None:
        values = self.secrets()
        settings = self.check_settings()
        async with SecurityAdmin(settings) as admin:
            await admin.upsert_user(values["JOYNEXUS_SASL_USERNAME"], values["JOYNEXUS_SASL_PASSWORD"])
            await admin.create_acls(service_acls(settings))
        log.info("service principal ready", user=values["JOYNEXUS_SASL_USERNAME"])

    def _clean_stale_pid(self) -> None:
        if self.pid_file.exists():
            log.warning("removing stale pid file", path=str(self.pid_file))
            self.pid_file.unlink(missing_ok=True)

    def _write_config(self) -> None:
        s = self.settings
        host, port, cport = s.broker_host, s.broker_port, s.controller_port
        self.root.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.secure:
            listeners = self._secure_listeners()
        else:
            listeners = [
                f"listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{cport}",
                f"advertised.listeners=PLAINTEXT://{host}:{port}",
                "controller.listener.names=CONTROLLER",
                "inter.broker.listener.name=PLAINTEXT",
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            ]
        _write_private(self.config_file, "\n".join([
            "# Written by `joynexus broker up`; edits are overwritten.",
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@{host}:{cport}",
            *listeners,
            f"log.dirs={self.data_dir}",
            "num.partitions=3",
            # One node: internal topics cannot be replicated; few partitions start faster.
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=10",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=10",
            "group.initial.rebalance.delay.ms=0",
            # The controller appends a no-op record to the metadata log this often so that brokers
            # can tell a live controller from a stale one; with one node there is nobody to tell,
            # and at 500 ms (the default) it was a third of an idle broker's CPU (3.8% -> 2.4% of a core).
            "metadata.max.idle.interval.ms=5000",
            # Topics are provisioned on purpose (infra.topics): a typo must fail, not create.
            "auto.create.topics.enable=false",
            "message.max.bytes=8388608",
            "",
        ]))

    def _secure_listeners(self) -> list[str]:
        s = self.settings
        host, port, cport = s.broker_host, s.broker_port, s.controller_port
        user, password = s.admin_username, self.secrets()["JOYNEXUS_ADMIN_PASSWORD"]
        mech = s.sasl_mechanism
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule"
        plain = "org.apache.kafka.common.security.plain.PlainLoginModule"
        return [
            f"listeners=SASL_PLAINTEXT://{host}:{port},CONTROLLER://{host}:{cport}",
            f"advertised.listeners=SASL_PLAINTEXT://{host}:{port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=SASL_PLAINTEXT",
            "listener.security.protocol.map=SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT",
            f"sasl.enabled.mechanisms={mech}",
            f"sasl.mechanism.inter.broker.protocol={mech}",
            f"listener.name.sasl_plaintext.{mech.lower()}.sasl.jaas.config={scram} required "
            f'username="{user}" password="{password}";',
            "sasl.mechanism.controller.protocol=PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms=PLAIN",
            f"listener.name.controller.plain.sasl.jaas.config={plain} required "
            f'username="{user}" password="{password}" user_{user}="{password}";',
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            f"super.users=User:{user}",
            "allow.everyone.if.no.acl.found=false",
        ]

    def _format_once(self) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        # An id starting with "-" never formatted anything (the tool reads it as an option): replace it.
        if not self.cluster_id_file.exists() or self.cluster_id_file.read_text().startswith("-"):
            self.cluster_id_file.write_text(new_cluster_id())
        cid = self.cluster_id_file.read_text().strip()
        scram = []
        if self.secure:  # the super user's credential, salted here: no cleartext on a command line
            salt = os.urandom(32)
            hashed = salted_password(self.secrets()["JOYNEXUS_ADMIN_PASSWORD"], salt,
                                     self.settings.sasl_mechanism, SCRAM_ITERATIONS)
            b64 = base64.b64encode
            scram = ["--add-scram", f"{self.settings.sasl_mechanism}=[name={self.settings.admin_username},"
                     f'iterations={SCRAM_ITERATIONS},salt="{b64(salt).decode()}",'
                     f'saltedpassword="{b64(hashed).decode()}"]']
        proc = subprocess.run(
            [*self._java(), "kafka.tools.StorageTool", "format", "-t", cid,
             "-c", str(self.config_file), "--ignore-formatted", *scram],
            capture_output=True, text=True, check=False,
        )
        if proc.returncode != 0:
            raise BrokerError(f"formatting KRaft storage failed:\n{(proc.stdout + proc.stderr)[-2000:]}")
        self.profile_file.write_text("secure" if self.secure else "plain")
        log.info("formatted kraft storage", cluster_id=cid, data_dir=str(self.data_dir))

    def _java(self) -> list[str]:
        return ["java", f"-Xmx{self.settings.broker_heap}", "-Xms128m",
                f"-Dkafka.logs.dir={self.log_dir}", f"-Dlog4j.configuration=file:{LOG4J}",
                "-cp", f"{self.libs}/*"]

    def _spawn(self) -> int:
        stdout = open(self.log_dir / "stdout.log", "ab")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(
            [*self._java(), "kafka.Kafka", str(self.config_file)],
            stdout=stdout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the shell must not take the broker down
        )
        stdout.close()
        self.pid_file.write_text(str(proc.pid))
        log.info("broker starting", pid=proc.pid, bootstrap=self.bootstrap,
                 version=self.settings.kafka_version)
        return proc.pid

    def _wait_ready(self, pid: int) -> None:
        deadline = time.monotonic() + self.settings.broker_start_timeout_s
        while time.monotonic() < deadline:
            if not _pid_alive(pid):
                self.pid_file.unlink(missing_ok=True)
                raise BrokerError(f"broker exited during start-up; last log lines:\n{self.logs(40)}")
            if self.ready():
                log.info("broker ready", pid=pid, bootstrap=self.bootstrap)
                return
            time.sleep(0.5)
        raise BrokerError(
            f"broker (pid {pid}) did not answer on {self.bootstrap} within "
            f"{self.settings.broker_start_timeout_s:.0f}s; see {self.log_dir / 'server.log'}"
        )

    # ------------------------------------------------------------------- down
    def down(self, timeout_s: float = 30.0) -> bool:
        """Stop the broker this module started. Returns whether one was running."""
        pid = self.pid()
        if pid is None:
            self._clean_stale_pid()
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _pid_alive(pid):
            log.warning("broker ignored SIGTERM; killing", pid=pid)
            os.kill(pid, signal.SIGKILL)
            while _pid_alive(pid):
                time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)
        log.info("broker stopped", pid=pid)
        return True

    # ------------------------------------------------------------------- logs
    def logs(self, lines: int = 100) -> str:
        chunks = []
        for name in ("stdout.log", "server.log"):
            path = self.log_dir / name
            if path.exists():
                with path.open("rb") as fh:
                    fh.seek(0, os.SEEK_END)
                    fh.seek(max(0, fh.tell() - 200 * lines))
                    text = fh.read().decode(errors="replace").splitlines()[-lines:]
                chunks.append("\n".join(text))
        return "\n".join(c for c in chunks if c)
