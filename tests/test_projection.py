"""The projection model: hand-checkable cases (the numbers below are worked out by hand in the
comments), the chain extraction from a trace, and the duration models."""

from __future__ import annotations

import json

import pytest

from benchmarks import projection as pj


def _trace(mode: str, tenants: list[str], spans, forwards) -> dict:
    return {"mode": mode, "repeat": 0, "tenants": tenants, "kinds": ["rl"] * len(tenants), "spans": spans,
            "makespan_s": max(e for _, e in spans) - min(s for s, _ in spans),
            "forwards": {"format": "joynexus.forwards.v1", "forwards": forwards}}


def test_chains_are_the_gaps_between_a_tenants_forwards() -> None:
    run = _trace("isolated", ["a", "b"], [[0.0, 4.0], [4.0, 6.0]], [
        ["inference", 1.0, 1.5, ["a"]], ["train", 2.5, 3.0, ["a", "a"]], ["inference", 5.0, 5.25, ["b"]]])
    a, b = pj.chains_of(run)
    assert a.items == (pj.Item("inference", 1, 1.0), pj.Item("train", 2, 1.0)) and a.tail_s == 1.0
    assert b.items == (pj.Item("inference", 1, 1.0),) and b.tail_s == 0.75


def test_two_tenants_fill_each_others_gaps_and_share_forwards() -> None:
    # each: gap 1, forward 0.5, gap 1, forward 0.5, tail 1 -> alone 4 s; one after another 8 s
    chain = (pj.Item("inference", 1, 1.0), pj.Item("inference", 1, 1.0))
    chains = [pj.Chain("a", chain, 1.0), pj.Chain("b", chain, 1.0)]
    half = pj.assumed_duration(500.0, 0.0)
    iso = pj.isolated(chains, half)
    assert iso["device_time_s"] == pytest.approx(8.0)
    assert iso["busy_fraction_inference"] == pytest.approx(0.25)
    # together: both ready at 1.0, one forward of 2 rows (0.5 s), both ready at 2.5, one more, tails: 4 s
    sha = pj.shared(chains, half)
    assert sha["device_time_s"] == pytest.approx(4.0) and sha["forwards"] == 2
    assert sha["busy_inference_s"] == pytest.approx(1.0)


def test_host_slots_serialise_the_host_gaps() -> None:
    # two tenants, each: gap 1, forward 0.1, tail 0; one host slot: gaps 0-1 and 1-2
    chains = [pj.Chain(t, (pj.Item("train", 1, 1.0),), 0.0) for t in "ab"]
    tenth = pj.assumed_duration(100.0, 0.0)
    assert pj.shared(chains, tenth)["device_time_s"] == pytest.approx(1.1)  # one forward for both
    assert pj.shared(chains, tenth, host_slots=1)["device_time_s"] == pytest.approx(2.1)


def test_one_device_serialises_and_inference_goes_first() -> None:
    # a: train item ready at 0; b: inference ready at 0 -> inference runs 0-1, then train 1-2
    train = pj.Chain("a", (pj.Item("train", 4, 0.0),), 0.0)
    chains = [train, pj.Chain("b", (pj.Item("inference", 1, 0.0),), 0.0)]
    one_second = pj.assumed_duration(1000.0, 0.0)
    sha = pj.shared(chains, one_second)
    assert sha["device_time_s"] == pytest.approx(2.0) and sha["busy_train_s"] == pytest.approx(1.0)
    # b alone later: its request waits for the device and its tail starts after
    chains = [train, pj.Chain("b", (pj.Item("inference", 1, 0.5),), 3.0)]
    assert pj.shared(chains, one_second)["device_time_s"] == pytest.approx(1.0 + 1.0 + 3.0)


def test_a_group_waits_for_every_recently_answered_tenant_but_at_most_t() -> None:
    # a and b asked at 0 and were answered together at 0.1; a asks again at 0.2, b at 0.25
    rule = pj.Policy(max_wait_s=0.1, target_rows=8)
    tenth = pj.assumed_duration(100.0, 0.0)
    chains = [pj.Chain("a", (pj.Item("inference", 1, 0.0), pj.Item("inference", 1, 0.1)), 0.0),
              pj.Chain("b", (pj.Item("inference", 1, 0.0), pj.Item("inference", 1, 0.15)), 0.0)]
    # complete at 0.25 (b back), before T runs out (0.3): one group 0.25-0.35
    sha = pj.shared(chains, tenth, rule)
    assert sha["forwards"] == 2 and sha["device_time_s"] == pytest.approx(0.35)
    # b back only at 0.5: T (0.2 + 0.1) flushes a alone at 0.3-0.4; b then waits its own T for a
    # (answered at 0.4, expected back for 1 s, as the batcher expects a closed session): 0.6-0.7
    chains[1] = pj.Chain("b", (pj.Item("inference", 1, 0.0), pj.Item("inference", 1, 0.4)), 0.0)
    sha = pj.shared(chains, tenth, rule)
    assert sha["forwards"] == 3 and sha["device_time_s"] == pytest.approx(0.7)
    # B reached by a alone (8 rows): no waiting for b, a goes at 0.2-0.3
    chains[0] = pj.Chain("a", (pj.Item("inference", 1, 0.0), pj.Item("inference", 8, 0.1)), 0.0)
    sha = pj.shared(chains, tenth, rule)
    assert sha["busy_inference_s"] == pytest.approx(0.3) and sha["device_time_s"] == pytest.approx(0.7)
    chains[0] = pj.Chain("a", (pj.Item("inference", 1, 0.0), pj.Item("inference", 8, 0.1)), 5.0)
    assert pj.shared(chains, tenth, rule)["device_time_s"] == pytest.approx(0.3 + 5.0)


def test_training_waits_for_inference_only_up_to_its_bound() -> None:
    # b asks for 1 s forwards back to back (no host gap); a's training item is ready at 0.5
    second = pj.assumed_duration(1000.0, 0.0)
    asks = pj.Chain("b", tuple(pj.Item("inference", 1, 0.0) for _ in range(5)), 0.0)
    train = pj.Chain("a", (pj.Item("train", 1, 0.5),), 0.0)
    # strict priority: training after all five (5-6); bounded at 2 s: it waited 0.5-3.0, goes 3-4
    strict = pj.shared([train, asks], second, pj.Policy(train_max_wait_s=None))
    bounded = pj.shared([train, asks], second, pj.Policy(train_max_wait_s=2.0))
    assert strict["device_time_s"] == pytest.approx(6.0) and bounded["device_time_s"] == pytest.approx(6.0)
    assert strict["busy_train_s"] == bounded["busy_train_s"] == pytest.approx(1.0)
    # the order shows in what a training tail after the item costs: 5 s tail ends at 11 vs 9
    train = pj.Chain("a", (pj.Item("train", 1, 0.5),), 5.0)
    for bound, end in ((None, 11.0), (2.0, 9.0)):
        sha = pj.shared([train, asks], second, pj.Policy(train_max_wait_s=bound))
        assert sha["device_time_s"] == pytest.approx(end)


def test_training_items_share_a_forward_up_to_one_budgeted_chunk() -> None:
    # 10 ms per row, budget 0.2 s: 20 rows per forward; three tenants' 8-row items ready together
    per_row = pj.assumed_duration(0.0, 10.0)
    chains = [pj.Chain(t, (pj.Item("train", 8, 0.0),), 0.0) for t in "abc"]
    sha = pj.shared(chains, per_row, pj.Policy(train_budget_s=0.2))
    assert sha["forwards"] == 2  # a+b (16 rows), then c
    assert pj.shared(chains, per_row, pj.Policy(train_budget_s=None))["forwards"] == 1


def test_duration_models(tmp_path) -> None:
    runs = [_trace("isolated", ["a"], [[0.0, 10.0]], [
        ["inference", 0.0, 0.003, ["a"]], ["inference", 1.0, 1.005, ["a", "a"]],
        ["train", 2.0, 2.1, ["a"] * 10], ["train", 3.0, 3.3, ["a"] * 30]])]
    fit = pj.cpu_duration(runs)
    assert fit("inference", 1) == pytest.approx(0.003) and fit("inference", 3) == pytest.approx(0.007)
    assert fit("train", 20) == pytest.approx(0.2)
    table = tmp_path / "gb.json"
    table.write_text(json.dumps([{"tenants": t, "local_batch": b, "grouped_s": 0.01 * t * b + 0.01}
                                 for t in (1, 2) for b in (1, 2)]))
    gpu = pj.table_duration(table)
    assert gpu("train", 3) == pytest.approx(0.04) and gpu("train", 8) == pytest.approx(0.09)  # extrapolated


def _write_two_tenants(run_dir) -> None:
    """Alone each 4 s: gap 1, forward 0.5, gap 0.5, forward 0.5, tail 1.5; measured together 4.4 s."""
    iso = _trace("isolated", ["a", "b"], [[0.0, 4.0], [4.0, 8.0]], [
        ["inference", 1.0, 1.5, ["a"]], ["inference", 2.0, 2.5, ["a"]],
        ["inference", 5.0, 5.5, ["b"]], ["inference", 6.0, 6.5, ["b"]]])
    sha = _trace("shared", ["a", "b"], [[0.0, 4.4], [0.0, 4.4]], [])
    (run_dir / "traces.json").write_text(json.dumps([iso, sha]))


def test_main_prints_the_projection_label_and_the_cpu_miss(tmp_path, capsys) -> None:
    _write_two_tenants(tmp_path)
    result = pj.main([str(tmp_path), "--json", str(tmp_path / "p.json")])
    out = capsys.readouterr().out
    assert "PROJECTION, not a measurement" in out and "ASSUMED GPU forward times" in out
    # host unlimited: both ready at 1.0, one forward of 2 rows, both ready at 2.0, one more, tails: 4.0 s
    assert result["model_cpu_unlimited_host"]["shared"]["device_time_s"] == pytest.approx(4.0)
    # one host slot (the default), T = 50 ms: host gaps run one at a time. a's gap 0-1, forward
    # 1-1.5; b's gap 1-2; a's gap 2-2.5; b asks at 2.0 and waits for a (answered at 1.5, expected
    # back) until T: 2.05-2.55; a asked at 2.5, goes when the batcher is free: 2.55-3.05; b's gap
    # 2.55-3.05; a's tail 3.05-4.55; b asks at 3.05 and waits T for a (done, but answered within the
    # window): 3.10-3.60; b's tail waits for the slot: 4.55-6.05
    assert result["model_cpu"]["shared"]["device_time_s"] == pytest.approx(6.05)
    assert result["model_cpu_miss"]["shared"] == pytest.approx(6.05 / 4.4 - 1)
    assert result["model_cpu_miss"]["shared_unlimited_host"] == pytest.approx(4.0 / 4.4 - 1)
    assert json.loads((tmp_path / "p.json").read_text())["gpu_source"].startswith("ASSUMED")


def test_main_plays_the_cores_model_when_the_run_recorded_each_turns_cpu(tmp_path, capsys) -> None:
    _write_two_tenants(tmp_path)
    pj.main([str(tmp_path)])
    assert "cores model: not played" in capsys.readouterr().out  # no multi_tenant.json
    # each tenant alone: its forwards (1 s) all of its device host's CPU; 3 CPU s of simulators and
    # broker over its 4 s turn: 0.75 of core 1 in its gaps and beside its forwards
    turn = {"cpu_device_s": 1.0, "cpu_env_s": 2.5, "cpu_broker_s": 0.5}
    (tmp_path / "multi_tenant.json").write_text(json.dumps({
        "deployment": "processes", "cpu_affinity": {"device": [0], "rest": [1]},
        "runs": [{"mode": "isolated", "repeat": 0, "turn_cpu": [turn, turn]},
                 {"mode": "shared", "repeat": 0, "turn_cpu": [turn]}]}))
    result = pj.main([str(tmp_path)])
    assert "cores model vs measurement" in capsys.readouterr().out
    # together both gaps ask 1.5 of core 1 and run at 2/3 pace: ready at 1.5, one forward 1.5-2.0,
    # ready again at 2.75, forward 2.75-3.25, tails of 1.5 s take 2.25: 5.5 s; alone as measured, 8 s
    cores = result["model_cpu_cores"]
    assert cores["shared"]["device_time_s"] == pytest.approx(5.5)
    assert cores["isolated"]["device_time_s"] == pytest.approx(8.0)
    assert result["model_cpu_cores_miss"]["shared"] == pytest.approx(5.5 / 4.4 - 1)
    # with 14 cores for the rest (the GPU plan) nothing contends: the host-unlimited replay
    assert result["projection_gpu_cores"]["shared"]["device_time_s"] == pytest.approx(
        result["projection_gpu"]["shared"]["device_time_s"])


def test_the_host_share_of_gpu_forwards_comes_from_the_table(tmp_path) -> None:
    table = tmp_path / "gb.json"
    rows = [{"tenants": 1, "local_batch": b, "grouped_s": 0.1, "grouped_host_s": h}
            for b, h in ((1, 0.09), (2, 0.05), (4, 0.03))]
    table.write_text(json.dumps(rows))
    assert pj.host_share(table) == pytest.approx(0.5)  # the median of 0.9, 0.5, 0.3
    table.write_text(json.dumps([{k: v for k, v in r.items() if k != "grouped_host_s"} for r in rows]))
    assert pj.host_share(table) is None  # a table from before it was recorded
