"""The shared tensor store: content-addressed blobs for tensors too big to travel inside an event.

A claim check: the producer writes the bytes once under their sha256 and puts
``Tensor(dtype, shape, data=b"", ref=BlobRef(uri, sha256, size))`` in the
event; the consumer fetches and verifies them. Blobs are immutable and named
by content, so a replayed write is a no-op and a replayed read finds the same
bytes. Every role of a deployment must see the same directory (one machine, or
a shared filesystem). Nothing deletes blobs yet: size the disk or clean up
with the features topic's retention in mind.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from infra.durable import read_bytes, sha256_hex, write_synced
from infra.errors import DecodeError
from schemas.events import BlobRef, Tensor

__all__ = ["TensorStore"]


class TensorStore:
    def __init__(self, root: str | os.PathLike[str], inline_max_bytes: int):
        self.root = Path(root)
        self.inline_max_bytes = inline_max_bytes

    def _path(self, digest: str) -> Path:
        return self.root / digest[:2] / digest

    def offload(self, tensor: Tensor) -> Tensor:
        """``tensor`` itself if small enough, else a reference to its stored bytes."""
        if len(tensor.data) <= self.inline_max_bytes:
            return tensor
        digest = sha256_hex(tensor.data)
        path = self._path(digest)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.parent / f".tmp-{uuid.uuid4().hex}"
            write_synced(tmp, tensor.data)
            os.replace(tmp, path)  # atomic: readers see all the bytes or none
        ref = BlobRef(uri=path.as_uri(), sha256=digest, size_bytes=len(tensor.data))
        return Tensor(dtype=tensor.dtype, shape=tensor.shape, data=b"", ref=ref)

    def resolve(self, tensor: Tensor) -> Tensor:
        """The tensor with its bytes inline, fetched and verified when it travelled by reference."""
        if tensor.ref is None:
            return tensor
        data = read_bytes(self._path(tensor.ref.sha256), DecodeError)
        if len(data) != tensor.ref.size_bytes or sha256_hex(data) != tensor.ref.sha256:
            raise DecodeError(f"tensor blob {tensor.ref.sha256} is corrupt or truncated")
        return Tensor(dtype=tensor.dtype, shape=tensor.shape, data=data)
