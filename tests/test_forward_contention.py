"""The forward-contention benchmark runs its four cases and prints each loaded case against its baseline."""

from __future__ import annotations

import sys

from benchmarks import forward_contention


def test_four_cases_each_loaded_one_beside_its_idle_baseline(capsys) -> None:
    before = sys.getswitchinterval()
    results = forward_contention.main(["--n", "3", "--rows", "2"])
    out = capsys.readouterr().out
    assert len(results) == 4 and all(r["median_ms"] > 0 for r in results.values())
    assert out.count("of idle") == 2 and "2 rows per forward" in out
    assert sys.getswitchinterval() == before  # the interpreter is left as it was found
