"""Who may do what on a secure broker: the ACLs of a tenant and of the service principal.

The standard authorizer denies whatever no ALLOW rule grants (``allow.everyone.if.no.acl.found``
is false), so these lists are the whole of each principal's rights:

* a tenant: WRITE + DESCRIBE on its jobs topic ``<prefix>.t.<tenant>.jobs`` (literal), READ +
  DESCRIBE on every topic starting ``<prefix>.t.<tenant>.`` (prefixed), READ on consumer groups
  starting ``<prefix>.t.<tenant>.`` (prefixed). Not another tenant's topics, not the shared
  ``<prefix>.<stream>`` topics, not the service's groups, no transactional ids.
* the service principal (every role): ALL on topics starting ``<prefix>.``, on every consumer
  group and transactional id; IDEMPOTENT_WRITE, CREATE, DESCRIBE and DESCRIBE_CONFIGS on the
  cluster (idempotent producers, topic provisioning).

Super users (the broker's admin: inter-broker, controller, provisioning) need no ACLs.
"""

from __future__ import annotations

from infra.connection import principal
from infra.security_admin import AclBinding, Op, Pattern, Resource
from infra.settings import Settings
from infra.topics import tenant_prefix, tenant_topic

__all__ = ["CLUSTER", "service_acls", "tenant_acls"]

CLUSTER = "kafka-cluster"  # the one name of Kafka's CLUSTER resource


def tenant_acls(settings: Settings, tenant: str) -> list[AclBinding]:
    who, prefix = principal(tenant), tenant_prefix(settings, tenant)
    jobs = tenant_topic(settings, tenant, "jobs")
    return [
        AclBinding(who, Resource.TOPIC, jobs, Pattern.LITERAL, Op.WRITE),
        AclBinding(who, Resource.TOPIC, jobs, Pattern.LITERAL, Op.DESCRIBE),
        AclBinding(who, Resource.TOPIC, prefix, Pattern.PREFIXED, Op.READ),
        AclBinding(who, Resource.TOPIC, prefix, Pattern.PREFIXED, Op.DESCRIBE),
        AclBinding(who, Resource.GROUP, prefix, Pattern.PREFIXED, Op.READ),
    ]


def service_acls(settings: Settings) -> list[AclBinding]:
    who = principal(settings.service_username)
    return [
        AclBinding(who, Resource.TOPIC, f"{settings.topic_prefix}.", Pattern.PREFIXED, Op.ALL),
        AclBinding(who, Resource.GROUP, "*", Pattern.LITERAL, Op.ALL),
        AclBinding(who, Resource.TRANSACTIONAL_ID, "*", Pattern.LITERAL, Op.ALL),
        *(AclBinding(who, Resource.CLUSTER, CLUSTER, Pattern.LITERAL, op)
          for op in (Op.IDEMPOTENT_WRITE, Op.CREATE, Op.DESCRIBE, Op.DESCRIBE_CONFIGS)),
    ]
