"""The on-disk format of offline demonstration datasets, its writer and reader, and the SFT batch layout.

Layout of a dataset directory (format version 1)::

    meta.json                 DatasetMeta as JSON, plus "checksum": sha256 of its own canonical content
    episodes/000000.npz       one episode per shard, numbered from 0
    episodes/000001.npz ...

A shard is a zip of ``.npy`` arrays (``numpy.load(path, allow_pickle=False)``
reads it; no pickle anywhere), with T = the episode's steps:

    actions     float32 [T, action_dim]   the action taken at each step (clipped to the bounds)
    proprio     float32 [T, proprio_dim]  observation before each action
    images      uint8 [T, cameras, H, W, 3]  (only when obs_mode has "rgb")
    state       float32 [T, state_dim]    (only when obs_mode has "state")
    rewards     float32 [T]               reward after each action
    success     bool [T]                  success flag after each action
    instruction str (0-d unicode)         the episode's instruction
    seed        int64 (0-d)               the seed that ``reset`` got: replaying the actions
                                          from it reproduces the episode
    terminated, truncated  bool (0-d)     how the episode ended

The observation after the last action is not stored (no target for it).
``meta.json`` lists every shard with its sha256, size, steps, seed, success
and instruction, and normalisation statistics (mean/std/min/max per
dimension, population std) of actions, proprio and state over all steps. An
episode counts as a success when any step reported success.

Writes are atomic: everything goes to a temp directory beside the target,
files are fsynced, and the directory appears by ``rename``. Shards are
byte-reproducible (fixed zip timestamps), so the same generator and seed give
the same sha256s. Reads verify size and sha256 of every shard they open and
name the file on any mismatch.

SFT batches: sample ``i`` is step ``i - offset[e]`` of episode ``e`` (episodes
in shard order). ``layout_batches`` shuffles the samples with a generator seeded
by ``(seed, epoch)`` only, so batch ``k`` of epoch ``e`` is the same whether an
epoch is computed fresh or after others: a feeder resumes exactly.
"""

from __future__ import annotations

import io
import os
import shutil
import threading
import uuid
import zipfile
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from infra.durable import checksummed_json, fsync_dir, read_bytes, sha256_hex, verified_json, write_synced
from infra.errors import ConfigError, JoynexusError

__all__ = [
    "EPISODE_DIR",
    "FORMAT_VERSION",
    "META_FILE",
    "ArrayStats",
    "BatchRef",
    "Dataset",
    "DatasetCorrupt",
    "DatasetError",
    "DatasetHeader",
    "DatasetMeta",
    "DatasetWriter",
    "Episode",
    "Minibatch",
    "ShardInfo",
    "chunk_targets",
    "iter_batches",
    "layout_batches",
]

FORMAT_VERSION = 1
META_FILE = "meta.json"
EPISODE_DIR = "episodes"
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed, so a shard's bytes depend only on its arrays


class DatasetError(JoynexusError):
    """A dataset cannot be written or read as asked (bad arguments, shapes that do not match...)."""


class DatasetCorrupt(DatasetError):
    """A dataset file is missing, truncated, fails its sha256 or does not parse; the message names it."""


@dataclass(frozen=True)
class ArrayStats:
    mean: list[float]
    std: list[float]
    min: list[float]
    max: list[float]


@dataclass(frozen=True)
class ShardInfo:
    file: str  # relative to the dataset directory
    sha256: str
    size_bytes: int
    steps: int
    seed: int
    success: bool
    instruction: str


@dataclass(frozen=True)
class DatasetHeader:
    """What is known before the first episode: the simulator's spec and who generates."""

    env_id: str
    obs_mode: str
    image_size: int | None
    cameras: int
    action_dim: int
    action_low: float
    action_high: float
    proprio_dim: int
    state_dim: int
    max_episode_steps: int
    generator: str
    seed: int
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DatasetMeta(DatasetHeader):
    format_version: int = FORMAT_VERSION
    episodes: int = 0
    steps: int = 0
    success_rate: float = 0.0
    stats: dict[str, ArrayStats] = field(default_factory=dict)  # actions, proprio, state
    shards: list[ShardInfo] = field(default_factory=list)

    @property
    def has_images(self) -> bool:
        return "rgb" in self.obs_mode

    @property
    def has_state(self) -> bool:
        return "state" in self.obs_mode

    def to_json(self) -> bytes:
        return checksummed_json(asdict(self))

    @classmethod
    def from_json(cls, data: bytes, path: Path) -> DatasetMeta:
        try:
            body = verified_json(data, path, DatasetCorrupt)
            if body.get("format_version") != FORMAT_VERSION:
                raise DatasetCorrupt(f"{path}: unsupported format version {body.get('format_version')!r}")
            body["stats"] = {k: ArrayStats(**v) for k, v in body["stats"].items()}
            body["shards"] = [ShardInfo(**s) for s in body["shards"]]
            return cls(**body)
        except DatasetCorrupt:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise DatasetCorrupt(f"{path}: not a valid dataset metadata file ({exc})") from exc


@dataclass(frozen=True)
class Episode:
    instruction: str
    seed: int
    actions: np.ndarray  # float32 [T, A]
    proprio: np.ndarray  # float32 [T, P]
    rewards: np.ndarray  # float32 [T]
    success: np.ndarray  # bool [T]
    images: np.ndarray | None = None  # uint8 [T, C, H, W, 3]
    state: np.ndarray | None = None  # float32 [T, S]
    terminated: bool = False
    truncated: bool = False

    @property
    def steps(self) -> int:
        return len(self.actions)

    @property
    def succeeded(self) -> bool:
        return bool(self.success.any())

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"actions": self.actions, "proprio": self.proprio, "rewards": self.rewards,
               "success": self.success, "instruction": np.array(self.instruction),
               "seed": np.array(self.seed, dtype=np.int64), "terminated": np.array(self.terminated),
               "truncated": np.array(self.truncated)}
        if self.images is not None:
            out["images"] = self.images
        if self.state is not None:
            out["state"] = self.state
        return out


def _npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """A deflated ``.npz`` whose bytes depend only on the arrays (``numpy.savez`` stamps the time)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(info, "w", force_zip64=True) as out:
                np.lib.format.write_array(out, np.asarray(arrays[name], order="C"), allow_pickle=False)
    return buf.getvalue()


def _expected_shapes(meta: DatasetHeader, steps: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = {
        "actions": ((steps, meta.action_dim), np.dtype(np.float32)),
        "proprio": ((steps, meta.proprio_dim), np.dtype(np.float32)),
        "rewards": ((steps,), np.dtype(np.float32)),
        "success": ((steps,), np.dtype(bool)),
    }
    if "rgb" in meta.obs_mode:
        size = meta.image_size or 0
        shapes["images"] = ((steps, meta.cameras, size, size, 3), np.dtype(np.uint8))
    if "state" in meta.obs_mode:
        shapes["state"] = ((steps, meta.state_dim), np.dtype(np.float32))
    return shapes


def _shape_problems(meta: DatasetHeader, episode: Episode) -> list[str]:
    arrays = episode.arrays()
    problems = [f"{name} is missing" for name in _expected_shapes(meta, episode.steps) if name not in arrays]
    for name, (shape, dtype) in _expected_shapes(meta, episode.steps).items():
        arr = arrays.get(name)
        if arr is not None and (arr.shape != shape or arr.dtype != dtype):
            problems.append(f"{name} is {arr.dtype}{list(arr.shape)}, expected {dtype}{list(shape)}")
    extra = {"images", "state"} & set(arrays) - set(_expected_shapes(meta, episode.steps))
    problems += [f"{name} present but obs_mode is {meta.obs_mode!r}" for name in sorted(extra)]
    if episode.steps == 0:
        problems.append("episode has no steps")
    return problems


class _Moments:
    """Per-dimension count/mean/M2/min/max, merged episode by episode (Chan et al.), in float64."""

    def __init__(self) -> None:
        self.count, self.mean, self.m2 = 0, None, None
        self.min, self.max = None, None

    def add(self, x: np.ndarray) -> None:
        x = x.astype(np.float64).reshape(len(x), -1)
        n, mean = len(x), x.mean(axis=0)
        m2 = ((x - mean) ** 2).sum(axis=0)
        if self.count == 0:
            self.count, self.mean, self.m2 = n, mean, m2
            self.min, self.max = x.min(axis=0), x.max(axis=0)
            return
        total = self.count + n
        delta = mean - self.mean
        self.mean = self.mean + delta * n / total
        self.m2 = self.m2 + m2 + delta**2 * self.count * n / total
        self.count = total
        self.min, self.max = np.minimum(self.min, x.min(axis=0)), np.maximum(self.max, x.max(axis=0))

    def stats(self) -> ArrayStats:
        std = np.sqrt(self.m2 / self.count)
        return ArrayStats(*(v.astype(float).tolist() for v in (self.mean, std, self.min, self.max)))


class DatasetWriter:
    """Writes episodes into a temp directory; ``close()`` adds meta.json and renames it into place.

    Used as a context manager, it closes on success and removes the temp
    directory on an exception, leaving any earlier dataset at ``out_dir`` as it was.
    """

    def __init__(self, out_dir: str | os.PathLike[str], header: DatasetHeader, *, overwrite: bool = False):
        self.out_dir, self.header, self.overwrite = Path(out_dir), header, overwrite
        if self.out_dir.exists() and not overwrite:
            raise DatasetError(f"{self.out_dir} already exists (pass overwrite=True to replace it)")
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.out_dir.parent / f".{self.out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
        (self.tmp / EPISODE_DIR).mkdir(parents=True)
        self.shards: list[ShardInfo] = []
        self.moments = {name: _Moments() for name in ("actions", "proprio", "state")}
        self.meta: DatasetMeta | None = None

    def add(self, episode: Episode) -> ShardInfo:
        if self.meta is not None:
            raise DatasetError(f"{self.out_dir}: writer already closed")
        problems = _shape_problems(self.header, episode)
        if problems:
            raise DatasetError(f"episode {len(self.shards)} does not fit {self.header.env_id} "
                               f"({self.header.obs_mode}): {'; '.join(problems)}")
        data = _npz_bytes(episode.arrays())
        name = f"{EPISODE_DIR}/{len(self.shards):06d}.npz"
        write_synced(self.tmp / name, data)
        shard = ShardInfo(file=name, sha256=sha256_hex(data), size_bytes=len(data), steps=episode.steps,
                          seed=int(episode.seed), success=episode.succeeded, instruction=episode.instruction)
        self.shards.append(shard)
        self.moments["actions"].add(episode.actions)
        self.moments["proprio"].add(episode.proprio)
        if episode.state is not None:
            self.moments["state"].add(episode.state)
        return shard

    def close(self, **extra: Any) -> DatasetMeta:
        """Writes meta.json (``extra`` merged into its ``extra``) and moves the dataset into place."""
        if self.meta is not None:
            return self.meta
        if not self.shards:
            self.abort()
            raise DatasetError(f"{self.out_dir}: no episodes to write")
        header = {f.name: getattr(self.header, f.name) for f in fields(DatasetHeader)}
        meta = DatasetMeta(
            **{**header, "extra": {**self.header.extra, **extra}},
            episodes=len(self.shards), steps=sum(s.steps for s in self.shards),
            success_rate=sum(s.success for s in self.shards) / len(self.shards),
            stats={k: m.stats() for k, m in self.moments.items() if m.count},
            shards=list(self.shards),
        )
        write_synced(self.tmp / META_FILE, meta.to_json())
        fsync_dir(self.tmp / EPISODE_DIR)
        fsync_dir(self.tmp)
        self._swap_in()
        self.meta = meta
        return meta

    def _swap_in(self) -> None:
        old = None
        if self.out_dir.exists():
            if not self.overwrite:
                self.abort()
                raise DatasetError(f"{self.out_dir} appeared while writing; not replacing it")
            old = self.out_dir.parent / f".{self.out_dir.name}.old-{uuid.uuid4().hex[:8]}"
            self.out_dir.rename(old)
        self.tmp.rename(self.out_dir)
        fsync_dir(self.out_dir.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        elif self.meta is None:
            self.abort()


def _load_episode(path: Path, shard: ShardInfo, meta: DatasetMeta) -> Episode:
    data = read_bytes(path, DatasetCorrupt)
    if len(data) != shard.size_bytes:
        raise DatasetCorrupt(f"{path}: {len(data)} bytes, {META_FILE} says {shard.size_bytes} "
                             "(truncated or overwritten)")
    if sha256_hex(data) != shard.sha256:
        raise DatasetCorrupt(f"{path}: sha256 {sha256_hex(data)} does not match {META_FILE} ({shard.sha256})")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        episode = Episode(
            instruction=str(arrays["instruction"]), seed=int(arrays["seed"]), actions=arrays["actions"],
            proprio=arrays["proprio"], rewards=arrays["rewards"], success=arrays["success"],
            images=arrays.get("images"), state=arrays.get("state"),
            terminated=bool(arrays["terminated"]), truncated=bool(arrays["truncated"]),
        )
    except (ValueError, KeyError, OSError, zipfile.BadZipFile) as exc:
        raise DatasetCorrupt(f"{path}: not a readable episode shard ({exc!r})") from exc
    problems = _shape_problems(meta, episode)
    if episode.steps != shard.steps:
        problems.append(f"{episode.steps} steps, {META_FILE} says {shard.steps}")
    if problems:
        raise DatasetCorrupt(f"{path}: {'; '.join(problems)}")
    return episode


@dataclass(frozen=True)
class Minibatch:
    """Samples stacked for SFT; ``actions`` are action-chunk targets (see ``chunk_targets``)."""

    indices: np.ndarray  # int64 [B] sample indices
    episode: np.ndarray  # int64 [B]
    step: np.ndarray  # int64 [B]
    instructions: list[str]
    proprio: np.ndarray  # float32 [B, P]
    images: np.ndarray | None  # uint8 [B, C, H, W, 3]
    state: np.ndarray | None  # float32 [B, S]
    actions: np.ndarray  # float32 [B, chunk_len, A]
    action_mask: np.ndarray  # bool [B, chunk_len]: False where the chunk ran past the episode's end

    def head_proprio(self, with_state: bool) -> np.ndarray:
        """What a policy head sees beside the image: proprio, then the state vector when the job
        asks for it (as an env session with ``state_in_proprio`` builds it)."""
        if not with_state:
            return self.proprio.astype(np.float32)
        if self.state is None:
            raise DatasetError("the job asks for state in proprio but the dataset has no state")
        return np.concatenate([self.proprio, self.state], axis=1).astype(np.float32)


def chunk_targets(actions: np.ndarray, step: int, chunk_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Actions ``step .. step + chunk_len - 1`` of an episode, padded with its last action, and the mask.

    The padding repeats the last action (a policy told to hold still after
    the end), the mask marks it False so a loss can ignore it.
    """
    if chunk_len < 1:
        raise ConfigError(f"chunk_len must be >= 1, got {chunk_len}")
    if not 0 <= step < len(actions):
        raise DatasetError(f"step {step} outside an episode of {len(actions)} steps")
    wanted = step + np.arange(chunk_len)
    mask = wanted < len(actions)
    return actions[np.minimum(wanted, len(actions) - 1)], mask


class Dataset:
    """Random access to a dataset directory: episodes by index, samples by global index.

    The metadata is checked on open; each shard is checked (size, sha256,
    array shapes) when it is first read, and ``verify()`` checks them all.
    Recently read episodes stay in a small LRU cache (thread-safe).
    """

    def __init__(self, path: str | os.PathLike[str], *, cache_episodes: int = 32):
        self.path = Path(path)
        meta_path = self.path / META_FILE
        self.meta = DatasetMeta.from_json(read_bytes(meta_path, DatasetCorrupt), meta_path)
        self.offsets = np.concatenate([[0], np.cumsum([s.steps for s in self.meta.shards])]).astype(np.int64)
        self._cache: OrderedDict[int, Episode] = OrderedDict()
        self._cache_size = max(cache_episodes, 1)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def num_episodes(self) -> int:
        return len(self.meta.shards)

    def episode(self, index: int) -> Episode:
        if not 0 <= index < self.num_episodes:
            raise DatasetError(f"{self.path}: no episode {index} (it has {self.num_episodes})")
        with self._lock:
            if index in self._cache:
                self._cache.move_to_end(index)
                return self._cache[index]
        shard = self.meta.shards[index]
        episode = _load_episode(self.path / shard.file, shard, self.meta)
        with self._lock:
            self._cache[index] = episode
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return episode

    def episodes(self) -> Iterator[Episode]:
        for index in range(self.num_episodes):
            yield self.episode(index)

    def verify(self) -> None:
        """Reads and checks every shard (raises ``DatasetCorrupt`` naming the first bad file)."""
        for shard in self.meta.shards:
            _load_episode(self.path / shard.file, shard, self.meta)

    def locate(self, index: int) -> tuple[int, int]:
        """Sample index -> (episode, step)."""
        if not 0 <= index < len(self):
            raise DatasetError(f"{self.path}: no sample {index} (it has {len(self)})")
        episode = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return episode, int(index - self.offsets[episode])

    def minibatch(self, indices: np.ndarray | list[int], chunk_len: int = 1) -> Minibatch:
        """The samples at ``indices`` (in that order) with action chunks of ``chunk_len``."""
        where = [self.locate(int(i)) for i in indices]
        picked = [(self.episode(e), t) for e, t in where]
        chunks = [chunk_targets(ep.actions, t, chunk_len) for ep, t in picked]
        return Minibatch(
            indices=np.asarray(indices, dtype=np.int64),
            episode=np.array([e for e, _ in where], dtype=np.int64),
            step=np.array([t for _, t in where], dtype=np.int64),
            instructions=[ep.instruction for ep, _ in picked],
            proprio=np.stack([ep.proprio[t] for ep, t in picked]),
            images=np.stack([ep.images[t] for ep, t in picked]) if self.meta.has_images else None,
            state=np.stack([ep.state[t] for ep, t in picked]) if self.meta.has_state else None,
            actions=np.stack([c for c, _ in chunks]),
            action_mask=np.stack([m for _, m in chunks]),
        )


@dataclass(frozen=True)
class BatchRef:
    epoch: int
    batch: int  # position within the epoch, from 0
    indices: np.ndarray  # int64 sample indices, in order


def _num_samples(dataset: Dataset | DatasetMeta | int) -> int:
    if isinstance(dataset, Dataset):
        return len(dataset)
    if isinstance(dataset, DatasetMeta):
        return dataset.steps
    return int(dataset)


def layout_batches(dataset: Dataset | DatasetMeta | int, batch_size: int, seed: int, epoch: int, *,
                   drop_last: bool = False) -> list[np.ndarray]:
    """The sample indices of every batch of ``epoch``, in order: a pure function of its arguments.

    The shuffle's generator is seeded by ``(seed, epoch)`` alone, so an
    epoch's layout never depends on the epochs before it. The last batch is
    shorter unless ``drop_last``.
    """
    count = _num_samples(dataset)
    for name, value, least in (("batch_size", batch_size, 1), ("seed", seed, 0), ("epoch", epoch, 0)):
        if not isinstance(value, int | np.integer) or value < least:
            raise ConfigError(f"{name} must be an int >= {least}, got {value!r}")
    order = np.random.default_rng([seed, epoch]).permutation(count).astype(np.int64)
    stop = count - count % batch_size if drop_last else count
    return [order[i:i + batch_size] for i in range(0, stop, batch_size)]


def iter_batches(dataset: Dataset | DatasetMeta | int, batch_size: int, seed: int, *,
                 start_epoch: int = 0, start_batch: int = 0, stop_epoch: int | None = None,
                 drop_last: bool = False) -> Iterator[BatchRef]:
    """Batches from batch ``start_batch`` of ``start_epoch`` on, up to (not including) ``stop_epoch``.

    ``stop_epoch=None`` goes on forever. Resuming a feeder after batch k of
    epoch e is ``iter_batches(..., start_epoch=e, start_batch=k + 1)``.
    """
    epoch = start_epoch
    while stop_epoch is None or epoch < stop_epoch:
        batches = layout_batches(dataset, batch_size, seed, epoch, drop_last=drop_last)
        first = start_batch if epoch == start_epoch else 0
        for k in range(first, len(batches)):
            yield BatchRef(epoch, k, batches[k])
        epoch += 1
