"""The feature-reuse benchmark at a test-sized load: its counters and byte counts are read back, an RL
iteration's rows are requested once and its images go by reference, and the three cache
configurations end with bit-identical checkpoints."""

from __future__ import annotations

import pytest

from benchmarks import feature_reuse

EPISODES, STEPS = 2, 5
IMAGE_BYTES = 32 * 32 * 3  # the built-in Reach's camera at the demo's image size


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.timeout(1800)
async def test_an_iteration_is_requested_once_and_its_images_go_by_reference(settings, tmp_path,
                                                                            monkeypatch) -> None:
    monkeypatch.setenv("JOYNEXUS_BOOTSTRAP_SERVERS", settings.bootstrap)
    monkeypatch.setenv("JOYNEXUS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("JOYNEXUS_TENSOR_INLINE_MAX_BYTES", "4096")  # an iteration's images are larger
    result = await feature_reuse.main(feature_reuse.parse([
        "--iterations", "1", "--episodes", str(EPISODES), "--steps", str(STEPS), "--ppo-epochs", "3",
        "--sft-epochs", "1", "--json", str(tmp_path / "reuse.json")]))
    rows = EPISODES * STEPS
    assert result["RL it0: rows requested"] == {"off": rows, "train": rows, "shared": rows}  # not 3x
    assert result["RL it0: rows forwarded"]["shared"] == 0  # inference computed every one
    assert 0 < result["RL it0: rows forwarded"]["off"] <= rows
    for config in feature_reuse.CONFIGS:
        assert result["RL bytes/iteration: gradient-jobs"][config] < rows * IMAGE_BYTES
        assert result["RL tensor-store bytes/iteration"][config] >= rows * IMAGE_BYTES
        assert result["SFT bytes/epoch: gradient-jobs"][config] > 0
    assert result["identical_checkpoints"] == {"rl": True, "sft": True}
    assert (tmp_path / "reuse.json").exists()
