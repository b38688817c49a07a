"""Consumer-group services ("roles") and the loops they share: at-least-once with a DLQ,
exactly-once consume-transform-produce, and group-less replay.

Names are imported lazily, so ``consumers.env.sim`` (pure compute) does not pull in aiokafka.
"""

from infra.lazy import lazy_getattr

_EXPORTS = {
    "Handler": "consumers.abc", "Output": "consumers.abc", "RecordContext": "consumers.abc",
    "Transform": "consumers.abc",
    "ConsumeLoop": "consumers.loop", "StartAt": "consumers.loop",
    "ReplayedRecord": "consumers.replay", "replay": "consumers.replay",
    "TransformWorker": "consumers.transform",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr("consumers", _EXPORTS)
