"""Consumer-group services ("roles") and the loops they share: at-least-once with a DLQ,
exactly-once consume-transform-produce, and group-less replay."""

from consumers.abc import Handler, Output, RecordContext, Transform
from consumers.loop import ConsumeLoop, StartAt
from consumers.replay import ReplayedRecord, replay
from consumers.transform import TransformWorker

__all__ = [
    "ConsumeLoop",
    "Handler",
    "Output",
    "RecordContext",
    "ReplayedRecord",
    "StartAt",
    "Transform",
    "TransformWorker",
    "replay",
]
