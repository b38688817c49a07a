"""Offline datasets: exact round trips, reproducible bytes, corruption named, atomic writes, SFT layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from envs import make_simulator
from infra.errors import ConfigError
from producers.dataset import (
    Dataset,
    DatasetCorrupt,
    DatasetError,
    DatasetHeader,
    DatasetWriter,
    Episode,
    chunk_targets,
    generate_dataset,
    iter_batches,
    layout_batches,
)
from producers.dataset.generate import episode_seed


@pytest.fixture(scope="module")
def push_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("datasets") / "push"
    generate_dataset("joynexus/Push-v0", out, episodes=12, seed=3, obs_mode="rgb+state", image_size=32,
                     progress=False)
    return out


def header(**overrides) -> DatasetHeader:
    fields = dict(env_id="synthetic", obs_mode="state", image_size=None, cameras=0, action_dim=2,
                  action_low=-1.0, action_high=1.0, proprio_dim=3, state_dim=4, max_episode_steps=10,
                  generator="tests", seed=0)
    return DatasetHeader(**{**fields, **overrides})


def synthetic_episode(rng: np.random.Generator, steps: int, seed: int = 0) -> Episode:
    return Episode(instruction=f"episode {seed}", seed=seed,
                   actions=rng.uniform(-1, 1, (steps, 2)).astype(np.float32),
                   proprio=rng.normal(size=(steps, 3)).astype(np.float32),
                   rewards=rng.normal(size=steps).astype(np.float32),
                   success=np.arange(steps) == steps - 1,
                   state=rng.normal(size=(steps, 4)).astype(np.float32), truncated=True)


def test_write_then_read_gives_identical_episodes_and_exact_stats(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    episodes = [synthetic_episode(rng, steps, seed) for seed, steps in enumerate([3, 7, 1, 5])]
    with DatasetWriter(tmp_path / "ds", header()) as writer:
        for episode in episodes:
            writer.add(episode)
    data = Dataset(tmp_path / "ds")
    assert (data.num_episodes, len(data), data.meta.steps, data.meta.success_rate) == (4, 16, 16, 1.0)
    for written, read in zip(episodes, data.episodes(), strict=True):
        for name, value in written.arrays().items():
            np.testing.assert_array_equal(read.arrays()[name], value, err_msg=name)
    everything = np.concatenate([e.actions for e in episodes]).astype(np.float64)
    stats = data.meta.stats["actions"]
    np.testing.assert_allclose(stats.mean, everything.mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats.std, everything.std(0), rtol=1e-12)
    assert stats.min == everything.min(0).tolist() and stats.max == everything.max(0).tolist()
    assert set(data.meta.stats) == {"actions", "proprio", "state"}
    assert [s.file for s in data.meta.shards] == [f"episodes/{i:06d}.npz" for i in range(4)]


def test_generated_demonstrations_record_what_the_simulator_did(push_dir: Path) -> None:
    data = Dataset(push_dir)
    meta = data.meta
    assert (meta.env_id, meta.obs_mode, meta.image_size) == ("joynexus/Push-v0", "rgb+state", 32)
    assert (meta.cameras, meta.action_dim, meta.proprio_dim, meta.state_dim) == (1, 2, 4, 10)
    assert meta.episodes == 12
    assert meta.success_rate == 1.0 and meta.generator.endswith("PushExpert")
    assert [s.seed for s in meta.shards] == [episode_seed(3, k) for k in range(12)]
    episode = data.episode(5)
    assert episode.images.shape == (episode.steps, 1, 32, 32, 3) and episode.images.dtype == np.uint8
    # Replaying the recorded actions from the recorded seed reproduces the recorded episode.
    sim = make_simulator("joynexus/Push-v0", obs_mode="rgb+state", image_size=32)
    obs = sim.reset(episode.seed)
    assert obs.instruction == episode.instruction
    for t, action in enumerate(episode.actions):
        np.testing.assert_array_equal(obs.proprio, episode.proprio[t])
        np.testing.assert_array_equal(obs.image, episode.images[t])
        out = sim.step(action)
        assert (np.float32(out.reward), out.success) == (episode.rewards[t], episode.success[t])
        obs = out.obs


def test_the_same_generator_and_seed_give_the_same_bytes(tmp_path: Path, push_dir: Path) -> None:
    kwargs = dict(episodes=12, obs_mode="rgb+state", image_size=32, progress=False)
    again = generate_dataset("joynexus/Push-v0", tmp_path / "again", seed=3, **kwargs)
    other = generate_dataset("joynexus/Push-v0", tmp_path / "other", seed=4, **kwargs)
    original = Dataset(push_dir).meta
    assert [s.sha256 for s in again.shards] == [s.sha256 for s in original.shards]
    assert not {s.sha256 for s in other.shards} & {s.sha256 for s in original.shards}
    assert (push_dir / "meta.json").read_bytes() == (tmp_path / "again" / "meta.json").read_bytes()


def copy_of(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_damaged_shard_is_named(tmp_path: Path, push_dir: Path, damage: str) -> None:
    path = copy_of(push_dir, tmp_path / "ds")
    shard = path / "episodes" / "000007.npz"
    data = bytearray(shard.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
    elif damage == "truncate":
        shard.write_bytes(bytes(data[:-10]))
    else:
        shard.unlink()
    reader = Dataset(path)
    reader.episode(6)  # the others are fine
    with pytest.raises(DatasetCorrupt, match=r"episodes/000007\.npz"):
        reader.episode(7)
    with pytest.raises(DatasetCorrupt, match=r"000007\.npz"):
        reader.verify()


def test_tampered_metadata_is_named(tmp_path: Path, push_dir: Path) -> None:
    path = copy_of(push_dir, tmp_path / "ds")
    body = json.loads((path / "meta.json").read_text())
    body["success_rate"] = 0.5
    (path / "meta.json").write_text(json.dumps(body))
    with pytest.raises(DatasetCorrupt, match=r"meta\.json: content does not match its checksum"):
        Dataset(path)
    (path / "meta.json").write_text("{not json")
    with pytest.raises(DatasetCorrupt, match=r"meta\.json: not a valid dataset metadata file"):
        Dataset(path)


def test_writes_are_atomic_and_never_replace_silently(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    target = tmp_path / "ds"
    with pytest.raises(RuntimeError, match="boom"), DatasetWriter(target, header()) as writer:
        writer.add(synthetic_episode(rng, 4))
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []  # no dataset, no temp directory left behind
    with DatasetWriter(target, header()) as writer:
        writer.add(synthetic_episode(rng, 4))
    with pytest.raises(DatasetError, match="already exists"):
        DatasetWriter(target, header())
    with DatasetWriter(target, header(seed=9), overwrite=True) as writer:
        writer.add(synthetic_episode(rng, 2))
    assert Dataset(target).meta.seed == 9 and len(Dataset(target)) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]


def test_episodes_that_do_not_fit_the_header_are_refused(tmp_path: Path) -> None:
    writer = DatasetWriter(tmp_path / "ds", header())
    bad = synthetic_episode(np.random.default_rng(2), 3)
    with pytest.raises(DatasetError, match=r"proprio is float32\[3, 2\], expected float32\[3, 3\]"):
        writer.add(Episode(**{**bad.__dict__, "proprio": bad.proprio[:, :2]}))
    with pytest.raises(DatasetError, match="images present"):
        writer.add(Episode(**{**bad.__dict__, "images": np.zeros((3, 1, 8, 8, 3), np.uint8)}))
    with pytest.raises(DatasetError, match="no episodes"):
        writer.close()


def test_only_success_skips_failures_and_gives_up_when_there_are_too_few(tmp_path: Path) -> None:
    class Idle:
        noise = 0.0

        def reset(self, seed: int) -> None:
            pass

        def act(self, obs, sim):
            return np.zeros(2, dtype=np.float32)

    with pytest.raises(DatasetError, match="only 0 of 2 episodes succeeded in 5 attempts"):
        generate_dataset("joynexus/Reach-v0", tmp_path / "idle", episodes=2, seed=0, obs_mode="state",
                         expert=Idle(), only_success=True, max_attempts=5, progress=False,
                         max_episode_steps=3)
    assert list(tmp_path.iterdir()) == []
    meta = generate_dataset("joynexus/Reach-v0", tmp_path / "short", episodes=3, seed=0, obs_mode="state",
                            only_success=True, max_episode_steps=9, progress=False)
    assert meta.success_rate == 1.0 and meta.extra["attempts"] > 3  # some episodes need more than 9 steps
    assert meta.extra["attempt_success_rate"] == pytest.approx(3 / meta.extra["attempts"])


def test_batch_layout_is_a_pure_function_of_seed_and_epoch(push_dir: Path) -> None:
    data = Dataset(push_dir)
    n = len(data)
    epoch2 = layout_batches(data, 16, seed=5, epoch=2)
    for epoch in range(4):  # computing other epochs first changes nothing
        layout_batches(data, 16, seed=5, epoch=epoch)
    assert all(np.array_equal(a, b) for a, b in zip(epoch2, layout_batches(data.meta, 16, 5, 2), strict=True))
    assert sorted(np.concatenate(epoch2).tolist()) == list(range(n))  # each sample once per epoch
    assert [len(b) for b in epoch2] == [16] * (n // 16) + ([n % 16] if n % 16 else [])
    assert not np.array_equal(np.concatenate(epoch2), np.concatenate(layout_batches(n, 16, 5, 3)))
    assert not np.array_equal(np.concatenate(epoch2), np.concatenate(layout_batches(n, 16, 6, 2)))
    assert all(len(b) == 16 for b in layout_batches(n, 16, 5, 2, drop_last=True))
    with pytest.raises(ConfigError, match="batch_size"):
        layout_batches(n, 0, 5, 2)


def test_a_feeder_resumes_exactly_after_batch_k_of_epoch_e(push_dir: Path) -> None:
    meta = Dataset(push_dir).meta
    straight = list(iter_batches(meta, 32, seed=1, stop_epoch=3))
    position = next(i for i, ref in enumerate(straight) if (ref.epoch, ref.batch) == (1, 2))
    resumed = list(iter_batches(meta, 32, seed=1, start_epoch=1, start_batch=3, stop_epoch=3))
    tail = straight[position + 1:]
    assert [(r.epoch, r.batch) for r in resumed] == [(r.epoch, r.batch) for r in tail]
    assert all(np.array_equal(a.indices, b.indices) for a, b in zip(resumed, tail, strict=True))


def test_chunk_targets_pad_with_the_last_action_and_mask_the_padding() -> None:
    actions = np.arange(10, dtype=np.float32).reshape(5, 2)
    chunk, mask = chunk_targets(actions, step=3, chunk_len=4)
    np.testing.assert_array_equal(chunk, actions[[3, 4, 4, 4]])
    assert mask.tolist() == [True, True, False, False]
    chunk, mask = chunk_targets(actions, step=0, chunk_len=3)
    np.testing.assert_array_equal(chunk, actions[:3])
    assert mask.all()
    with pytest.raises(DatasetError, match="outside"):
        chunk_targets(actions, step=5, chunk_len=2)


def test_minibatches_never_mix_episodes_at_their_boundaries(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    with DatasetWriter(tmp_path / "ds", header()) as writer:
        for seed, steps in enumerate([4, 2, 3]):
            writer.add(synthetic_episode(rng, steps, seed))
    data = Dataset(tmp_path / "ds")
    # samples 3 and 4 are the last step of episode 0 and the first of episode 1
    batch = data.minibatch([3, 4, 5, 8], chunk_len=3)
    assert batch.episode.tolist() == [0, 1, 1, 2] and batch.step.tolist() == [3, 0, 1, 2]
    first, second, third = data.episode(0), data.episode(1), data.episode(2)
    np.testing.assert_array_equal(batch.actions[0], first.actions[[3, 3, 3]])
    np.testing.assert_array_equal(batch.actions[1], second.actions[[0, 1, 1]])
    np.testing.assert_array_equal(batch.actions[2], second.actions[[1, 1, 1]])
    np.testing.assert_array_equal(batch.actions[3], third.actions[[2, 2, 2]])
    assert batch.action_mask.tolist() == [[True, False, False], [True, True, False], [True, False, False],
                                          [True, False, False]]
    np.testing.assert_array_equal(batch.proprio[1], second.proprio[0])
    assert batch.instructions == ["episode 0", "episode 1", "episode 1", "episode 2"]
    assert batch.images is None and batch.state.shape == (4, 4)
    assert data.locate(4) == (1, 0) and data.locate(8) == (2, 2)
    with pytest.raises(DatasetError, match="no sample 9"):
        data.locate(9)


def test_state_joins_proprio_only_when_the_job_asks_and_the_dataset_has_it(push_dir: Path,
                                                                             tmp_path: Path) -> None:
    from consumers.master import plan
    from infra.settings import Settings
    from producers.dataset.feeder import DatasetFeeder
    from schemas.jobspec import JobSpec
    from schemas.tensors import to_numpy

    def spec(path: Path, with_state: bool) -> JobSpec:
        return JobSpec.parse(json.dumps({"kind": "sft", "tenant": "t", "job_id": "j", "seed": 1,
                                         "dataset": {"path": str(path), "state_in_proprio": with_state}}))

    settings = Settings(home=tmp_path / "home")
    meta = Dataset(push_dir).meta
    plain, _ = plan.dataset_dims(spec(push_dir, False), settings)
    dims, dataset = plan.dataset_dims(spec(push_dir, True), settings)
    assert (plain.proprio_dim, dims.proprio_dim) == (meta.proprio_dim, meta.proprio_dim + meta.state_dim)
    job = DatasetFeeder(settings, dataset, plan.feed_plan(spec(push_dir, True), 0, 1)).gradient_job(0)
    proprio = to_numpy(job.proprio)
    mb = dataset.minibatch(layout_batches(dataset, 32, 1, 0)[0], 1)
    assert proprio.shape[1] == dims.proprio_dim  # what the head is built for
    assert np.array_equal(proprio, np.concatenate([mb.proprio, mb.state], axis=1))

    rgb_only = tmp_path / "rgb"
    generate_dataset("joynexus/Push-v0", rgb_only, episodes=2, seed=3, obs_mode="rgb", image_size=32,
                     progress=False)
    with pytest.raises(plan.CompileError) as refused:
        plan.dataset_dims(spec(rgb_only, True), settings)
    assert refused.value.loc == "dataset.state_in_proprio" and "rgb+state" in str(refused.value)
