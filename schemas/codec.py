"""Events to bytes and back: the only place in joynexus that reads or writes Avro.

Two framings, chosen by whether a schema-registry URL is configured:

* single-object encoding (default, Avro spec): ``C3 01`` + 8-byte CRC-64-AVRO
  fingerprint of the writer schema (little-endian) + Avro binary body. The
  ``.avsc`` files of this package are the registry.
* Confluent framing: ``00`` + 4-byte big-endian registry id + body, with ids
  from a Confluent-compatible schema registry (``schemas.confluent``).

``decode`` reads either framing whatever the configured one, resolves the
writer schema (current or historical) and projects the record onto the
current schema, so records written before a schema change still decode.
"""

from __future__ import annotations

import functools
import io
import struct
from typing import Any, Protocol

from fastavro import schemaless_reader, schemaless_writer
from pydantic import ValidationError

from infra.errors import DecodeError, EncodeError, SchemaError, UnknownSchema
from schemas.confluent import ConfluentRegistry
from schemas.events import EVENT_TYPES, Event
from schemas.registry import SchemaRegistry, SchemaVersion

__all__ = ["CONFLUENT_MAGIC", "SINGLE_OBJECT_MAGIC", "Codec", "IdRegistry"]

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = b"\x00"


class IdRegistry(Protocol):
    """A registry that numbers schemas (Confluent's REST API or a stand-in)."""

    def id_for(self, version: SchemaVersion) -> int: ...

    def schema_for(self, schema_id: int) -> dict: ...


class Codec:
    """Encodes ``Event`` instances and decodes bytes back into them."""

    def __init__(self, registry: SchemaRegistry | None = None, ids: IdRegistry | None = None):
        self.registry = registry or SchemaRegistry()
        self.ids = ids
        self._by_id: dict[int, SchemaVersion] = {}

    @classmethod
    def for_settings(cls, settings: Any) -> Codec:
        """The codec a process puts on the wire: Confluent framing when ``schema_registry_url`` is
        set (one registry client per URL and process, so its id cache is shared), else single-object."""
        url = settings.schema_registry_url
        return cls(ids=_confluent(url)) if url else cls()

    def encode(self, event: Event) -> bytes:
        version = self.registry.current(type(event).__avro_name__)
        buf = io.BytesIO()
        if self.ids:
            buf.write(CONFLUENT_MAGIC + struct.pack(">I", self.ids.id_for(version)))
        else:
            buf.write(SINGLE_OBJECT_MAGIC + version.fingerprint)
        try:
            schemaless_writer(buf, version.parsed, event.model_dump(), strict_allow_default=True)
        except (ValueError, TypeError, KeyError) as exc:
            raise EncodeError(f"{version.fullname}: {exc}") from exc
        return buf.getvalue()

    def decode(self, data: bytes | None) -> Event:
        writer = self._writer_of(data)
        reader = self.registry.current(writer.fullname)
        header = 10 if data[:2] == SINGLE_OBJECT_MAGIC else 5
        body = io.BytesIO(memoryview(data)[header:])
        try:
            record: dict[str, Any] = schemaless_reader(body, writer.parsed, reader.parsed)
        except Exception as exc:  # truncated or garbled bodies raise many types
            raise DecodeError(f"{writer.fullname}: corrupt body: {exc!r}") from exc
        if body.tell() != len(data) - header:
            raise DecodeError(f"{writer.fullname}: {len(data) - header - body.tell()} trailing bytes")
        cls = EVENT_TYPES.get(reader.fullname)
        if cls is None:
            raise DecodeError(f"{reader.fullname} is not a top-level event")
        try:
            return cls.model_validate(record)
        except ValidationError as exc:
            raise DecodeError(f"{reader.fullname}: {exc}") from exc

    def _writer_of(self, data: bytes | None) -> SchemaVersion:
        if not data:
            raise DecodeError("empty record value")
        if data[:2] == SINGLE_OBJECT_MAGIC:
            if len(data) < 10:
                raise DecodeError("single-object header truncated")
            return self.registry.by_fingerprint(bytes(data[2:10]))
        if data[:1] == CONFLUENT_MAGIC:
            if len(data) < 5:
                raise DecodeError("Confluent header truncated")
            return self._version_for_id(struct.unpack(">I", data[1:5])[0])
        raise DecodeError(f"unknown framing: first bytes {bytes(data[:2]).hex()}")

    def _version_for_id(self, schema_id: int) -> SchemaVersion:
        if schema_id not in self._by_id:
            if not self.ids:
                raise UnknownSchema(
                    f"Confluent-framed record (schema id {schema_id}) but no registry configured"
                )
            try:
                schema = self.ids.schema_for(schema_id)
            except SchemaError:
                raise
            except Exception as exc:
                raise UnknownSchema(f"schema id {schema_id}: registry lookup failed: {exc}") from exc
            self._by_id[schema_id] = self.registry.add_writer_schema(schema)
        return self._by_id[schema_id]


@functools.cache
def _confluent(url: str) -> ConfluentRegistry:
    return ConfluentRegistry(url)
