"""Client for a Confluent-compatible schema registry (Confluent, Karapace, Apicurio's
ccompat API), used only when ``JOYNEXUS_SCHEMA_REGISTRY_URL`` is set.

Subjects follow the RecordNameStrategy (subject = the record's full name), not
the topic-name default: joynexus has one topic per tenant and stream, and the
same event type on every tenant's topic is one subject. ``transport`` lets
tests swap in an ``httpx.MockTransport`` for the registry, which is an
external service the project does not run.
"""

from __future__ import annotations

import json

import httpx

from infra.errors import SchemaError, UnknownSchema
from schemas.registry import SchemaVersion

__all__ = ["ConfluentRegistry"]

_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class ConfluentRegistry:
    """Registers writer schemas and fetches schemas by id, caching both."""

    def __init__(self, url: str, transport: httpx.BaseTransport | None = None, timeout: float = 10):
        self._http = httpx.Client(
            base_url=url.rstrip("/"), transport=transport, timeout=timeout,
            headers={"Content-Type": _CONTENT_TYPE, "Accept": _CONTENT_TYPE},
        )
        self._ids: dict[bytes, int] = {}
        self._schemas: dict[int, dict] = {}

    def id_for(self, version: SchemaVersion) -> int:
        if version.fingerprint not in self._ids:
            response = self._http.post(
                f"/subjects/{version.fullname}/versions", json={"schema": version.canonical}
            )
            if response.status_code >= 400:
                raise SchemaError(
                    f"registry refused {version.fullname}: {response.status_code} {response.text}"
                )
            self._ids[version.fingerprint] = int(response.json()["id"])
        return self._ids[version.fingerprint]

    def schema_for(self, schema_id: int) -> dict:
        if schema_id not in self._schemas:
            response = self._http.get(f"/schemas/ids/{schema_id}")
            if response.status_code == 404:
                raise UnknownSchema(f"registry has no schema with id {schema_id}")
            if response.status_code >= 400:
                raise SchemaError(f"registry lookup of id {schema_id}: {response.status_code}")
            self._schemas[schema_id] = json.loads(response.json()["schema"])
        return self._schemas[schema_id]

    def close(self) -> None:
        self._http.close()
