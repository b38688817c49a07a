"""Offline demonstration datasets for SFT (pure compute, no Kafka): the on-disk format
(``format``: writer, verifying reader, deterministic resumable batch layout with
action-chunk targets) and the generator that records scripted experts (``generate``).

The generator is imported lazily: reading a dataset must not pay for the simulators.
"""

from infra.lazy import lazy_getattr

_EXPORTS = {
    name: "producers.dataset.format"
    for name in ("ArrayStats", "BatchRef", "Dataset", "DatasetCorrupt", "DatasetError", "DatasetHeader",
                 "DatasetMeta", "DatasetWriter", "Episode", "Minibatch", "ShardInfo", "chunk_targets",
                 "iter_batches", "layout_batches", "FORMAT_VERSION", "META_FILE", "EPISODE_DIR")
} | {name: "producers.dataset.generate" for name in ("episode_seed", "generate_dataset", "record_episode")}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr("producers.dataset", _EXPORTS)
