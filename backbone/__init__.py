"""The shared, frozen vision-language backbone, VLAFeature and the group batcher (pure compute, no Kafka).

Names are imported lazily: ``import backbone.feature`` (what tenant code needs)
must not pay for importing transformers.
"""

from infra.lazy import lazy_getattr

_EXPORTS = {
    "PRESETS": "backbone.presets", "Preset": "backbone.presets",
    "Backbone": "backbone.model", "BackboneSpec": "backbone.model",
    "BatcherConfig": "backbone.batcher", "GroupBatcher": "backbone.batcher",
    "GroupRecord": "backbone.batcher",
    "BucketKey": "backbone.inputs", "InvalidRequest": "backbone.inputs", "VLARequest": "backbone.inputs",
    "VLAFeature": "backbone.feature",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr("backbone", _EXPORTS)
