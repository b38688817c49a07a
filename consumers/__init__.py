"""Consumer-group services ("roles") and the loops they share: at-least-once with a DLQ,
exactly-once consume-transform-produce, and group-less replay.

Names are imported lazily, so ``consumers.env.sim`` (pure compute) does not pull in aiokafka.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Handler": "consumers.abc", "Output": "consumers.abc", "RecordContext": "consumers.abc",
    "Transform": "consumers.abc",
    "ConsumeLoop": "consumers.loop", "StartAt": "consumers.loop",
    "ReplayedRecord": "consumers.replay", "replay": "consumers.replay",
    "TransformWorker": "consumers.transform",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'consumers' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
