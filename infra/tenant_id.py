"""The tenant id rule, in one place, importable by compute code (no Kafka here).

Tenant ids are lowercase letters, digits and inner hyphens, 1-48 characters (a
DNS label, shorter): no ``.`` (it separates topic-name parts and Kafka ACL
prefixes) and no ``_`` (Kafka's metric names confuse ``.`` and ``_``).
"""

from __future__ import annotations

import re

from infra.errors import InvalidTenantId

__all__ = ["validate_tenant_id"]

_TENANT_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,46}[a-z0-9])?$")


def validate_tenant_id(tenant: str) -> str:
    if not isinstance(tenant, str) or not _TENANT_RE.match(tenant):
        raise InvalidTenantId(
            f"invalid tenant id {tenant!r}: use 1-48 lowercase letters, digits or inner "
            "hyphens (no '.', '_', spaces or upper case; must start and end alphanumeric)"
        )
    return tenant
