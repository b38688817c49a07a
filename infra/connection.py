"""How every Kafka client of joynexus connects: the one place that turns settings into options.

``client_options(settings)`` gives the keyword arguments every aiokafka client takes
(``AIOKafkaProducer``, ``AIOKafkaConsumer``, ``AIOKafkaAdminClient``): the bootstrap address
and, on a secure broker, SASL over plaintext TCP with the configured SCRAM mechanism and the
process's own principal; ``admin_settings`` switches to the broker's super user (tenant
provisioning, the secure broker's readiness check). The producer wrapper, the consume loop, the
topic follower, the topic admin, replay, the dataset feeder and the broker check all build their
clients from here, so switching a deployment to SASL is a matter of settings.

Passwords live in ``SecretStr`` and are unwrapped only into these options, never logged.
"""

from __future__ import annotations

from typing import Any

from infra.errors import ConfigError
from infra.settings import Settings

__all__ = ["admin_settings", "client_options", "principal"]


def client_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for any aiokafka client: bootstrap servers + security."""
    options: dict[str, Any] = {"bootstrap_servers": settings.bootstrap}
    if settings.secure:
        options.update(security_protocol=settings.security_protocol,
                       sasl_mechanism=settings.sasl_mechanism,
                       sasl_plain_username=settings.sasl_username,
                       sasl_plain_password=settings.sasl_password.get_secret_value())
    return options


def admin_settings(settings: Settings) -> Settings:
    """The same settings, authenticating as the broker's super user (tenant provisioning, the
    secure broker's own checks)."""
    if settings.admin_password is None:
        raise ConfigError("this needs the broker's super user: set JOYNEXUS_ADMIN_PASSWORD "
                          "(`joynexus broker up --secure` writes it to <home>/kafka/secure.env)")
    return settings.model_copy(update={
        "security_protocol": "SASL_PLAINTEXT", "sasl_username": settings.admin_username,
        "sasl_password": settings.admin_password})


def principal(user: str) -> str:
    """Kafka's principal string of a SCRAM user (what ACLs name)."""
    return f"User:{user}"
