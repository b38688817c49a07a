"""The cores model of the projection: hand-checkable cases (worked out in the comments), its
calibration from an isolated turn's CPU, and that without CPU it replays as projection.shared does."""

from __future__ import annotations

import random

import pytest

from benchmarks import cores_model as cm
from benchmarks import projection as pj

PLAN = {"device": [0], "optimizer": [0], "rest": [1]}
KINDS, CORES = cm.groups_of(PLAN)
DEV, REST = "cpus 0", "cpus 1"
TENTH = pj.assumed_duration(100.0, 0.0)


def _load(dev: float = 0.0, rest: float = 0.0, rest_beside_forward: float = 0.0) -> cm.Load:
    return cm.Load({DEV: dev, REST: rest}, {REST: rest_beside_forward})


def test_the_plan_groups_kinds_by_their_cpus() -> None:
    assert KINDS == {"device": DEV, "optimizer": DEV, "rest": REST}
    assert CORES.capacity == {DEV: 1.0, REST: 1.0} and CORES.device == DEV
    with pytest.raises(ValueError, match="disjoint"):
        cm.groups_of({"device": [0], "optimizer": [0, 1], "rest": [1]})
    with pytest.raises(ValueError, match="'device' and 'rest'"):
        cm.groups_of({"device": [0]})


def test_two_gaps_that_each_fill_the_rest_core_take_turns() -> None:
    # each tenant: a 1 s gap using all of core 1, then a 0.1 s forward. Alone 1.1 s, one after
    # another 2.2 s; at once both gaps run at half pace (ready at 2.0), one forward of both: 2.1 s
    chains = [pj.Chain(t, (pj.Item("train", 1, 1.0),), 0.0) for t in "ab"]
    loads = [_load(rest=1.0)] * 2
    policy = pj.Policy()
    assert cm.replay_isolated(chains, loads, TENTH, policy, CORES)["device_time_s"] == pytest.approx(2.2)
    shared = cm.replay(chains, loads, TENTH, policy, CORES)
    assert shared["device_time_s"] == pytest.approx(2.1) and shared["forwards"] == 1
    two_cores = cm.Cores({DEV: 1.0, REST: 2.0}, DEV)
    assert cm.replay(chains, loads, TENTH, policy, two_cores)["device_time_s"] == pytest.approx(1.1)
    # half a core each: both fit, no slowdown
    half = cm.replay(chains, [_load(rest=0.5)] * 2, TENTH, policy, CORES)
    assert half["device_time_s"] == pytest.approx(1.1)


def test_a_forward_shares_its_core_with_host_work_on_it() -> None:
    # a: a 1 s forward at once; b: a 1 s tail using all of the device's core. Together on core 0
    # both run at half pace and end at 2.0; the forward held the device 2 wall seconds.
    a = pj.Chain("a", (pj.Item("inference", 1, 0.0),), 0.0)
    b = pj.Chain("b", (), 1.0)
    one_second = pj.assumed_duration(1000.0, 0.0)
    out = cm.replay([a, b], [_load(), _load(dev=1.0)], one_second, pj.Policy(), CORES)
    assert out["device_time_s"] == pytest.approx(2.0) and out["busy_inference_s"] == pytest.approx(2.0)
    # a GPU forward that leaves its host core idle does not slow b, nor b it
    gpu = cm.Cores(CORES.capacity, DEV, forward_share=0.0)
    assert cm.replay([a, b], [_load(), _load(dev=1.0)], one_second, pj.Policy(), gpu)["device_time_s"] \
        == pytest.approx(1.0)


def test_work_beside_a_forward_slows_the_others_gaps() -> None:
    # a: a 1 s forward at once, beside which its simulators use all of core 1; b: a 1 s gap on core 1.
    # Core 1 is asked twice its core during a's forward: b's gap runs at half pace for 1 s, then alone
    # 0.5 s -> b ready at 1.5; a, answered at 1.0, is expected back, so b's request waits T (50 ms):
    # its forward runs 1.55-2.55
    a = pj.Chain("a", (pj.Item("inference", 1, 0.0),), 0.0)
    b = pj.Chain("b", (pj.Item("inference", 1, 1.0),), 0.0)
    one_second = pj.assumed_duration(1000.0, 0.0)
    out = cm.replay([a, b], [_load(rest_beside_forward=1.0), _load(rest=1.0)], one_second, pj.Policy(), CORES)
    assert out["device_time_s"] == pytest.approx(2.55)


def test_loads_come_from_the_isolated_turns_cpu() -> None:
    # tenant a: 4 s turn, one 1 s forward. Core 0 (device host + optimizer): 2.5 CPU s, 1 of them the
    # forward -> 1.5 over 3 s of gaps = 0.5. Core 1 (env, broker, client): 2 CPU s over the 4 s = 0.5
    trace = {"mode": "isolated", "repeat": 0, "tenants": ["a"], "spans": [[0.0, 4.0]],
             "forwards": {"forwards": [["inference", 1.0, 2.0, ["a"]]]}}
    turn = [{"cpu_device_s": 2.0, "cpu_optimizer_s": 0.5, "cpu_env_s": 1.5, "cpu_broker_s": 0.4,
             "cpu_client_s": 0.1}]
    (load,) = cm.loads_of(trace, turn, KINDS, CORES)
    assert load.gap == pytest.approx({DEV: 0.5, REST: 0.5}) and load.forward == pytest.approx({REST: 0.5})
    with pytest.raises(ValueError, match="turn_cpu"):
        cm.loads_of(trace, turn * 2, KINDS, CORES)
    passes = [{"mode": "isolated", "repeat": 0}]
    with pytest.raises(ValueError, match="no turn_cpu"):
        cm.project_cores([trace], passes, TENTH, pj.Policy(), PLAN)
    # alone, the replay is the measured chain: 1 s gap + 1 s forward + 2 s tail
    out = cm.project_cores([trace], [{"mode": "isolated", "repeat": 0, "turn_cpu": turn}],
                           pj.assumed_duration(1000.0, 0.0), pj.Policy(), PLAN)
    assert out["isolated"]["device_time_s"] == pytest.approx(4.0)


def test_without_cpu_it_replays_as_the_unlimited_host_model() -> None:
    # the device rules are shared with projection.shared: with no CPU asked, both give the same
    rng = random.Random(7)
    policy = pj.Policy()
    for _ in range(20):
        chains = []
        for tenant in "abcd":
            items = tuple(pj.Item(rng.choice(("inference", "inference", "train")), rng.randint(1, 9),
                                  rng.uniform(0.0, 0.08)) for _ in range(rng.randint(1, 25)))
            chains.append(pj.Chain(tenant, items, rng.uniform(0.0, 0.1)))
        duration = pj.assumed_duration(rng.uniform(1.0, 20.0), rng.uniform(0.1, 3.0))
        ours = cm.replay(chains, [_load()] * 4, duration, policy, CORES)
        theirs = pj.shared(chains, duration, policy)
        assert ours["device_time_s"] == pytest.approx(theirs["device_time_s"], rel=1e-9)
        assert ours["forwards"] == theirs["forwards"]
