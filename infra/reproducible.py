"""Batch-invariant matrix products on every CPU: what grouped == alone, bit for bit, stands on.

Group batching promises that a row's features, losses and updates are the same whether it
is computed alone or in a group of any size. On the CPU, torch's fp32 matrix products are
Intel MKL's sgemm, which picks its kernels by the problem's shape: on an Intel Xeon with
AVX-512 and AMX (this workplace's VM of 2026-12-02) the rows of a (7m x 256) @ (256 x 1024)
product differed from the same rows computed alone for every m tried (2 to 40), and the
tiny backbone's grouped forward differed from its serial one (the bit-for-bit tests failed;
the multi-tenant benchmark's RL tenants ended with other parameters shared than isolated).
The AMD EPYC VMs before it happened to be invariant. MKL's strict conditional numerical
reproducibility (``MKL_CBWR=AUTO,STRICT``) makes every element of a product independent of
how many rows are computed with it: 0 of 30 shapes differ, and the grouped tests pass; a
tiny forward of 8 rows took 7.59 ms against 8.11 ms without it (noise: no measurable cost).

MKL reads the variable once, at its first call, so it is set when ``infra`` is imported
(every entry point imports it before any tensor math) and travels to every child process
in the environment. A value the user set is kept: ``check()`` says whether it is strict.
"""

from __future__ import annotations

import os

__all__ = ["MKL_CBWR", "check", "ensure"]

#: AUTO: the code path MKL would choose anyway; STRICT: results independent of the row count.
MKL_CBWR = "AUTO,STRICT"


def ensure() -> None:
    os.environ.setdefault("MKL_CBWR", MKL_CBWR)


def check() -> str | None:
    """None when products are batch-invariant; else why grouped may differ from alone."""
    value = os.environ.get("MKL_CBWR", "")
    if "STRICT" in value.upper():
        return None
    return (f"MKL_CBWR={value!r} is not strict: on some CPUs a row's product depends on the rows "
            f"computed with it, so grouped forwards may differ from alone (unset it, or use {MKL_CBWR})")
