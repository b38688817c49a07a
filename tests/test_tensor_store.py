"""The tensor store's claim check: big tensors out by reference, back verified."""

from __future__ import annotations

import numpy as np
import pytest

from infra.errors import DecodeError
from infra.tensor_store import TensorStore
from schemas.tensors import from_numpy, to_numpy


def test_small_tensors_stay_inline_big_ones_round_trip_by_reference(tmp_path) -> None:
    store = TensorStore(tmp_path, inline_max_bytes=64)
    small = from_numpy(np.arange(4, dtype=np.float32))
    assert store.offload(small) is small
    big = from_numpy(np.arange(1000, dtype=np.float32))
    ref = store.offload(big)
    assert ref.ref is not None and ref.data == b"" and ref.ref.size_bytes == 4000
    assert store.offload(big) == ref  # content-addressed: writing again changes nothing
    assert np.array_equal(to_numpy(store.resolve(ref)), np.arange(1000, dtype=np.float32))


def test_a_corrupt_or_missing_blob_is_refused(tmp_path) -> None:
    store = TensorStore(tmp_path, inline_max_bytes=0)
    ref = store.offload(from_numpy(np.ones(16, dtype=np.float32)))
    path = tmp_path / ref.ref.sha256[:2] / ref.ref.sha256
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(DecodeError, match="corrupt or truncated"):
        store.resolve(ref)
    path.unlink()
    with pytest.raises(DecodeError, match="missing"):
        store.resolve(ref)
