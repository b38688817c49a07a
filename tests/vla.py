"""Request generators for backbone, batcher and tenant tests."""

from __future__ import annotations

import numpy as np

from backbone.inputs import VLARequest


def requests(n: int, seed: int = 0, cameras: int = 1, words: int | None = None) -> list[VLARequest]:
    rng = np.random.default_rng(seed)
    vocab = ["pick", "up", "the", "red", "cube", "push", "to", "goal", "blue", "block", "left"]
    out = []
    for i in range(n):
        k = words or int(rng.integers(2, 7))
        text = " ".join(rng.choice(vocab, k))
        size = int(rng.choice([48, 56, 64, 96]))
        images = [rng.integers(0, 255, (size, size + 8, 3), dtype=np.uint8) for _ in range(cameras)]
        out.append(VLARequest(f"tenant-{i}", images, text, rng.standard_normal(5), task_id=i % 3))
    return out
