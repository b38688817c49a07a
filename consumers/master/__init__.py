"""The master role (``joynexus run master``): validates and compiles jobs (``compile.py``,
no Kafka) and runs their lifecycle (``role.py``)."""

from infra.lazy import lazy_getattr

__all__ = ["Master"]

__getattr__ = lazy_getattr(__name__, {"Master": "consumers.master.role"})
