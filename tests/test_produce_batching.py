"""``benchmarks/produce_batching.py`` on the real broker: both modes run, every observation is
read back, and the report prints the ratio for each figure."""

from __future__ import annotations

import pytest

from benchmarks.produce_batching import MODES, main, measure, report
from infra.broker import LocalBroker

pytestmark = pytest.mark.broker


async def test_both_modes_run_and_read_every_observation_back(broker: LocalBroker) -> None:
    pid = broker.pid()
    assert pid is not None
    results = await measure(broker.settings, rounds=5, sessions=4, repeats=2, broker_pid=pid)
    assert set(results) == set(MODES)
    for rows in results.values():
        assert len(rows) == 2
        for row in rows:
            assert row["client_us"] > 0 and row["wall_us"] > 0 and row["broker_us"] >= 0
    table = report(results)
    assert table.count("\n") == 4 and "together / alone" in table


def test_rejects_an_empty_run() -> None:
    with pytest.raises(SystemExit):
        main(["--rounds", "0"])
