"""The device gate's latency bound: training groups split into chunks sized to a budget, inference
going between the chunks, and not one feature changed by the split; and training never starved by
inference that never stops. Order is observed, not timed."""
from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from backbone.gate import FIRST_CHUNK_ROWS, DeviceGate
from backbone.grouped import forward_grouped, forward_grouped_on
from backbone.model import Backbone
from tests.vla import requests


class Recorder:
    """The backbone, recording each forward's size; the first forward waits until ``release`` is set."""

    def __init__(self, backbone: Backbone) -> None:
        self.backbone = backbone
        self.calls: list[int] = []
        self.release = threading.Event()
        self.started = threading.Event()

    def forward(self, group):
        if not self.calls:
            self.started.set()
            assert self.release.wait(60), "the test never released the first forward"
        self.calls.append(len(group))
        return self.backbone.forward(group)


def test_chunk_rows_follow_the_budget_and_bound_only_training() -> None:
    gate = DeviceGate(train_budget_s=0.2)
    assert gate.chunk_rows("inference") is None
    assert gate.chunk_rows("train") == FIRST_CHUNK_ROWS  # nothing timed yet
    gate.row_s["train"] = 0.01
    assert gate.chunk_rows("train") == 20
    gate.row_s["train"] = 5.0  # one row is over budget: still one row, never zero
    assert gate.chunk_rows("train") == 1
    assert DeviceGate().chunk_rows("train") is None
    with pytest.raises(ValueError):
        DeviceGate(train_budget_s=0.0)


async def test_a_chunked_training_group_computes_the_same_features(backbones: dict[str, Backbone]) -> None:
    backbone = backbones["tiny"]
    prepared = [backbone.prepare(r) for r in requests(20, words=4)]
    gate = DeviceGate(train_budget_s=1e-9)  # after the first chunk: one row per forward
    chunked, forwards = await forward_grouped_on(gate, "train", backbone, prepared)
    assert max(len(f.rows) for f in forwards) == FIRST_CHUNK_ROWS and len(forwards) > 2, forwards
    assert sorted(i for f in forwards for i in f.rows) == list(range(20))
    whole = forward_grouped(backbone, prepared)
    for a, b in zip(chunked, whole, strict=True):
        assert torch.equal(a.pooled, b.pooled) and torch.equal(a.sequence, b.sequence)


async def test_inference_goes_between_the_chunks_of_a_training_group(backbones: dict[str, Backbone]) -> None:
    recorder = Recorder(backbones["tiny"])
    prepared = [recorder.backbone.prepare(r) for r in requests(24, words=4)]
    gate = DeviceGate(train_budget_s=1e-9)
    train = asyncio.create_task(forward_grouped_on(gate, "train", recorder, prepared))
    await asyncio.to_thread(recorder.started.wait, 60)  # the first training chunk holds the device
    infer = asyncio.create_task(forward_grouped_on(gate, "inference", recorder, prepared[:1]))
    while gate._waiting["inference"] == 0:  # queued behind the chunk
        await asyncio.sleep(0.01)
    recorder.release.set()
    await asyncio.gather(train, infer)
    assert recorder.calls[:2] == [FIRST_CHUNK_ROWS, 1], recorder.calls  # inference right after chunk one
    assert sum(recorder.calls) == 25 and len(recorder.calls) > 3

    unbounded = Recorder(recorder.backbone)  # the same without a budget: one forward holds it all
    unbounded.release.set()
    await forward_grouped_on(DeviceGate(), "train", unbounded, prepared)
    assert unbounded.calls == [24]


async def _forwards_before_training(gate: DeviceGate, limit: int) -> int:
    """Two inference loops keep one inference forward always queued, ``limit`` forwards in all;
    returns how many had run when one training forward got the device (``limit`` or more: it only
    got it once inference stopped)."""
    done, at = 0, None

    async def inference() -> None:
        nonlocal done
        while at is None and done < limit:
            async with gate.use("inference"):
                await asyncio.sleep(0.005)
            done += 1

    async def train() -> None:
        nonlocal at
        async with gate.use("train"):
            at = done

    loops = [asyncio.create_task(inference()) for _ in range(2)]
    while gate._waiting["inference"] == 0:  # one holds the device, the other waits
        await asyncio.sleep(0.001)
    await asyncio.gather(train(), *loops)
    assert at is not None
    return at


async def test_training_waits_behind_inference_but_never_starves() -> None:
    assert await _forwards_before_training(DeviceGate(), limit=200) >= 200  # strict priority starves
    ran = await _forwards_before_training(DeviceGate(train_max_wait_s=0.05), limit=10_000)
    assert 2 <= ran < 10_000  # inference went first for a while, then training got its turn
