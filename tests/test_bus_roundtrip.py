"""The round-trip benchmark measures what it says: Observations really travel through the broker
and come back as Actions for the right session and step, every step is answered, and the RL-step
share is computed from the measured parts (no figure is asserted against wall time)."""

from __future__ import annotations

import pytest

from benchmarks import bus_roundtrip
from schemas.codec import Codec


@pytest.mark.broker
async def test_round_trip_rows_for_the_builtin_task(settings, backbones) -> None:
    tiny = backbones["tiny"]
    row = await bus_roundtrip.measure_task(settings, "joynexus/Reach-v0", tiny, n=12, inflight=3)
    assert row.task == "joynexus/Reach-v0" and row.backbone == tiny.backbone_id
    assert row.obs_bytes > 32 * 32 * 3  # the task's real 32 px RGB observation, Avro-framed
    for trip in (row.kafka, row.inprocess):
        assert 0 < trip.p50_ms <= trip.p99_ms and trip.per_s > 0
    assert row.env_step_ms > 0 and row.forward_ms > 0
    total = row.env_step_ms + row.forward_ms + row.kafka.p50_ms
    assert row.bus_share == pytest.approx(row.kafka.p50_ms / total)
    d = row.as_dict()
    assert d["latency_ratio"] == pytest.approx(row.kafka.p50_ms / row.inprocess.p50_ms)
    assert "| joynexus/Reach-v0 |" in bus_roundtrip.markdown([row], 3)


@pytest.mark.broker
async def test_the_responder_answers_each_step_of_each_session(settings) -> None:
    # A lost or mis-routed action would leave a step waiting (asyncio.wait_for raises after 30 s).
    _, template, action_dim = bus_roundtrip.env_step_ms("joynexus/Reach-v0", 3)
    trip = await bus_roundtrip.kafka_round_trip(settings, template, action_dim, n=10, inflight=5)
    assert trip.per_s > 0 and trip.p99_ms >= trip.p50_ms
    action = bus_roundtrip._respond(template, action_dim)
    assert (action.session_id, action.step) == (template.session_id, template.step)
    assert Codec().decode(Codec().encode(action)) == action
