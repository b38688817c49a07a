"""Checks that the Python event classes say what the ``.avsc`` files say.

``drift(cls, version)`` lists every difference between a record class and its
schema: field names and order, types, optionality, defaults, enum symbols. The
test suite asserts it is empty for every type, so the two cannot drift apart.
"""

from __future__ import annotations

import types
import typing
from datetime import datetime
from typing import Any, get_args, get_origin

from schemas.events import ENUM_TYPES, RECORD_TYPES, AvroRecord
from schemas.registry import SchemaRegistry

__all__ = ["all_drift", "drift"]

_PRIMITIVES: dict[str, Any] = {
    "string": str, "long": int, "int": int, "double": float, "float": float,
    "boolean": bool, "bytes": bytes,
}


def _strip(annotation: Any) -> Any:
    """Drop Annotated metadata and normalise ``X | None`` to a sorted tuple of members."""
    if get_origin(annotation) is typing.Annotated:
        return _strip(get_args(annotation)[0])
    if get_origin(annotation) in (typing.Union, types.UnionType):
        return ("union", *sorted((_strip(a) for a in get_args(annotation)), key=repr))
    if get_origin(annotation) in (tuple, dict):
        return (get_origin(annotation), *(_strip(a) for a in get_args(annotation)))
    return annotation


def _expected(avro: Any, problems: list[str], where: str) -> Any:
    """The (stripped) Python annotation an Avro type should map to."""
    if isinstance(avro, list):
        return ("union", *sorted((_expected(b, problems, where) for b in avro), key=repr))
    if isinstance(avro, str):
        if avro == "null":
            return type(None)
        return _PRIMITIVES.get(avro) or RECORD_TYPES.get(avro) or ENUM_TYPES.get(avro) or avro
    if avro.get("logicalType") == "timestamp-millis":
        return datetime
    kind = avro["type"]
    if kind == "array":
        return (tuple, _expected(avro["items"], problems, where), Ellipsis)
    if kind == "map":
        return (dict, str, _expected(avro["values"], problems, where))
    if kind == "enum":
        cls = ENUM_TYPES.get(avro["name"])
        if cls is None:
            problems.append(f"{where}: enum {avro['name']} has no Python class")
            return avro["name"]
        if [m.value for m in cls] != avro["symbols"]:
            problems.append(f"{where}: {cls.__name__} symbols {[m.value for m in cls]} "
                            f"!= schema {avro['symbols']}")
        return cls
    if kind == "record":
        return RECORD_TYPES.get(avro["name"], avro["name"])
    return _expected(kind, problems, where)


def drift(cls: type[AvroRecord], schema: dict) -> list[str]:
    """Differences between a record class and its parsed schema (empty when in step)."""
    problems: list[str] = []
    hints = typing.get_type_hints(cls, include_extras=True)
    py_fields = list(cls.model_fields)
    avro_fields = [f["name"] for f in schema["fields"]]
    if py_fields != avro_fields:
        problems.append(f"{cls.__name__}: fields {py_fields} != schema {avro_fields}")
    for field in schema["fields"]:
        name = field["name"]
        if name not in cls.model_fields:
            continue
        where = f"{cls.__name__}.{name}"
        want = _expected(field["type"], problems, where)
        got = _strip(hints[name])
        if got != want:
            problems.append(f"{where}: annotation {got!r} != schema type {want!r}")
        info = cls.model_fields[name]
        default = None if info.is_required() else info.get_default(call_default_factory=True)
        if isinstance(default, tuple):  # arrays are tuples in the classes, lists in JSON
            default = list(default)
        if "default" in field and not info.is_required() and default != field["default"]:
            problems.append(f"{where}: default {default!r} != schema {field['default']!r}")
        if "default" in field and field["default"] is not None and info.is_required():
            problems.append(f"{where}: schema has a default but the class requires a value")
        if field.get("default", "<none>") is None and info.is_required():
            problems.append(f"{where}: schema defaults to null but the class requires a value")
    return problems


def all_drift(registry: SchemaRegistry | None = None) -> list[str]:
    """Drift of every record and enum type against the current schemas."""
    registry = registry or SchemaRegistry()
    problems: list[str] = []
    for name in registry.names():
        schema = registry.current(name).parsed
        if schema["type"] == "enum":
            _expected(schema, problems, name)
        elif name in RECORD_TYPES:
            problems += drift(RECORD_TYPES[name], schema)
        else:
            problems.append(f"{name}: no Python class")
    for name in RECORD_TYPES.keys() - set(registry.names()):
        problems.append(f"{name}: Python class without a schema")
    return problems
