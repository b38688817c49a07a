"""The shared, frozen vision-language backbone, VLAFeature and the group batcher (pure compute, no Kafka)."""
