"""The local schema registry: the ``.avsc`` files of this folder, and the older
versions kept in ``history/``.

Current schemas are the reader schemas; every version (current or historical)
is a possible writer schema, found by its CRC-64-AVRO fingerprint, as Avro's
single-object encoding asks. To change a schema: copy the old file to
``history/<Name>.<fingerprint>.avsc`` (``joynexus schemas fingerprint`` prints
it), then edit the current one. Changes must stay BACKWARD_TRANSITIVE: new
fields need defaults, nothing is removed without a default; a test decodes
every historical version with the current one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastavro import parse_schema
from fastavro.schema import fingerprint, to_parsing_canonical_form

from infra.errors import SchemaError, UnknownSchema

__all__ = ["SCHEMA_DIR", "SchemaRegistry", "SchemaVersion"]

SCHEMA_DIR = Path(__file__).resolve().parent
HISTORY_DIR = SCHEMA_DIR / "history"


@dataclass(frozen=True)
class SchemaVersion:
    """One parsed schema version."""

    fullname: str
    parsed: Any  # fastavro's parsed (expanded) schema
    canonical: str  # Parsing Canonical Form
    fingerprint: bytes  # 8 bytes, little-endian, as single-object encoding writes it
    source: Path


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{path}: not valid JSON: {exc}") from exc


PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def _fullname(name: str, namespace: str | None) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _expand(schema: Any, defs: dict[str, dict], seen: set[str], namespace: str | None) -> Any:
    """Inline named types at their first use, as Avro's canonical form wants.

    fastavro's own ``expand=True`` inlines a type at every use, which gives a
    schema that redefines names and so a wrong fingerprint.
    """
    if isinstance(schema, str):
        if schema in PRIMITIVES:
            return schema
        full = _fullname(schema, namespace)
        if full in seen:
            return full
        if full not in defs:
            raise SchemaError(f"unknown type {full!r}")
        return _expand(defs[full], defs, seen, namespace)
    if isinstance(schema, list):
        return [_expand(branch, defs, seen, namespace) for branch in schema]
    kind = schema.get("type")
    if kind in ("record", "error", "enum", "fixed"):
        ns = schema.get("namespace", namespace)
        full = _fullname(schema["name"], ns)
        seen.add(full)
        out = {**schema, "name": full}
        out.pop("namespace", None)
        if kind in ("record", "error"):
            out["fields"] = [
                {**f, "type": _expand(f["type"], defs, seen, ns)} for f in schema["fields"]
            ]
        return out
    if kind == "array":
        return {**schema, "items": _expand(schema["items"], defs, seen, namespace)}
    if kind == "map":
        return {**schema, "values": _expand(schema["values"], defs, seen, namespace)}
    if isinstance(kind, (dict, list)) or kind not in PRIMITIVES | {None}:
        return _expand(kind, defs, seen, namespace)
    return schema


def _version(path: Path, raw: dict, defs: dict[str, dict]) -> SchemaVersion:
    fullname = _fullname(raw["name"], raw.get("namespace"))
    expanded = _expand(raw, {**defs, fullname: raw}, set(), raw.get("namespace"))
    try:
        parsed = parse_schema(expanded)
    except Exception as exc:  # fastavro raises several unrelated types here
        raise SchemaError(f"{path}: invalid schema: {exc}") from exc
    canonical = to_parsing_canonical_form(parsed)
    fp = bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))
    return SchemaVersion(fullname, parsed, canonical, fp, path)


class SchemaRegistry:
    """Current schemas by full name, and every known version by fingerprint."""

    def __init__(self, schema_dir: Path = SCHEMA_DIR, history_dirs: tuple[Path, ...] = ()) -> None:
        files = sorted(schema_dir.glob("*.avsc"))
        if not files:
            raise SchemaError(f"no .avsc files in {schema_dir}")
        raw = {path: _read_json(path) for path in files}
        self._defs = {_fullname(s["name"], s.get("namespace")): s for s in raw.values()}
        self._current: dict[str, SchemaVersion] = {}
        self._by_fingerprint: dict[bytes, SchemaVersion] = {}
        for path, schema in raw.items():
            version = _version(path, schema, self._defs)
            self._current[version.fullname] = version
            self._by_fingerprint[version.fingerprint] = version
        for directory in (HISTORY_DIR, *history_dirs):
            for path in sorted(directory.glob("*.avsc")) if directory.is_dir() else ():
                self.add_writer_schema(_read_json(path), source=path)

    def add_writer_schema(self, schema: dict, source: Path | None = None) -> SchemaVersion:
        """Make an older version decodable. Named types it uses resolve to current ones."""
        version = _version(source or Path("<memory>"), schema, self._defs)
        if version.fullname not in self._current:
            raise SchemaError(f"{version.source}: no current schema named {version.fullname}")
        self._by_fingerprint.setdefault(version.fingerprint, version)
        return version

    def current(self, fullname: str) -> SchemaVersion:
        try:
            return self._current[fullname]
        except KeyError:
            raise UnknownSchema(f"no schema named {fullname!r}") from None

    def by_fingerprint(self, fp: bytes) -> SchemaVersion:
        try:
            return self._by_fingerprint[fp]
        except KeyError:
            raise UnknownSchema(f"no schema with fingerprint {fp.hex()}") from None

    def names(self) -> list[str]:
        return sorted(self._current)

    def versions(self) -> list[SchemaVersion]:
        return list(self._by_fingerprint.values())
