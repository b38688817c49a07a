"""The policy store: versioned tenant checkpoints on disk, written atomically, verified on load.

Layout under ``root``::

    <tenant>/v00000003/model.safetensors        the policy's state_dict
                       train_state.safetensors  AdamW state by parameter name + the slot's RNG state
                       meta.json                tenant, version, parent, step, source offsets, metrics,
                                                config, optimizer hyper-parameters, sha256 + size of
                                                each file, the backbone id the modules were trained
                                                against, and a checksum of meta.json's own content
    <tenant>/.tmp-*/                            a write in progress (or one a crash interrupted)

No pickle anywhere: tensors are safetensors, everything else JSON. A version
directory appears by ``rename`` of a fully written and fsynced temp directory,
so ``latest`` never sees half a checkpoint. Versions are ``parent + 1``: a
replay after a crash that re-saves the same version with the same tensors is
a no-op, with different tensors an error.

Lineage: a version records the id of the backbone whose features it was trained on
(``backbone_id``); a version saved without one inherits its parent's, so a lineage names its
backbone once, where it starts. Checkpoints written before this field existed read as ``None``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from infra.durable import checksummed_json, fsync_dir, read_bytes, sha256_hex, verified_json, write_synced
from infra.errors import ConfigError, InvalidTenantId
from infra.logging import get_logger
from tenants.config import TenantConfig, validate_tenant_id
from tenants.errors import CheckpointCorrupt, CheckpointError, CheckpointNotFound
from tenants.slot import SlotState, TenantSlot

__all__ = ["META_FILE", "MODEL_FILE", "TRAIN_FILE", "Checkpoint", "CheckpointMeta", "CheckpointRef",
           "PolicyStore"]

MODEL_FILE = "model.safetensors"
TRAIN_FILE = "train_state.safetensors"
META_FILE = "meta.json"
FORMAT = 1
_VERSION_DIR = re.compile(r"^v(\d{8})$")

log = get_logger("tenants.policy_store")


@dataclass(frozen=True)
class CheckpointMeta:
    tenant_id: str
    version: int
    parent_version: int | None
    step: int
    source_offsets: dict[str, int]  # next offset to read per input 'topic:partition'
    metrics: dict[str, float]
    config: dict[str, Any]  # TenantConfig.to_dict()
    optimizer_groups: list[dict[str, Any]]
    files: dict[str, dict[str, Any]]  # file name -> {"sha256": hex, "size_bytes": n}
    created_at: str
    format: int = FORMAT
    backbone_id: str | None = None  # the backbone the modules were trained against (lineage)


@dataclass(frozen=True)
class CheckpointRef:
    """The claim check for a PolicyVersionPublished event's BlobRef: meta.json, which pins the rest."""

    uri: str
    sha256: str
    size_bytes: int


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    meta: CheckpointMeta
    ref: CheckpointRef
    state: SlotState


def _meta_bytes(meta: CheckpointMeta) -> bytes:
    return checksummed_json(asdict(meta))


def _parse_meta(path: Path, data: bytes) -> CheckpointMeta:
    try:
        body = verified_json(data, path, CheckpointCorrupt)
        if body.get("format") != FORMAT:
            raise CheckpointCorrupt(f"{path}: unsupported checkpoint format {body.get('format')!r}")
        return CheckpointMeta(**body)
    except CheckpointCorrupt:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # truncated, not JSON, wrong fields
        raise CheckpointCorrupt(f"{path}: not a valid checkpoint metadata file ({exc})") from exc


def _load_tensors(path: Path, meta: CheckpointMeta) -> dict[str, torch.Tensor]:
    data = read_bytes(path, CheckpointCorrupt)
    expected = meta.files.get(path.name)
    if expected is None:
        raise CheckpointCorrupt(f"{path}: not listed in {META_FILE}")
    if len(data) != expected["size_bytes"]:
        raise CheckpointCorrupt(f"{path}: {len(data)} bytes, metadata says {expected['size_bytes']} "
                                "(truncated or overwritten)")
    if sha256_hex(data) != expected["sha256"]:
        raise CheckpointCorrupt(f"{path}: sha256 {sha256_hex(data)} does not match metadata "
                                f"{expected['sha256']}")
    try:
        return safetensors.torch.load(data)
    except Exception as exc:  # safetensors raises its own SafetensorError
        raise CheckpointCorrupt(f"{path}: not a readable safetensors file ({exc})") from exc


class PolicyStore:
    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)

    def _tenant_dir(self, tenant: str) -> Path:
        return self.root / validate_tenant_id(tenant)

    def _version_dir(self, tenant: str, version: int) -> Path:
        return self._tenant_dir(tenant) / f"v{version:08d}"

    def tenants(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and self._holds_versions(p.name))

    def _holds_versions(self, name: str) -> bool:
        try:
            return bool(self.versions(name))
        except InvalidTenantId:  # another folder (lost+found, a backup) is not a tenant
            return False

    def versions(self, tenant: str) -> list[int]:
        folder = self._tenant_dir(tenant)
        if not folder.is_dir():
            return []
        return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _VERSION_DIR.match(p.name)))

    def latest_version(self, tenant: str) -> int | None:
        versions = self.versions(tenant)
        return versions[-1] if versions else None

    def list(self, tenant: str) -> list[CheckpointMeta]:
        """Metadata of every version (each meta.json checked against its own checksum), oldest first."""
        out = []
        for version in self.versions(tenant):
            path = self._version_dir(tenant, version) / META_FILE
            out.append(_parse_meta(path, read_bytes(path, CheckpointCorrupt)))
        return out

    def meta(self, tenant: str, version: int) -> CheckpointMeta:
        """A version's metadata alone (verified), without reading its tensors."""
        path = self._version_dir(tenant, version) / META_FILE
        if not path.exists():
            raise CheckpointNotFound(f"no version {version} of tenant {tenant} under {self.root}")
        return _parse_meta(path, read_bytes(path, CheckpointCorrupt))

    def save(self, slot: TenantSlot, *, source_offsets: Mapping[str, int],
             metrics: Mapping[str, float] | None = None, backbone_id: str | None = None) -> Checkpoint:
        """Writes the slot as version ``slot.version + 1`` and sets ``slot.version`` to it.
        ``backbone_id`` starts a lineage; without it the parent version's is kept."""
        if slot.failed:
            raise CheckpointError(f"refusing to save the failed slot of tenant {slot.tenant_id}: "
                                  f"{slot.failure}")
        state = slot.state()
        if backbone_id is None and state.version:
            with contextlib.suppress(CheckpointNotFound):
                backbone_id = self.meta(slot.tenant_id, state.version).backbone_id
        blobs = {MODEL_FILE: safetensors.torch.save(state.model),
                 TRAIN_FILE: safetensors.torch.save(state.train)}
        meta = CheckpointMeta(
            tenant_id=slot.tenant_id, version=state.version + 1,
            parent_version=state.version or None, step=state.step,
            source_offsets={str(k): int(v) for k, v in source_offsets.items()},
            metrics={str(k): float(v) for k, v in (metrics or {}).items()},
            config=state.config.to_dict(), optimizer_groups=state.optimizer_groups,
            files={name: {"sha256": sha256_hex(data), "size_bytes": len(data)}
                   for name, data in blobs.items()},
            created_at=datetime.now(UTC).isoformat(), backbone_id=backbone_id,
        )
        try:
            meta_data = _meta_bytes(meta)
        except ValueError as exc:
            raise CheckpointError(f"metadata of tenant {slot.tenant_id} is not JSON-able: {exc}") from exc
        final = self._version_dir(slot.tenant_id, meta.version)
        if not final.exists() and self._write(final, blobs, meta_data):
            ref = CheckpointRef((final / META_FILE).as_uri(), sha256_hex(meta_data), len(meta_data))
            checkpoint = Checkpoint(final, meta, ref, replace(state, version=meta.version))
            log.info("checkpoint_saved", tenant=slot.tenant_id, version=meta.version, step=meta.step)
        else:
            checkpoint = self._existing(final, meta)
        slot.version = meta.version
        return checkpoint

    def _write(self, final: Path, blobs: Mapping[str, bytes], meta_data: bytes) -> bool:
        """True when this call created ``final``; False when a concurrent writer did first."""
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
        try:
            for name, data in {**blobs, META_FILE: meta_data}.items():
                write_synced(tmp / name, data)
            fsync_dir(tmp)
            os.rename(tmp, final)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if final.exists():  # another writer of the same version won the rename
                return False
            raise CheckpointError(f"{final}: could not write checkpoint ({exc})") from exc
        fsync_dir(final.parent)
        return True

    def _existing(self, final: Path, meta: CheckpointMeta) -> Checkpoint:
        """A re-save of an existing version: fine if it holds the same tensors (a replay), else an error."""
        existing = self.load(meta.tenant_id, meta.version)
        if existing.meta.files != meta.files or existing.meta.step != meta.step:
            raise CheckpointError(f"{final}: version {meta.version} of tenant {meta.tenant_id} already "
                                  f"exists with different content (this slot was trained from version "
                                  f"{meta.version - 1}; restore the latest version to continue it)")
        return existing

    def load(self, tenant: str, version: int | None = None, *,
             expected_sha256: str | None = None) -> Checkpoint:
        """A verified checkpoint (latest when ``version`` is None); ``expected_sha256`` pins meta.json."""
        if version is None:
            version = self.latest_version(tenant)
            if version is None:
                raise CheckpointNotFound(f"no checkpoint of tenant {tenant} under {self.root}")
        path = self._version_dir(tenant, version)
        if not path.is_dir():
            raise CheckpointNotFound(f"no version {version} of tenant {tenant} under {self.root}")
        meta_path = path / META_FILE
        meta_data = read_bytes(meta_path, CheckpointCorrupt)
        if expected_sha256 is not None and sha256_hex(meta_data) != expected_sha256:
            raise CheckpointCorrupt(f"{meta_path}: sha256 {sha256_hex(meta_data)} is not the expected "
                                    f"{expected_sha256}")
        meta = _parse_meta(meta_path, meta_data)
        if (meta.tenant_id, meta.version) != (tenant, version):
            raise CheckpointCorrupt(f"{meta_path}: describes tenant {meta.tenant_id} version {meta.version}")
        model, train = (_load_tensors(path / name, meta) for name in (MODEL_FILE, TRAIN_FILE))
        try:
            config = TenantConfig.from_dict(meta.config)
        except ConfigError as exc:
            raise CheckpointCorrupt(f"{meta_path}: invalid tenant config ({exc})") from exc
        ref = CheckpointRef(meta_path.as_uri(), sha256_hex(meta_data), len(meta_data))
        state = SlotState(config, meta.step, meta.version, model, train, meta.optimizer_groups)
        return Checkpoint(path, meta, ref, state)

    def restore(self, tenant: str, version: int | None = None, *,
                expected_sha256: str | None = None) -> TenantSlot:
        """An unmounted slot continuing exactly where the checkpoint left off."""
        checkpoint = self.load(tenant, version, expected_sha256=expected_sha256)
        try:
            return TenantSlot.from_state(checkpoint.state)
        except (RuntimeError, KeyError, ValueError, TypeError) as exc:
            raise CheckpointCorrupt(f"{checkpoint.path}: tensors do not fit the checkpoint's config "
                                    f"({exc})") from exc

    def remove_incomplete(self) -> list[Path]:
        """Deletes temp directories that crashed writes left behind; only while nothing is writing."""
        removed = sorted(self.root.glob("*/.tmp-*")) if self.root.is_dir() else []
        for path in removed:
            shutil.rmtree(path)
        return removed

