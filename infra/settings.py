"""All joynexus settings, in one pydantic-settings class.

Every field can be set from the environment with the ``JOYNEXUS_`` prefix
(``JOYNEXUS_BROKER_PORT=19092``) or from a ``.env`` file in the working directory.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "get_settings"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="JOYNEXUS_", env_file=".env", extra="ignore")

    # --- where things live
    datasets_dir: Path | None = Field(
        None, description="The only place SFT datasets are read from: a job names a dataset by its "
        "path relative to <datasets_root>/<tenant>/. Default <home>/datasets.")
    home: Path = Field(Path(".joynexus"), description="Work directory: broker data, logs, pid files.")
    kafka_cache: Path = Field(
        Path.home() / ".cache" / "joynexus" / "kafka",
        description="Where the Maven-resolved Kafka jars are kept, one folder per version.",
    )

    # --- the local broker (`joynexus broker ...`)
    kafka_version: str = Field("3.9.2", description="Apache Kafka version the local broker runs.")
    broker_host: str = "127.0.0.1"
    broker_port: int = Field(9092, ge=1, le=65535)
    controller_port: int = Field(9093, ge=1, le=65535)
    broker_heap: str = Field("512m", description="JVM -Xmx of the local broker.")
    broker_start_timeout_s: float = 90.0

    # --- clients
    bootstrap_servers: str | None = Field(
        None, description="Kafka bootstrap address; defaults to the local broker's."
    )
    client_id: str = "joynexus"
    schema_registry_url: str | None = Field(
        None, description="Confluent-compatible registry; switches the codec to Confluent framing."
    )
    compression_type: Literal["gzip", "snappy", "lz4", "zstd"] | None = "zstd"
    request_timeout_ms: int = 40_000
    # 0: the inference queue is latency-bound; under load the producer still batches
    # whatever accumulates while a request is in flight.
    producer_linger_ms: int = Field(0, ge=0)
    # Handlers run CPU work in a thread (see consumers.bus.loop), so the poll interval
    # only needs to cover one batch of slow handlers, not the event loop's stalls.
    max_poll_interval_ms: int = 300_000
    # aiokafka has no static membership: a killed member's partitions move only when its
    # session expires. 8 s (the broker's minimum is 6 s) lets a killed role's work resume
    # within about 10 s; handlers never block the loop (they run in threads), so the group
    # heartbeats keep up.
    session_timeout_ms: int = 8_000
    heartbeat_interval_ms: int = 1_500
    max_poll_records: int = 200
    # How long the broker holds a fetch that finds nothing new (a record arriving answers it at
    # once). Longer waits mean fewer empty fetches, each naming every assigned partition: with
    # 28 tenants' topics an idle service took 40.3% of one core at 500 ms, 23.9% at 5 s
    # (benchmarks/idle_cost.py). infra/longpoll.py keeps a held fetch from delaying anything else
    # (end offsets, metadata, prefetched partitions, seeks): before its seek rule, 5 s made the env
    # workers' rebalance listener outlast the group session (test_a_killed_env_worker_...).
    fetch_max_wait_ms: int = Field(5_000, ge=0)
    # How often a pattern subscription (every tenant's topics of a stream: group consumers and
    # read-model followers) re-reads the cluster's metadata to see new tenants' topics. Each read
    # lists EVERY topic of the cluster (aiokafka), so it costs the broker and the client O(topics):
    # 4.3 ms of client CPU at 114 topics (2026-12-01). A follower that must see a topic now
    # (TopicFollower.caught_up) asks at once instead of waiting for the next read.
    pattern_refresh_ms: int = Field(5_000, ge=100)
    # How long the roles' read models (the job book, the health view) and the evaluator's rollouts
    # reader let records gather before they read again (infra/follow.py, settle_s). Every fetch
    # cycle names every assigned partition (28 tenants: 140 for the job book); at one cycle per
    # record or two, one job book cost 1.5% of a core in a benchmark's shared pass (~1.7 ms a
    # cycle), and six processes keep one. A caller that must see its own write (``caught_up``,
    # ``JobBook.sync``) waits for no settling.
    read_model_settle_ms: int = Field(500, ge=0)

    # --- security (infra/connection.py builds every client's options from these)
    # PLAINTEXT: no authentication (the default local broker). SASL_PLAINTEXT: SCRAM over TCP, as
    # the secure local broker (`joynexus broker up --secure`) listens; TLS is not configured here.
    security_protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT"] = "PLAINTEXT"
    sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256"] = "SCRAM-SHA-512"
    sasl_username: str | None = Field(
        None, description="Who this process is on a secure broker: the service principal for the "
        "roles, a tenant's user for the SDK/CLI (`joynexus tenant create` prints it).")
    sasl_password: SecretStr | None = Field(None, description="Never logged or printed (SecretStr).")
    admin_username: str = Field(
        "admin", description="Super user of a secure broker: inter-broker and controller traffic, "
        "and `joynexus tenant create|delete` (SCRAM, ACLs, quotas).")
    admin_password: SecretStr | None = None
    service_username: str = Field("service", description="The principal the service roles use.")
    broker_secure: bool = Field(
        False, description="Start the local broker with SASL/SCRAM listeners and the standard "
        "authorizer (same as `joynexus broker up --secure`).")
    tenant_produce_byte_rate: int = Field(
        1024 * 1024, ge=1024, description="Kafka quota per tenant user: bytes/s it may produce.")
    tenant_fetch_byte_rate: int = Field(
        8 * 1024 * 1024, ge=1024, description="Kafka quota per tenant user: bytes/s it may fetch.")

    # --- topics
    topic_prefix: str = Field(
        "nexus", pattern=r"^[a-z0-9][a-z0-9-]{0,31}$",
        description="First part of every topic name: lowercase letters, digits, hyphens; no dot, "
        "because dots separate the parts of a name (infra/topics.py parses them).")
    partitions: int = Field(3, ge=1, description="Partitions of session-keyed and shared topics.")
    features_retention_ms: int = Field(
        3 * 24 * 3600 * 1000, description="Feature batches are derived data: kept 3 days by default."
    )
    retention_ms: int = Field(7 * 24 * 3600 * 1000, description="Default retention of event topics.")
    dlq_retention_ms: int = Field(30 * 24 * 3600 * 1000)

    # --- processing
    max_attempts: int = Field(3, ge=1, description="Handler attempts before a record goes to the DLQ.")
    retry_backoff_s: float = 0.2

    # --- compute
    backbone: str = Field("small", description="Backbone preset name or a local HF checkpoint directory.")
    device: str = Field("auto", description="auto (CUDA when present, else CPU), cpu, cuda, cuda:1 ...")
    dtype: str = Field("auto", description="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16 ...")
    torch_threads: int = Field(
        1, ge=0, description="torch CPU threads per process; 0 keeps torch's default. Roles share "
        "the cores, and oversubscribed OpenMP threads busy-wait (measured 50x slower steps).")

    # --- env role
    env_isolation: Literal["auto", "thread", "process"] = Field(
        "auto", description="thread: simulators step in the env worker's process (fast; a hung "
        "native call can only be abandoned). process: each session's simulator in a child process "
        "(a segfault, a hang or a GIL-holding native call costs that process only). auto: process "
        "for ManiSkill (SAPIEN's start-up held the GIL long enough to stop heartbeats), thread else.")

    # --- service roles
    inference_target_batch: int = Field(8, ge=1, description="Inference groups flush at B requests...")
    inference_max_wait_ms: float = Field(50.0, ge=0, description=(
        "...or when the oldest waited T ms (or sooner: once every recently answered session asked "
        "again, or each one still expected is due only after T, by its last round trip). Quick demo: "
        "5 ms gave 2.7 rows per forward, 50 ms with that rule 5.8 and a shorter run."))
    train_max_batch_jobs: int = Field(16, ge=1, description="Gradient jobs grouped into one forward.")
    train_forward_budget_ms: float | None = Field(
        200.0, gt=0, description="Longest a training forward may hold the device (rows split into chunks "
        "sized to it, so inference goes between them); unset: one forward per group.")
    train_max_wait_ms: float | None = Field(
        2000.0, ge=0, description="A training forward that waited this long goes before queued inference "
        "(inference first, but training never starves); unset: inference always first.")
    train_feature_cache_mb: float = Field(
        512.0, ge=0, description="The device host keeps features by content up to this size, so PPO and SFT "
        "epochs forward each distinct input once; 0: off.")
    feature_cache_from_inference: bool = Field(
        True, description="Inference puts the features it computes when acting into that cache, so RL "
        "training reuses them instead of forwarding the rollout's observations again (bit-identical: a "
        "row's features do not depend on its group). Off: training forwards each input once itself.")
    feature_cache_scope: Literal["tenant", "content"] = Field(
        "tenant", description="tenant: a cached feature serves only the tenant whose input it was (no "
        "tenant learns from its step times what another sent; each costs the device what it would "
        "alone). content: identical inputs of different tenants share one entry.")
    policy_cache: int = Field(16, ge=1, description="Tenant policy versions the inference role keeps loaded.")
    step_trace: bool = Field(
        False, description="The inference role appends each answered step's stage times (bus in, lookup, "
        "device, head, ack) to <home>/timelines/<instance>.steps.jsonl (consumers/step_trace.py).")
    usage_flush_s: float = Field(
        5.0, gt=0, description="How often the inference role publishes its per-tenant device-seconds.")
    metering_window_s: int = Field(
        60, ge=1, description="Tumbling window of the metering tables; `joynexus usage --window` "
        "sums whole windows, so it must be a multiple of this.")
    tensor_inline_max_bytes: int = Field(
        256 * 1024, ge=0, description="Feature tensors above this size travel by reference (tensor store).")

    # --- health and supervision (`joynexus up`, the health role)
    heartbeat_s: float = Field(2.0, gt=0, description="Every role instance heartbeats this often.")
    health_timeout_s: float = Field(
        8.0, gt=0, description="An instance whose heartbeats stop this long is declared DEAD.")
    stall_timeout_s: float = Field(
        60.0, gt=0, description="An instance that heartbeats but makes no progress this long while work "
        "waits (consumer lag or work held) is declared HUNG. Longer than the slowest legitimate step.")
    restart_backoff_s: float = Field(1.0, ge=0, description="First restart delay; doubles per quick restart.")
    restart_backoff_max_s: float = Field(30.0, ge=0, description="Ceiling of the restart delay.")
    stable_after_s: float = Field(
        60.0, gt=0, description="An instance that ran this long without dying resets its back-off.")
    env_min: int = Field(1, ge=0, description="Fewest env workers the supervisor keeps on this machine.")
    env_max: int = Field(3, ge=1, description="Most env workers it scales up to (more than the "
                         "partitions of a sessions topic never helps).")
    env_sessions_per_worker: int = Field(
        4, ge=1, description="Scale env workers so that each hosts about this many running sessions.")
    env_scale_down_after_s: float = Field(
        120.0, ge=0, description="Env workers are retired only after fewer would have done for this long: "
        "a sync RL job's pause between iterations (its update) must not shuffle its sessions (with 20 s, "
        "a mini-pretrained demo scaled 2 -> 3 -> 2 every iteration, and each rebalance restarted sessions "
        "and cost their steps a 10 s re-ask).")
    stop_grace_s: float = Field(15.0, gt=0, description="SIGTERM to SIGKILL, when stopping processes.")
    cpu_affinity: dict[str, list[int]] = Field(
        default_factory=dict, description="CPU ids per process kind for `joynexus up`'s children, e.g. "
        '{"device": [0], "rest": [1]} (`up --cpus device=0,rest=1`): "rest" covers every kind not named, '
        "a kind covered by neither runs on any CPU. Each child pins itself at start, so a restarted one "
        "keeps its CPUs. With the device host alone on its core, its busy time is the device's, as on a "
        "GPU machine, not time lost to simulators on the same core. Empty: no pinning.")

    # --- logging
    log_level: str = "INFO"
    log_format: Literal["json", "console"] = "json"

    @field_validator("home", "kafka_cache")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @field_validator("cpu_affinity")
    @classmethod
    def _cpu_ids(cls, value: dict[str, list[int]]) -> dict[str, list[int]]:
        for kind, cpus in value.items():
            if not cpus or any(c < 0 for c in cpus):
                raise ValueError(f"cpu_affinity[{kind!r}] must list CPU ids >= 0, got {cpus}")
        return value

    @model_validator(mode="after")
    def _credentials_go_together(self) -> Settings:
        if self.security_protocol != "PLAINTEXT" and not (self.sasl_username and self.sasl_password):
            raise ValueError(f"security_protocol={self.security_protocol} needs sasl_username and "
                             "sasl_password (JOYNEXUS_SASL_USERNAME / JOYNEXUS_SASL_PASSWORD)")
        return self

    @property
    def secure(self) -> bool:
        """Whether clients authenticate (SASL) to the broker."""
        return self.security_protocol != "PLAINTEXT"

    def as_env(self) -> dict[str, str]:
        """These settings as ``JOYNEXUS_*`` variables, so that a child process (``joynexus up``
        starts one per role instance) runs with exactly the settings of its parent."""
        env = {}
        for name, value in self.model_dump(mode="json").items():
            if value is not None:
                env[f"JOYNEXUS_{name.upper()}"] = value if isinstance(value, str) else json.dumps(value)
        # model_dump masks SecretStr ("**********"); a child needs the real credentials. They go
        # into its environment only (the supervisor's children), never into a log line.
        for name in ("sasl_password", "admin_password"):
            secret = getattr(self, name)
            if secret is not None:
                env[f"JOYNEXUS_{name.upper()}"] = secret.get_secret_value()
        return env

    @property
    def bootstrap(self) -> str:
        return self.bootstrap_servers or f"{self.broker_host}:{self.broker_port}"

    @property
    def model_dir(self) -> Path:
        """Where backbone presets are built and kept."""
        return self.home / "models"

    @property
    def policy_dir(self) -> Path:
        """The policy store: every tenant's checkpoints (tenants/policy_store.py)."""
        return self.home / "policies"

    @property
    def tensor_dir(self) -> Path:
        """The shared tensor store of large feature tensors (infra/tensor_store.py)."""
        return self.home / "tensors"

    @property
    def datasets_root(self) -> Path:
        """Datasets by tenant: ``<root>/<tenant>/<name>`` (deleted with the tenant)."""
        return (self.datasets_dir or self.home / "datasets").expanduser().resolve()

    @property
    def timeline_dir(self) -> Path:
        """Where device hosts append their forward timelines (backbone/timeline.py) for run reports."""
        return self.home / "timelines"

    @property
    def run_dir(self) -> Path:
        """Where `joynexus demo` writes its runs (metrics, plots)."""
        return self.home / "runs"

    @property
    def dlq_topic(self) -> str:
        return f"{self.topic_prefix}.dlq"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
