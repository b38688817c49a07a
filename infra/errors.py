"""The one exception hierarchy of joynexus.

Everything the project raises on purpose derives from ``JoynexusError``, so a
caller can catch the whole family or one branch::

    JoynexusError
    ├── ConfigError            invalid settings or arguments
    │   └── InvalidTenantId    a tenant id Kafka (or our topic scheme) cannot carry
    ├── SchemaError            Avro schemas and the wire codec
    │   ├── UnknownSchema      a fingerprint or registry id we do not know
    │   ├── DecodeError        bytes that are not a valid framed Avro record
    │   └── EncodeError        an event that does not fit its schema
    ├── BrokerError            the local Kafka broker could not be set up, started or stopped
    ├── TopicError             topic provisioning conflicts (e.g. wrong partition count)
    ├── TenantMismatch         a record on one tenant's topic that names another (security event)
    ├── ProcessingError        a record failed its handler after all attempts
    ├── InvalidRequest         (backbone.inputs) a request the backbone cannot take; fails alone
    ├── SimulatorError         (envs) a simulator raised, hung or returned garbage
    ├── InvalidAction          (envs) an action/seed the simulator cannot take
    ├── DatasetError           (producers.dataset) a dataset that cannot be written or read
    │   └── DatasetCorrupt         checksum, size or shape mismatch (names the file)
    └── TenantError            (tenants.errors) a tenant's modules, slot or checkpoints
        ├── InvalidBatch           features/targets that do not fit the slot; nothing changed
        ├── NonFiniteLoss          NaN/Inf loss or gradient norm; update skipped, slot failed
        ├── SlotFailed             a step asked of a slot already marked failed
        ├── SlotNotMounted         a step asked of a slot not mounted on a device
        └── CheckpointError        the policy store could not write or read a checkpoint
            ├── CheckpointNotFound     no such tenant or version
            └── CheckpointCorrupt      checksum mismatch, truncated or unparseable (names the file)

The compute-side errors live beside their code (no Kafka imports there) and
derive from ``JoynexusError`` like the rest.
"""

from __future__ import annotations

__all__ = [
    "BrokerError",
    "ConfigError",
    "DecodeError",
    "EncodeError",
    "InvalidTenantId",
    "JoynexusError",
    "ProcessingError",
    "SchemaError",
    "TenantMismatch",
    "TopicError",
    "UnknownSchema",
]


class JoynexusError(Exception):
    """Base of every error joynexus raises on purpose."""


class ConfigError(JoynexusError):
    """Invalid settings or arguments."""


class InvalidTenantId(ConfigError):
    """A tenant id that cannot be part of a topic name."""


class SchemaError(JoynexusError):
    """Something is wrong with a schema or with bytes on the wire."""


class UnknownSchema(SchemaError):
    """The writer schema of a record (fingerprint or registry id) is not known."""


class DecodeError(SchemaError):
    """Bytes that are not a valid framed Avro record."""


class EncodeError(SchemaError):
    """An event that does not fit its schema."""


class BrokerError(JoynexusError):
    """The local Kafka broker could not be fetched, formatted, started or stopped."""


class TopicError(JoynexusError):
    """A topic exists with a layout that conflicts with what joynexus needs."""


class TenantMismatch(JoynexusError):
    """A record on tenant A's topic whose envelope names tenant B: refused, dead-lettered where
    the role has a DLQ, and logged as a security event. The topic decides the tenant (its ACLs
    say who could write it); the body is what the writer claims."""


class ProcessingError(JoynexusError):
    """A record's handler failed on every attempt."""
