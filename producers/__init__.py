"""Everything that publishes events: the producer wrapper, the dataset feeder and, later,
the tenant SDK and the policy publisher.

Names are imported lazily, so ``producers.dataset`` (reading/writing datasets) does not
pull in aiokafka.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {"EventProducer": "producers.producer"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'producers' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
