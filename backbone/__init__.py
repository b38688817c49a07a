"""The shared, frozen vision-language backbone, VLAFeature and the group batcher (pure compute, no Kafka)."""

from backbone.batcher import BatcherConfig, GroupBatcher, GroupRecord
from backbone.feature import VLAFeature
from backbone.inputs import BucketKey, InvalidRequest, VLARequest
from backbone.model import Backbone, BackboneSpec
from backbone.presets import PRESETS, Preset

__all__ = [
    "PRESETS",
    "Backbone",
    "BackboneSpec",
    "BatcherConfig",
    "BucketKey",
    "GroupBatcher",
    "GroupRecord",
    "InvalidRequest",
    "Preset",
    "VLAFeature",
    "VLARequest",
]
