"""Avro event schemas (``*.avsc``, namespace ``joynexus.v1``), their Python types and the codec."""

from schemas.codec import Codec
from schemas.events import *  # noqa: F403
from schemas.events import __all__ as _events_all
from schemas.registry import SchemaRegistry
from schemas.tensors import from_numpy, to_numpy

__all__ = ["Codec", "SchemaRegistry", "from_numpy", "to_numpy", *_events_all]
