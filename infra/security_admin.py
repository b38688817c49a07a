"""Kafka's security admin requests that aiokafka's admin client lacks: SCRAM users, quotas, ACLs.

``SecurityAdmin`` speaks the Kafka protocol directly through aiokafka's connection (so it
authenticates and negotiates versions like every other client) with these requests:

* AlterUserScramCredentials v0 / DescribeUserScramCredentials v0 (KIP-554): the client
  salts and hashes the password itself (PBKDF2-HMAC, 4096 iterations, as Kafka's
  ``ScramFormatter``), so the cleartext never leaves this process, not even to the broker;
* AlterClientQuotas v0 / DescribeClientQuotas v0 (KIP-546): per-user byte-rate quotas;
* CreateAcls v1 / DeleteAcls v1 / DescribeAcls v1 in batches (aiokafka's own request
  builders take one binding per request).

Why not ``kafka-configs.sh``/``kafka-acls.sh`` through java: a JVM start per call (seconds),
a password on a command line (visible in ``/proc``), and a dependency on the broker's jars on
every machine that provisions tenants. The requests are small, versioned and stable since
Kafka 2.7; an error code in any answer raises ``SecurityAdminError`` naming the item.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import for_code
from aiokafka.protocol.admin import (
    CreateAclsRequest_v1,
    DeleteAclsRequest_v1,
    DescribeAclsRequest_v1,
)
from aiokafka.protocol.api import RequestStruct, Response
from aiokafka.protocol.types import (
    Array,
    Boolean,
    CompactArray,
    CompactBytes,
    CompactString,
    Float64,
    Int8,
    Int16,
    Int32,
    Schema,
    String,
    TaggedFields,
)

from infra.connection import client_options
from infra.errors import JoynexusError
from infra.settings import Settings

__all__ = [
    "AclBinding",
    "Op",
    "Pattern",
    "Resource",
    "SecurityAdmin",
    "SecurityAdminError",
]

SCRAM_ITERATIONS = 4096
_MECHANISM = {"SCRAM-SHA-256": (1, "sha256"), "SCRAM-SHA-512": (2, "sha512")}


class SecurityAdminError(JoynexusError):
    """The broker refused a security admin request (names the item and Kafka's error)."""


class Resource(IntEnum):
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    USER = 7


class Pattern(IntEnum):
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Op(IntEnum):
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


ALLOW = 3
ANY_PERMISSION = 1


@dataclass(frozen=True, order=True)
class AclBinding:
    """One ALLOW rule: ``principal`` may ``op`` on ``resource`` ``name`` (literal or prefix)."""

    principal: str
    resource: Resource
    name: str
    pattern: Pattern
    op: Op
    host: str = "*"

    def __str__(self) -> str:
        return (f"{self.principal} {self.op.name} {self.resource.name}:{self.pattern.name}:"
                f"{self.name}")


# --------------------------------------------------------------------------- wire structures
class _AlterScramResponse(Response):
    API_KEY = 51
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("results", CompactArray(("user", CompactString("utf-8")), ("error_code", Int16),
                                 ("error_message", CompactString("utf-8")), ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


class _AlterScramRequest(RequestStruct):
    FLEXIBLE_VERSION = True
    API_KEY = 51
    API_VERSION = 0
    RESPONSE_TYPE = _AlterScramResponse
    SCHEMA = Schema(
        ("deletions", CompactArray(("name", CompactString("utf-8")), ("mechanism", Int8),
                                   ("tags", TaggedFields))),
        ("upsertions", CompactArray(("name", CompactString("utf-8")), ("mechanism", Int8),
                                    ("iterations", Int32), ("salt", CompactBytes),
                                    ("salted_password", CompactBytes), ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


class _DescribeScramResponse(Response):
    API_KEY = 50
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("error_message", CompactString("utf-8")),
        ("results", CompactArray(
            ("user", CompactString("utf-8")), ("error_code", Int16),
            ("error_message", CompactString("utf-8")),
            ("credential_infos", CompactArray(("mechanism", Int8), ("iterations", Int32),
                                              ("tags", TaggedFields))),
            ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


class _DescribeScramRequest(RequestStruct):
    FLEXIBLE_VERSION = True
    API_KEY = 50
    API_VERSION = 0
    RESPONSE_TYPE = _DescribeScramResponse
    SCHEMA = Schema(
        ("users", CompactArray(("name", CompactString("utf-8")), ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


_ENTITY = Array(("entity_type", String("utf-8")), ("entity_name", String("utf-8")))


class _AlterQuotasResponse(Response):
    API_KEY = 49
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("entries", Array(("error_code", Int16), ("error_message", String("utf-8")),
                          ("entity", _ENTITY))),
    )


class _AlterQuotasRequest(RequestStruct):
    API_KEY = 49
    API_VERSION = 0
    RESPONSE_TYPE = _AlterQuotasResponse
    SCHEMA = Schema(
        ("entries", Array(("entity", _ENTITY),
                          ("ops", Array(("key", String("utf-8")), ("value", Float64),
                                        ("remove", Boolean))))),
        ("validate_only", Boolean),
    )


class _DescribeQuotasResponse(Response):
    API_KEY = 48
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("error_message", String("utf-8")),
        ("entries", Array(("entity", _ENTITY),
                          ("values", Array(("key", String("utf-8")), ("value", Float64))))),
    )


class _DescribeQuotasRequest(RequestStruct):
    API_KEY = 48
    API_VERSION = 0
    RESPONSE_TYPE = _DescribeQuotasResponse
    SCHEMA = Schema(
        ("components", Array(("entity_type", String("utf-8")), ("match_type", Int8),
                             ("match", String("utf-8")))),
        ("strict", Boolean),
    )


class _Fixed:
    """A request of exactly one version, built from ready arguments. aiokafka's connection only
    calls ``prepare(versions)`` on what it sends (duck-typed like its ``Request`` builders)."""

    STRUCT: ClassVar[type[RequestStruct]]

    def __init__(self, *args: Any):
        self._args = args

    def prepare(self, versions: dict[int, tuple[int, int]]) -> RequestStruct:
        low, high = versions.get(self.STRUCT.API_KEY, (0, -1))
        if not low <= self.STRUCT.API_VERSION <= high:
            raise SecurityAdminError(
                f"the broker does not support {self.STRUCT.__name__.strip('_')} "
                f"v{self.STRUCT.API_VERSION} (supports {low}..{high}); Kafka >= 2.7 is needed")
        return self.STRUCT(*self._args)


def _fixed(struct: type[RequestStruct]) -> type[_Fixed]:
    return type(f"{struct.__name__.strip('_')}Builder", (_Fixed,), {"STRUCT": struct})


_AlterScram = _fixed(_AlterScramRequest)
_DescribeScram = _fixed(_DescribeScramRequest)
_AlterQuotas = _fixed(_AlterQuotasRequest)
_DescribeQuotas = _fixed(_DescribeQuotasRequest)
_CreateAcls = _fixed(CreateAclsRequest_v1)
_DeleteAcls = _fixed(DeleteAclsRequest_v1)
_DescribeAcls = _fixed(DescribeAclsRequest_v1)


def _check(code: int, message: str | None, what: str) -> None:
    if code:
        raise SecurityAdminError(f"{what}: {for_code(code).__name__}"
                                 + (f": {message}" if message else ""))


def salted_password(password: str, salt: bytes, mechanism: str, iterations: int) -> bytes:
    """SCRAM's SaltedPassword = Hi(password, salt, i), i.e. PBKDF2-HMAC (RFC 5802), as Kafka."""
    _, digest = _MECHANISM[mechanism]
    return hashlib.pbkdf2_hmac(digest, password.encode(), salt, iterations)


# ------------------------------------------------------------------------------- the client
class SecurityAdmin:
    """Async context manager; the settings must authenticate as a user allowed to ALTER the
    cluster (the broker's super user: ``infra.connection.admin_settings``)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._admin = AIOKafkaAdminClient(**client_options(settings),
                                          client_id=f"{settings.client_id}-security",
                                          request_timeout_ms=settings.request_timeout_ms)

    async def __aenter__(self) -> SecurityAdmin:
        await self._admin.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._admin.close()

    async def _send(self, request: _Fixed) -> Any:
        # Every broker forwards these admin requests to the KRaft controller.
        return await self._admin._send_request(request)  # noqa: SLF001 - aiokafka's one send path

    # --- SCRAM users
    async def upsert_user(self, user: str, password: str) -> None:
        """Create the user or replace its password (for the configured SCRAM mechanism)."""
        mech_id, _ = _MECHANISM[self.settings.sasl_mechanism]
        salt = secrets.token_bytes(32)
        hashed = salted_password(password, salt, self.settings.sasl_mechanism, SCRAM_ITERATIONS)
        response = await self._send(_AlterScram(
            [], [(user, mech_id, SCRAM_ITERATIONS, salt, hashed, {})], {}))
        for name, code, message, _ in response.results:
            _check(code, message, f"setting SCRAM credentials of {name!r}")

    async def delete_user(self, user: str) -> bool:
        """Remove the user's SCRAM credentials of every mechanism; False if it had none."""
        users = await self.users([user])
        mechanisms = users.get(user, [])
        if not mechanisms:
            return False
        response = await self._send(_AlterScram([(user, m, {}) for m in mechanisms], [], {}))
        for name, code, message, _ in response.results:
            _check(code, message, f"deleting SCRAM credentials of {name!r}")
        return True

    async def users(self, names: list[str] | None = None) -> dict[str, list[int]]:
        """SCRAM users (all, or those named that exist) -> their mechanism ids."""
        response = await self._send(_DescribeScram(
            None if names is None else [(n, {}) for n in names], {}))
        _check(response.error_code, response.error_message, "describing SCRAM users")
        out: dict[str, list[int]] = {}
        for user, code, message, infos, _ in response.results:
            if code == 91:  # RESOURCE_NOT_FOUND: no such user
                continue
            _check(code, message, f"describing SCRAM user {user!r}")
            out[user] = [mech for mech, _iterations, _ in infos]
        return out

    # --- quotas
    async def set_user_quotas(self, user: str, quotas: dict[str, float | None]) -> None:
        """Set (or with None remove) quota keys such as producer_byte_rate for one user."""
        ops = [(key, 0.0 if value is None else float(value), value is None)
               for key, value in quotas.items()]
        response = await self._send(_AlterQuotas([([("user", user)], ops)], False))
        for code, message, _entity in response.entries:
            _check(code, message, f"setting quotas of user {user!r}")

    async def user_quotas(self, user: str) -> dict[str, float]:
        response = await self._send(_DescribeQuotas([("user", 0, user)], True))  # 0: exact match
        _check(response.error_code, response.error_message, f"describing quotas of {user!r}")
        return {key: value for _entity, values in (response.entries or []) for key, value in values}

    # --- ACLs
    async def create_acls(self, bindings: list[AclBinding]) -> None:
        if not bindings:
            return
        response = await self._send(_CreateAcls([
            (b.resource, b.name, b.pattern, b.principal, b.host, b.op, ALLOW) for b in bindings]))
        for binding, (code, message) in zip(bindings, response.creation_responses, strict=True):
            _check(code, message, f"creating ACL {binding}")

    async def acls(self, principal: str | None = None) -> list[AclBinding]:
        """Every ALLOW binding (of one principal, or everyone's)."""
        response = await self._send(_DescribeAcls(
            Resource.ANY, None, Pattern.ANY, principal, None, Op.ANY, ANY_PERMISSION))
        _check(response.error_code, response.error_message, "describing ACLs")
        return sorted(
            AclBinding(who, Resource(rtype), name, Pattern(ptype), Op(op), host)
            for rtype, name, ptype, entries in response.resources
            for who, host, op, permission in entries if permission == ALLOW)

    async def delete_acls(self, principal: str) -> int:
        """Delete every ACL that names ``principal``; returns how many went."""
        response = await self._send(_DeleteAcls(
            [(Resource.ANY, None, Pattern.ANY, principal, None, Op.ANY, ANY_PERMISSION)]))
        deleted = 0
        for code, message, matching in response.filter_responses:
            _check(code, message, f"deleting ACLs of {principal}")
            for acl in matching:
                _check(acl[0], acl[1], f"deleting an ACL of {principal}")
                deleted += 1
        return deleted
