"""Hypothesis strategies derived from the Avro schemas themselves, so every field of
every event is exercised without hand-written factories."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import strategies as st

from schemas.events import EVENT_TYPES, Event
from schemas.registry import SchemaRegistry

_REGISTRY = SchemaRegistry()
_TEXT = st.text(max_size=12)
_LONG = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_INT = st.integers(min_value=-(2**31), max_value=2**31 - 1)
_DOUBLE = st.floats(allow_nan=False, width=64)  # NaN != NaN would fail equality, not the codec
_TIMES = st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1),
                      timezones=st.just(UTC))


def avro_strategy(schema: Any, named: dict[str, Any] | None = None) -> st.SearchStrategy:
    named = {} if named is None else named
    if isinstance(schema, list):
        return st.one_of(*(avro_strategy(s, named) for s in schema))
    if isinstance(schema, str):
        if schema in named:
            return st.deferred(lambda: named[schema])
        return {
            "null": st.none(), "boolean": st.booleans(), "int": _INT, "long": _LONG,
            "double": _DOUBLE, "float": st.floats(allow_nan=False, width=32),
            "bytes": st.binary(max_size=64), "string": _TEXT,
        }[schema]
    if schema.get("logicalType") == "timestamp-millis":
        return _TIMES
    kind = schema["type"]
    if kind == "record":
        fields = {f["name"]: avro_strategy(f["type"], named) for f in schema["fields"]}
        strategy = st.fixed_dictionaries(fields)
        named[schema["name"]] = strategy
        return strategy
    if kind == "enum":
        strategy = st.sampled_from(schema["symbols"])
        named[schema["name"]] = strategy
        return strategy
    if kind == "array":
        return st.lists(avro_strategy(schema["items"], named), max_size=3)
    if kind == "map":
        return st.dictionaries(_TEXT, avro_strategy(schema["values"], named), max_size=3)
    return avro_strategy(kind, named)


def events_of(cls: type[Event]) -> st.SearchStrategy[Event]:
    schema = _REGISTRY.current(cls.__avro_name__).parsed
    return avro_strategy(schema).map(cls.model_validate)


def any_event() -> st.SearchStrategy[Event]:
    return st.one_of(*(events_of(cls) for cls in EVENT_TYPES.values()))


def filled(schema: Any, named: dict[str, Any] | None = None) -> Any:
    """A deterministic value for a schema with every optional branch filled in."""
    named = {} if named is None else named
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        return filled(branches[0], named) if branches else None
    if isinstance(schema, str):
        if schema in named:
            return filled(named[schema], named)
        return {"null": None, "boolean": True, "int": 7, "long": 2**40, "double": 0.5,
                "float": 0.25, "bytes": b"\x00\x01payload", "string": "text"}[schema]
    if schema.get("logicalType") == "timestamp-millis":
        return datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    kind = schema["type"]
    if kind == "record":
        named[schema["name"]] = schema
        return {f["name"]: filled(f["type"], named) for f in schema["fields"]}
    if kind == "enum":
        named[schema["name"]] = schema
        return schema["symbols"][0]
    if kind == "array":
        return [filled(schema["items"], named)]
    if kind == "map":
        return {"key": filled(schema["values"], named)}
    return filled(kind, named)


def filled_event(cls: type[Event]) -> Event:
    return cls.model_validate(filled(_REGISTRY.current(cls.__avro_name__).parsed))
