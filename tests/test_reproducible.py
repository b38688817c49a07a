"""Batch-invariant products: a row computed in a group equals the same row computed alone.

On an Intel Xeon with AVX-512 (2026-12-02) MKL's default sgemm failed this for a
(7m x 256) @ (256 x 1024) product at every m; ``infra.reproducible`` sets MKL's strict mode."""

from __future__ import annotations

import os
import subprocess
import sys

from infra import reproducible

ROWS_ALONE_VS_GROUPED = """
import infra  # sets MKL_CBWR before the first product, as every entry point does
import torch
torch.manual_seed(0)
torch.set_num_threads(1)
bad = []
for k, n in [(64, 64), (128, 256), (256, 1024), (96, 384), (512, 2048)]:
    w, b = torch.randn(n, k), torch.randn(n)
    for m in [2, 3, 8, 16, 24, 40]:
        x = torch.randn(m, 7, k)
        grouped = torch.nn.functional.linear(x, w, b)
        if not all(torch.equal(grouped[i], torch.nn.functional.linear(x[i:i + 1], w, b)[0])
                   for i in range(m)):
            bad.append((k, n, m))
print(bad)
"""


def test_a_row_grouped_equals_the_row_alone_in_a_fresh_process() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}  # as a fresh shell has it
    out = subprocess.run([sys.executable, "-c", ROWS_ALONE_VS_GROUPED], env=env, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    assert out.strip() == "[]", f"shapes whose grouped rows differ from alone: {out}"


def test_a_value_the_user_set_is_kept_and_checked(monkeypatch) -> None:
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    reproducible.ensure()
    assert os.environ["MKL_CBWR"] == "AVX2"
    assert "not strict" in (reproducible.check() or "")
    monkeypatch.setenv("MKL_CBWR", "AVX2,STRICT")
    assert reproducible.check() is None
    monkeypatch.delenv("MKL_CBWR")
    reproducible.ensure()
    assert os.environ["MKL_CBWR"] == reproducible.MKL_CBWR and reproducible.check() is None
