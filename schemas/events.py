"""Application-side event types: immutable records mirroring the ``.avsc`` files.

Each class names its Avro record in ``__avro_name__``; ``schemas.check`` compares
every class with its schema field by field, and a test fails when they drift.
Arrays are tuples so that an event really is immutable once built.
"""

from __future__ import annotations

import os
import socket
import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

__all__ = [
    "EVENT_TYPES",
    "Action",
    "EnvSessionClosed",
    "EnvSessionProgress",
    "EnvSessionRequested",
    "EnvSessionRestarted",
    "AvroRecord",
    "BlobRef",
    "Envelope",
    "Event",
    "FeatureBatch",
    "FieldError",
    "GradientJob",
    "Heartbeat",
    "InstanceRestarted",
    "InstanceVerdict",
    "JobAccepted",
    "JobCancelled",
    "JobCompleted",
    "JobFailed",
    "JobKind",
    "JobProgress",
    "JobRejected",
    "JobSubmitted",
    "Observation",
    "PolicyVersionPublished",
    "RoleStatus",
    "RolloutRecord",
    "SessionStatus",
    "TenantRegistered",
    "Tensor",
    "UsageRecorded",
]

NAMESPACE = "joynexus.v1"


def _to_millis(value: datetime) -> datetime:
    # Avro's timestamp-millis keeps milliseconds; truncating on creation makes an
    # event equal to itself after a round trip. Naive datetimes are taken as UTC.
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).replace(microsecond=value.microsecond // 1000 * 1000)


#: A UTC datetime with millisecond precision (Avro ``timestamp-millis``).
TimestampMillis = Annotated[datetime, AfterValidator(_to_millis)]


class AvroRecord(BaseModel):
    """Base of every type that has an Avro record schema."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)
    __avro_name__: ClassVar[str]


class JobKind(StrEnum):
    SFT = "SFT"
    RL = "RL"
    EVAL = "EVAL"
    UNKNOWN = "UNKNOWN"


class SessionStatus(StrEnum):
    REQUESTED = "REQUESTED"
    RUNNING = "RUNNING"
    CLOSED = "CLOSED"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"


class RoleStatus(StrEnum):
    STARTING = "STARTING"
    HEALTHY = "HEALTHY"
    DEGRADED = "DEGRADED"
    STOPPING = "STOPPING"


def _default_producer_id() -> str:
    return f"{socket.gethostname()}/{os.getpid()}"


class Envelope(AvroRecord):
    __avro_name__ = f"{NAMESPACE}.Envelope"
    event_id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    tenant_id: str | None = None
    occurred_at: TimestampMillis = Field(default_factory=lambda: datetime.now(UTC))
    producer_id: str = Field(default_factory=_default_producer_id)
    correlation_id: str | None = None


class BlobRef(AvroRecord):
    __avro_name__ = f"{NAMESPACE}.BlobRef"
    uri: str
    sha256: str
    size_bytes: int


class Tensor(AvroRecord):
    __avro_name__ = f"{NAMESPACE}.Tensor"
    dtype: str
    shape: tuple[int, ...]
    data: bytes
    ref: BlobRef | None = None


class FieldError(AvroRecord):
    __avro_name__ = f"{NAMESPACE}.FieldError"
    loc: str
    message: str


class Event(AvroRecord):
    """A top-level event: every one starts with an envelope."""

    envelope: Envelope

    @property
    def tenant_id(self) -> str | None:
        return self.envelope.tenant_id


class JobSubmitted(Event):
    __avro_name__ = f"{NAMESPACE}.JobSubmitted"
    job_id: str
    kind: JobKind
    spec_json: str


class JobAccepted(Event):
    __avro_name__ = f"{NAMESPACE}.JobAccepted"
    job_id: str
    kind: JobKind
    resources: dict[str, str]


class JobRejected(Event):
    __avro_name__ = f"{NAMESPACE}.JobRejected"
    job_id: str
    reason: str
    errors: tuple[FieldError, ...]


class JobProgress(Event):
    __avro_name__ = f"{NAMESPACE}.JobProgress"
    job_id: str
    step: int
    total_steps: int | None = None
    policy_version: int | None = None
    metrics: dict[str, float]


class JobCompleted(Event):
    __avro_name__ = f"{NAMESPACE}.JobCompleted"
    job_id: str
    final_policy_version: int | None = None
    metrics: dict[str, float]


class JobFailed(Event):
    __avro_name__ = f"{NAMESPACE}.JobFailed"
    job_id: str
    error_class: str
    reason: str
    stage: str


class JobCancelled(Event):
    __avro_name__ = f"{NAMESPACE}.JobCancelled"
    job_id: str
    requested_by: str
    reason: str | None = None


class Observation(Event):
    __avro_name__ = f"{NAMESPACE}.Observation"
    session_id: str
    episode_id: str
    step: int
    instruction: str
    image: Tensor | None = None
    state: Tensor | None = None
    proprio: Tensor | None = None


class Action(Event):
    __avro_name__ = f"{NAMESPACE}.Action"
    session_id: str
    episode_id: str
    step: int
    action: Tensor
    policy_version: int
    log_prob: float | None = None
    value: float | None = None


class RolloutRecord(Event):
    __avro_name__ = f"{NAMESPACE}.RolloutRecord"
    session_id: str
    episode_id: str
    step: int
    reset_seed: int
    observation: Observation
    action: Tensor
    reward: float
    terminated: bool
    truncated: bool
    success: bool
    policy_version: int
    log_prob: float | None = None
    value: float | None = None


class GradientJob(Event):
    __avro_name__ = f"{NAMESPACE}.GradientJob"
    job_id: str
    batch_id: str
    sequence: int
    policy_version: int
    instructions: tuple[str, ...]
    images: Tensor | None = None
    proprio: Tensor | None = None
    targets: dict[str, Tensor]
    publish: bool = False
    final: bool = False
    needs_sequence: bool = False
    metrics: dict[str, float] = Field(default_factory=dict)
    minibatches: tuple[tuple[int, ...], ...] = ()  # empty: the rows are one minibatch


class FeatureBatch(Event):
    __avro_name__ = f"{NAMESPACE}.FeatureBatch"
    job_id: str
    batch_id: str
    sequence: int
    policy_version: int
    backbone_id: str
    features: dict[str, Tensor]
    targets: dict[str, Tensor]
    group_size: int
    source_offset: int
    publish: bool = False
    final: bool = False
    metrics: dict[str, float] = Field(default_factory=dict)


class PolicyVersionPublished(Event):
    __avro_name__ = f"{NAMESPACE}.PolicyVersionPublished"
    job_id: str
    version: int
    parent_version: int | None = None
    step: int
    checkpoint: BlobRef
    source_offsets: dict[str, int]
    metrics: dict[str, float]


class Heartbeat(Event):
    __avro_name__ = f"{NAMESPACE}.Heartbeat"
    role: str
    instance_id: str
    host: str
    pid: int
    status: RoleStatus
    sequence: int
    details: dict[str, str] = Field(default_factory=dict)
    partitions: tuple[str, ...] = ()
    lag: int = -1
    pending: int = 0
    progress_at: TimestampMillis | None = None
    restarts: int = 0


class InstanceVerdict(Event):
    __avro_name__ = f"{NAMESPACE}.InstanceVerdict"
    role: str
    instance_id: str
    host: str
    pid: int
    verdict: str
    reason: str
    last_heartbeat_at: TimestampMillis
    progress_at: TimestampMillis | None = None


class InstanceRestarted(Event):
    __avro_name__ = f"{NAMESPACE}.InstanceRestarted"
    role: str
    instance_id: str
    host: str
    new_pid: int
    cause: str
    restarts: int
    backoff_s: float
    old_pid: int | None = None


class UsageRecorded(Event):
    __avro_name__ = f"{NAMESPACE}.UsageRecorded"
    usage_id: str
    role: str
    resource: str
    device: str
    seconds: float
    window_start: TimestampMillis
    window_end: TimestampMillis
    group_size: int
    steps: int = 0


class TenantRegistered(Event):
    __avro_name__ = f"{NAMESPACE}.TenantRegistered"
    active: bool
    topics: tuple[str, ...]


class EnvSessionRequested(Event):
    __avro_name__ = f"{NAMESPACE}.EnvSessionRequested"
    session_id: str
    job_id: str
    env_id: str
    obs_mode: str
    image_size: int
    cameras: int
    seed: int
    episodes: int | None = None
    max_episode_steps: int | None = None
    policy_version: int | None = None
    deterministic: bool = False
    action_seed: int = 0
    state_in_proprio: bool = False


class EnvSessionClosed(Event):
    __avro_name__ = f"{NAMESPACE}.EnvSessionClosed"
    session_id: str
    job_id: str
    reason: str


class EnvSessionProgress(Event):
    __avro_name__ = f"{NAMESPACE}.EnvSessionProgress"
    session_id: str
    job_id: str
    status: SessionStatus
    episodes_completed: int
    steps_completed: int
    successes: int
    restarts: int
    worker_id: str


class EnvSessionRestarted(Event):
    __avro_name__ = f"{NAMESPACE}.EnvSessionRestarted"
    session_id: str
    job_id: str
    episode_id: str
    error_class: str
    reason: str
    restarts: int


#: Every top-level event type, by its Avro full name.
EVENT_TYPES: dict[str, type[Event]] = {
    cls.__avro_name__: cls
    for cls in (
        JobSubmitted, JobAccepted, JobRejected, JobProgress, JobCompleted, JobFailed,
        JobCancelled, Observation, Action, RolloutRecord, GradientJob, FeatureBatch,
        PolicyVersionPublished, Heartbeat, UsageRecorded, TenantRegistered, EnvSessionRequested,
        EnvSessionClosed, EnvSessionProgress, EnvSessionRestarted, InstanceVerdict, InstanceRestarted,
    )
}

#: Every record type (events and the shared records they contain), by full name.
RECORD_TYPES: dict[str, type[AvroRecord]] = {
    **{cls.__avro_name__: cls for cls in (Envelope, BlobRef, Tensor, FieldError)},
    **EVENT_TYPES,
}

#: Enum types, by full name.
ENUM_TYPES: dict[str, type[StrEnum]] = {
    f"{NAMESPACE}.JobKind": JobKind,
    f"{NAMESPACE}.RoleStatus": RoleStatus,
    f"{NAMESPACE}.SessionStatus": SessionStatus,
}
