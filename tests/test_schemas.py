"""Schemas, Python types and the codec, without a broker."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastavro import schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.errors import DecodeError, SchemaError, UnknownSchema
from schemas.check import all_drift, drift
from schemas.codec import Codec
from schemas.confluent import ConfluentRegistry
from schemas.events import EVENT_TYPES, Envelope, Heartbeat, RoleStatus, Tensor
from schemas.jobspec import JobSpecInvalid
from schemas.jobstate import JobState
from schemas.registry import HISTORY_DIR, SCHEMA_DIR, SchemaRegistry
from schemas.tensors import from_numpy, to_numpy
from tests.strategies import any_event, avro_strategy

FIXTURES = Path(__file__).parent / "fixtures" / "avro"
EXPECTED_EVENTS = {
    "JobSubmitted", "JobAccepted", "JobRejected", "JobProgress", "JobCompleted", "JobFailed",
    "JobCancelled", "Observation", "Action", "RolloutRecord", "GradientJob", "FeatureBatch",
    "PolicyVersionPublished", "Heartbeat", "UsageRecorded", "TenantRegistered",
    "EnvSessionRequested", "EnvSessionClosed", "EnvSessionProgress", "EnvSessionRestarted",
    "InstanceVerdict", "InstanceRestarted",
}


def test_one_named_type_per_file_in_the_namespace() -> None:
    for path in SCHEMA_DIR.glob("*.avsc"):
        schema = json.loads(path.read_text())
        assert schema["namespace"] == "joynexus.v1", path
        assert path.stem == schema["name"], path
    assert {n.rsplit(".", 1)[1] for n in EVENT_TYPES} == EXPECTED_EVENTS


def test_every_event_carries_the_envelope() -> None:
    registry = SchemaRegistry()
    envelope = registry.current("joynexus.v1.Envelope").parsed
    assert [f["name"] for f in envelope["fields"]][:4] == [
        "event_id", "tenant_id", "occurred_at", "producer_id"]
    ts = next(f for f in envelope["fields"] if f["name"] == "occurred_at")
    assert ts["type"]["logicalType"] == "timestamp-millis"
    for name in EVENT_TYPES:
        first = registry.current(name).parsed["fields"][0]
        assert first["name"] == "envelope", name


def test_python_types_match_the_schemas() -> None:
    assert all_drift() == []


def test_drift_is_detected() -> None:
    """The drift check itself must fail on a class that disagrees with its schema."""
    registry = SchemaRegistry()
    schema = registry.current(Heartbeat.__avro_name__).parsed
    tampered = {**schema, "fields": [
        {**f, "type": "string"} if f["name"] == "pid" else f for f in schema["fields"]
    ] + [{"name": "extra", "type": "long"}]}
    problems = drift(Heartbeat, tampered)
    assert any("Heartbeat.pid" in p for p in problems)
    assert any("fields" in p and "extra" in p for p in problems)


def test_fingerprints_are_unique_and_stable() -> None:
    a, b = SchemaRegistry(), SchemaRegistry()
    fps = [a.current(n).fingerprint for n in a.names()]
    assert len(set(fps)) == len(fps)
    assert fps == [b.current(n).fingerprint for n in b.names()]


def test_canonical_form_defines_each_named_type_once() -> None:
    # fastavro's expand=True inlines a type at every use; ours must not.
    canonical = SchemaRegistry().current("joynexus.v1.RolloutRecord").canonical
    assert canonical.count('"name":"joynexus.v1.Tensor","type":"record"') == 1


def test_single_object_header() -> None:
    codec = Codec()
    event = Heartbeat(envelope=Envelope(), role="master", instance_id="i", host="h", pid=1,
                      status=RoleStatus.HEALTHY, sequence=0)
    data = codec.encode(event)
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == codec.registry.current(Heartbeat.__avro_name__).fingerprint


@settings(max_examples=300, deadline=None)
@given(any_event())
def test_codec_round_trip_property(event) -> None:
    codec = Codec()
    assert codec.decode(codec.encode(event)) == event


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_raises_decode_error_only(data: bytes) -> None:
    with pytest.raises(SchemaError):
        Codec().decode(data)


@pytest.mark.parametrize("data, message", [
    (b"", "empty"),
    (b"\xc3\x01\x00", "truncated"),
    (b"\xc3\x01" + b"\xff" * 8 + b"body", "fingerprint ffffffffffffffff"),
    (b"{\"json\": true}", "unknown framing"),
    (b"\x00\x00\x00\x00\x07body", "no registry configured"),
])
def test_bad_bytes_get_clear_errors(data: bytes, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        Codec().decode(data)


def test_truncated_body_is_a_decode_error() -> None:
    codec = Codec()
    event = Heartbeat(envelope=Envelope(), role="env", instance_id="i", host="h", pid=1,
                      status=RoleStatus.STARTING, sequence=3, details={"k": "v" * 50})
    data = codec.encode(event)
    with pytest.raises(DecodeError, match="Heartbeat"):
        codec.decode(data[:-20])
    with pytest.raises(DecodeError, match="trailing"):
        codec.decode(data + b"\x00\x00")


def test_record_written_with_older_schema_decodes_with_current() -> None:
    data = (FIXTURES / "Heartbeat.v0.bin").read_bytes()
    bare = Codec()
    with pytest.raises(UnknownSchema):
        bare.decode(data)
    codec = Codec(SchemaRegistry(history_dirs=(FIXTURES,)))
    event = codec.decode(data)
    assert isinstance(event, Heartbeat)
    assert (event.role, event.host, event.pid, event.sequence) == ("master", "fixture-host", 4242, 7)
    assert event.details == {}  # the field added after v0 takes its default


def _historical_schemas() -> list[Path]:
    return sorted(FIXTURES.glob("*.avsc")) + sorted(HISTORY_DIR.glob("*.avsc"))


@pytest.mark.parametrize("path", _historical_schemas(), ids=lambda p: p.name)
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_backward_transitive(path: Path, data: st.DataObject) -> None:
    """Every older version of a schema stays readable by the current one."""
    registry = SchemaRegistry(history_dirs=(FIXTURES,))
    old = registry.add_writer_schema(json.loads(path.read_text()), source=path)
    record = data.draw(avro_strategy(old.parsed))
    buf = io.BytesIO()
    buf.write(b"\xc3\x01" + old.fingerprint)
    schemaless_writer(buf, old.parsed, record)
    decoded = Codec(registry).decode(buf.getvalue())
    assert type(decoded).__avro_name__ == old.fullname


class FakeConfluentRegistry:
    """Stand-in for the external Confluent schema registry's REST API (two endpoints)."""

    def __init__(self) -> None:
        self.schemas: dict[int, str] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.startswith("/subjects/"):
            schema = json.loads(request.content)["schema"]
            for sid, known in self.schemas.items():
                if known == schema:
                    return httpx.Response(200, json={"id": sid})
            sid = 100 + len(self.schemas)
            self.schemas[sid] = schema
            return httpx.Response(200, json={"id": sid})
        if request.method == "GET" and request.url.path.startswith("/schemas/ids/"):
            sid = int(request.url.path.rsplit("/", 1)[1])
            if sid not in self.schemas:
                return httpx.Response(404, json={"error_code": 40403})
            return httpx.Response(200, json={"schema": self.schemas[sid]})
        return httpx.Response(404)


def test_confluent_framing_round_trip() -> None:
    fake = FakeConfluentRegistry()
    transport = httpx.MockTransport(fake)
    writer = Codec(ids=ConfluentRegistry("http://registry", transport=transport))
    event = Heartbeat(envelope=Envelope(), role="master", instance_id="i", host="h", pid=1,
                      status=RoleStatus.HEALTHY, sequence=0)
    data = writer.encode(event)
    assert data[0] == 0 and struct.unpack(">I", data[1:5])[0] == 100
    # A fresh reader learns the schema from the registry by id.
    reader = Codec(ids=ConfluentRegistry("http://registry", transport=transport))
    assert reader.decode(data) == event
    # A single-object record still decodes with a Confluent-configured codec.
    assert reader.decode(Codec().encode(event)) == event
    with pytest.raises(UnknownSchema, match="id 999"):
        reader.decode(b"\x00" + struct.pack(">I", 999) + b"x")


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "uint8", "bool", "float16"])
def test_tensor_round_trip(dtype: str) -> None:
    array = (np.arange(24).reshape(2, 3, 4) % 7).astype(dtype)
    back = to_numpy(Codec().decode(Codec().encode(_carrier(from_numpy(array)))).action)
    assert back.dtype == array.dtype and np.array_equal(back, array)


def test_tensor_with_wrong_byte_count_is_refused() -> None:
    with pytest.raises(DecodeError, match="needs 24 bytes"):
        to_numpy(Tensor(dtype="float32", shape=(2, 3), data=b"\x00" * 20))


def _carrier(tensor: Tensor):
    from schemas.events import Action
    return Action(envelope=Envelope(tenant_id="acme"), session_id="s", episode_id="e", step=0,
                  action=tensor, policy_version=1)


def test_a_job_states_spec_is_parsed_once_per_text() -> None:
    """Roles read every running job's spec after every poll: the state parses it once, again only
    when its text changes, and an invalid text fails every time (nothing half-parsed is kept)."""
    state = JobState(tenant="t", job_id="j")
    state.spec_json = json.dumps({"kind": "rl", "tenant": "t", "job_id": "j", "env": {}})
    first = state.spec
    assert state.spec is first and first.job_id == "j" and first.kind == "rl"
    state.spec_json = json.dumps({"kind": "rl", "tenant": "t", "job_id": "k", "env": {}})
    assert state.spec.job_id == "k"
    state.spec_json = "{kind: nonsense"
    for _ in range(2):
        with pytest.raises(JobSpecInvalid):
            state.spec  # noqa: B018 - the property is what is tested
