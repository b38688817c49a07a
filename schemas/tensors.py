"""numpy arrays to ``Tensor`` records and back: (de)serialising only, no math.

Bytes are row-major and little-endian, whatever the host. ``bfloat16`` has no
numpy dtype; such tensors are carried as their raw 2-byte words and converted
by the compute side (``torch.frombuffer``).
"""

from __future__ import annotations

import numpy as np

from infra.errors import DecodeError
from schemas.events import Tensor

__all__ = ["from_numpy", "to_numpy"]


def from_numpy(array: np.ndarray) -> Tensor:
    array = np.ascontiguousarray(array)
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return Tensor(dtype=array.dtype.name, shape=tuple(array.shape), data=little.tobytes())


def to_numpy(tensor: Tensor) -> np.ndarray:
    if tensor.ref is not None:
        raise DecodeError(f"tensor is stored by reference ({tensor.ref.uri}); fetch it first")
    try:
        dtype = np.dtype(tensor.dtype).newbyteorder("<")
    except TypeError as exc:
        raise DecodeError(f"tensor dtype {tensor.dtype!r} has no numpy equivalent") from exc
    expected = int(np.prod(tensor.shape, dtype=np.int64)) * dtype.itemsize
    if len(tensor.data) != expected:
        raise DecodeError(
            f"tensor {tensor.dtype}{list(tensor.shape)} needs {expected} bytes, has {len(tensor.data)}"
        )
    return np.frombuffer(tensor.data, dtype=dtype).reshape(tensor.shape)
