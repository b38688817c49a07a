"""Bus plumbing the roles stand on: no role logic and no tensor math here.

``protocols`` the extension points (Handler, Transform, RecordContext, Output); ``loop``
at least once with a DLQ; ``transform`` exactly-once consume-transform-produce; ``dlq`` dead
letters; ``replay`` group-less reading of a window; ``episodes`` rollouts into whole episodes.

Names are imported lazily, so importing one module does not import the others.
"""

from infra.lazy import lazy_getattr

_EXPORTS = {
    "Handler": "consumers.bus.protocols", "Output": "consumers.bus.protocols",
    "RecordContext": "consumers.bus.protocols", "Transform": "consumers.bus.protocols",
    "ConsumeLoop": "consumers.bus.loop", "StartAt": "consumers.bus.loop",
    "ReplayedRecord": "consumers.bus.replay", "replay": "consumers.bus.replay",
    "TransformWorker": "consumers.bus.transform",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
