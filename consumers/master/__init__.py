"""The master role (``joynexus run master``): validates and plans jobs (``plan.py``,
no Kafka) and runs their lifecycle (``role.py``)."""

from infra.lazy import lazy_getattr

__all__ = ["Master"]

__getattr__ = lazy_getattr(__name__, {"Master": "consumers.master.role"})
