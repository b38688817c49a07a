"""The tenant branch of the joynexus error hierarchy (``infra.errors``)::

    JoynexusError
    └── TenantError              a tenant's modules, slot or checkpoints
        ├── InvalidBatch         features/targets that do not fit the slot; nothing was changed
        ├── NonFiniteLoss        loss or gradient norm NaN/Inf; update skipped, slot marked failed
        ├── SlotFailed           a step asked of a slot already marked failed
        ├── SlotNotMounted       a step asked of a slot that is not mounted on a device
        └── CheckpointError      the policy store could not write or read a checkpoint
            ├── CheckpointNotFound   no such tenant or version
            └── CheckpointCorrupt    a checksum mismatch, truncated or unparseable file (names it)

Bad tenant configs raise ``infra.errors.ConfigError`` (or ``InvalidTenantId``).
"""

from __future__ import annotations

from infra.errors import JoynexusError

__all__ = [
    "CheckpointCorrupt",
    "CheckpointError",
    "CheckpointNotFound",
    "InvalidBatch",
    "NonFiniteLoss",
    "SlotFailed",
    "SlotNotMounted",
    "TenantError",
]


class TenantError(JoynexusError):
    """A tenant's modules, slot or checkpoints."""


class InvalidBatch(TenantError):
    """Features or targets that do not fit the slot's config; the slot is unchanged."""


class NonFiniteLoss(TenantError):
    """The loss or the gradient norm is NaN or Inf: the update was skipped, the slot marked failed."""


class SlotFailed(TenantError):
    """The slot was marked failed earlier; restore it from a checkpoint to continue."""


class SlotNotMounted(TenantError):
    """The slot is not mounted on a device."""


class CheckpointError(TenantError):
    """The policy store could not write or read a checkpoint."""


class CheckpointNotFound(CheckpointError):
    """No checkpoint for that tenant (and version)."""


class CheckpointCorrupt(CheckpointError):
    """A checkpoint file fails its checksum, is truncated or cannot be parsed; the message names it."""
