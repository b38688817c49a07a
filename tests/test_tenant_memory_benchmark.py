"""The tenant memory benchmark runs, and its numbers agree with what a slot's parts must weigh."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark():
    spec = importlib.util.spec_from_file_location("tenant_memory", ROOT / "benchmarks/tenant_memory.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_prints_and_writes_rows_for_the_small_preset(tmp_path: Path, capsys) -> None:
    bench = load_benchmark()
    rows = bench.main(["--presets", "small", "--json", str(tmp_path / "out.json")])
    table = capsys.readouterr().out
    assert table.startswith("| backbone |") and table.count("| small |") == len(rows) == 7
    written = json.loads((tmp_path / "out.json").read_text())
    assert [r["slot"] for r in written] == [r.slot for r in rows]
    by_slot = {r.slot: r for r in rows}
    for row in rows:
        assert row.backbone_dtype == "float32" and row.backbone_bytes == 4 * row.backbone_params
        assert row.hidden_size == 512
        # fp32 AdamW: a gradient and two moments per trainable parameter (+ a 4-byte step per tensor)
        assert row.grad_bytes == 4 * row.trainable_params
        assert 8 * row.trainable_params < row.optimizer_bytes < 8 * row.trainable_params + 4096
        assert row.param_bytes == 4 * (row.trainable_params + row.frozen_params)
    lora = [by_slot[f"suffix LoRA r{r} + head 256"] for r in (8, 16, 32)]
    assert lora[0].trainable_params < lora[1].trainable_params < lora[2].trainable_params
    assert len({r.frozen_params for r in lora}) == 1 and lora[0].frozen_params > 0
    assert by_slot["chunk head 256"].frozen_params == 0
    # the suffix's frozen base is the process's shared copy: an extra tenant pays only the rest
    for row in rows:
        assert row.shared_base_bytes == 4 * row.frozen_params
        assert row.extra_tenant_bytes == row.slot_bytes - row.shared_base_bytes
        assert row.device == "cpu" and row.device_resident_bytes is None  # measured only on CUDA
    assert all(r.extra_tenant_bytes < r.slot_bytes / 2 for r in lora)
    assert "one more tenant with suffix LoRA r16" in table
