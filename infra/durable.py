"""Durable, verifiable files: the helpers the policy store and the dataset format share.

Kafka-free, so compute code (``tenants/``) may use it. Writers put files in a
temporary directory with ``write_synced``, ``fsync_dir`` it and rename it into
place; readers check what they read against a sha256 taken from ``canonical_json``
metadata.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["canonical_json", "checksummed_json", "fsync_dir", "read_bytes", "sha256_hex",
           "verified_json", "write_synced"]


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(body: Mapping[str, Any]) -> bytes:
    """One byte string per value: sorted keys, no spaces, no NaN - what a checksum is taken over."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def write_synced(path: Path, data: bytes) -> None:
    """Create ``path`` (never overwrite) and fsync it before returning."""
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (new files, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_bytes(path: Path, error: type[Exception]) -> bytes:
    """Read a whole file; a missing or unreadable one raises ``error`` naming it."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: file is missing") from None
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc})") from exc


def checksummed_json(body: Mapping[str, Any]) -> bytes:
    """Readable JSON of ``body`` plus a ``checksum`` over its canonical form."""
    return json.dumps({**body, "checksum": sha256_hex(canonical_json(body))}, sort_keys=True, indent=1,
                      allow_nan=False).encode()


def verified_json(data: bytes, path: Path, error: type[Exception]) -> dict[str, Any]:
    """The body of a ``checksummed_json`` file; ``error`` when it was altered.

    Unparseable data raises ValueError/KeyError for the caller to word as its own error.
    """
    body = json.loads(data)
    checksum = body.pop("checksum")
    if sha256_hex(canonical_json(body)) != checksum:
        raise error(f"{path}: content does not match its checksum")
    return body
