"""The load benchmark at a test-sized load (4 tenants: 3 PPO, one of them with a policy suffix, 1 SFT):
every job completes, nothing is lost and every tenant's final parameters equal its solo run; lag is
sampled from the groups."""

from __future__ import annotations

import pytest

from benchmarks import load


@pytest.mark.broker
@pytest.mark.slow
async def test_four_tenants_at_once_equal_their_solo_runs(settings, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("JOYNEXUS_BOOTSTRAP_SERVERS", settings.bootstrap)
    monkeypatch.setenv("JOYNEXUS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("JOYNEXUS_BACKBONE", "tiny")
    result = await load.main(load.parse(["--tenants", "4", "--lag-every", "0.5",
                                         "--json", str(tmp_path / "load.json")]))
    assert [r["kind"] for r in result["rows"]] == ["rl", "rl", "rl", "sft"]
    differing = [{k: row[k] for k in ("tenant", "kind", "same_actions", "differing")}
                 for row in result["rows"] if not row["identical"]]
    assert result["completed"] == result["nothing_lost"] == result["identical_to_solo"] == 4, differing
    assert all(row["same_actions"] for row in result["rows"])
    for row in result["rows"]:
        assert row["counts"]["features"] > 0 and row["counts"] == row["solo_counts"]
        assert (row["counts"]["rollouts"] > 0) == (row["kind"] == "rl")
        assert row["actions_compared"] == row["counts"]["rollouts"]
    assert {"inference", "backbone-train"} <= set(result["max_lag"])
    assert (tmp_path / "load.json").exists()


def test_specs_have_distinct_seeds_and_the_asked_work(tmp_path) -> None:
    specs = load.load_specs(16, tmp_path, iterations=2, episodes=3, steps=5)
    assert len({s["seed"] for s in specs}) == 16 and len({s["tenant"] for s in specs}) == 16
    rl = [s for s in specs if s["kind"] == "rl"]
    assert [i for i, s in enumerate(specs) if s.get("modules", {}).get("suffix")] == [1, 5, 9, 13]
    assert len(rl) == 12 and all(s["rl"]["iterations"] == 2 and s["rl"]["episodes_per_iteration"] == 3
                                 and s["env"]["max_episode_steps"] == 5 for s in rl)
