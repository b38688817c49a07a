"""Reproducible tensor math: batch-invariant products, and seeded construction that threads share.

**Batch-invariant matrix products on every CPU: what grouped == alone, bit for bit, stands on.**

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

**Seeded construction.** torch modules draw their initial weights from the process's ONE global
generator, so "same seed, same weights" holds only while nothing else seeds or draws from it.
``torch.random.fork_rng`` restores the state afterwards but guards nothing: where roles share a
process, the master builds a tenant's first version on the event loop while inference and the
optimizer rebuild other tenants' slots in worker threads, and their seed-then-draw sections
interleaved (measured: 8 threads building policies, 1,464 of 1,600 builds differed from the same
build alone; the load test once saw an RL tenant end unlike its solo run). ``seeded(seed)`` is
the one way this project seeds the global generator: a process-wide lock around fork, seed and
the block, so such sections run one at a time. A section must not wait for another thread that
needs ``seeded`` itself (the lock is reentrant for the thread holding it).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["MKL_CBWR", "check", "ensure", "seeded"]

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


_global_rng = threading.RLock()


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the block with torch's global CPU generator seeded to ``seed``, alone among the process's
    seeded sections; the generator's state before the block is restored after it."""
    import torch  # here: importing infra must not import torch

    with _global_rng, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
