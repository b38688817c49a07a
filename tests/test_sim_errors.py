"""Bad requests get clear errors; failing simulators surface as SimulatorError, in process and isolated."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from envs import (
    InvalidAction,
    IsolatedSimulator,
    SimulatorError,
    env_ids,
    make_expert,
    make_simulator,
)
from envs.vulkan import probe_vulkan
from infra.errors import ConfigError
from tests.test_sim_builtin import assert_same_rollout, rollout


def test_unknown_env_ids_and_modes_list_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="joynexus/Reach-v0") as err:
        make_simulator("joynexus/Nope-v0")
    assert "PushCube-v1" in str(err.value) and "Pendulum-v1" in str(err.value)
    with pytest.raises(ConfigError, match=r"obs_mode must be one of \('rgb', 'state', 'rgb\+state'\)"):
        make_simulator("joynexus/Reach-v0", obs_mode="depth")
    with pytest.raises(ConfigError, match="image_size"):
        make_simulator("joynexus/Reach-v0", image_size=8)
    with pytest.raises(ConfigError, match="at most 2 cameras"):
        make_simulator("joynexus/Reach-v0", cameras=3)


def test_task_options_are_checked_by_name_and_type() -> None:
    with pytest.raises(ConfigError, match="valid options: distractors"):
        make_simulator("joynexus/Reach-v0?colour=red")
    with pytest.raises(ConfigError, match="must be int"):
        make_simulator("joynexus/Reach-v0?distractors=many")
    with pytest.raises(ConfigError, match="distractors must be in"):
        make_simulator("joynexus/Push-v0", options={"distractors": 4})
    with pytest.raises(ConfigError, match=r"fault' must be one of \('raise', 'hang', 'nan', 'exit'\)"):
        make_simulator("joynexus/Faulty-v0?fault=explode")
    with pytest.raises(ConfigError, match="both in the env id"):
        make_simulator("joynexus/Faulty-v0?at_step=2", options={"at_step": 3})
    with pytest.raises(ConfigError, match="valid options: none"):
        make_simulator("Pendulum-v1?speed=2", obs_mode="state")
    sim = make_simulator("joynexus/Reach-v0?distractors=3", obs_mode="state")
    assert sim.spec.env_id == "joynexus/Reach-v0?distractors=3" and sim.spec.state_dim == 12


def test_make_expert_names_the_tasks_that_have_one() -> None:
    with pytest.raises(ConfigError, match="has no scripted expert; these do: .*PushCube-v1"):
        make_expert("Pusher-v5")
    assert set(env_ids("maniskill")) == {"PushCube-v1", "PickCube-v1", "StackCube-v1", "PullCube-v1",
                                         "LiftPegUpright-v1"}


def test_invalid_actions_and_seeds_are_the_callers_fault() -> None:
    sim = make_simulator("joynexus/Reach-v0", obs_mode="state")
    with pytest.raises(InvalidAction, match="step before reset"):
        sim.step(np.zeros(2))
    for seed in (-1, 2**32, 1.5, "3", True):
        with pytest.raises(InvalidAction, match="seed must be an int"):
            sim.reset(seed)
    sim.reset(0)
    with pytest.raises(InvalidAction, match=r"shape \(2,\)"):
        sim.step(np.zeros(3))
    with pytest.raises(InvalidAction, match="NaN"):
        sim.step(np.array([np.nan, 0.0]))
    sim.step(np.zeros(2))  # the episode goes on after a refused action


def test_an_exception_inside_the_simulator_becomes_a_simulator_error_with_its_cause() -> None:
    sim = make_simulator("joynexus/Faulty-v0?fault=raise&at_step=2", obs_mode="state")
    sim.reset(0)
    sim.step(np.zeros(2))
    with pytest.raises(SimulatorError, match="step 2 of the episode with seed 0 failed") as err:
        sim.step(np.zeros(2))
    assert isinstance(err.value.__cause__, RuntimeError)
    with pytest.raises(InvalidAction):  # that episode is lost; a new one starts cleanly
        sim.step(np.zeros(2))
    sim.reset(1)
    resetting = make_simulator("joynexus/Faulty-v0", obs_mode="state", options={"at_reset": 2})
    resetting.reset(0)
    with pytest.raises(SimulatorError, match="reset\\(seed=1\\) failed"):
        resetting.reset(1)


def test_garbage_observations_are_a_simulator_error() -> None:
    sim = make_simulator("joynexus/Faulty-v0?fault=nan&at_step=1", obs_mode="state")
    sim.reset(0)
    with pytest.raises(SimulatorError, match="proprio has NaN"):
        sim.step(np.zeros(2))


def test_a_hang_ends_with_a_simulator_error_when_closed_from_another_thread() -> None:
    sim = make_simulator("joynexus/Faulty-v0?fault=hang&at_step=1", obs_mode="state")
    sim.reset(0)
    errors: list[BaseException] = []

    def step() -> None:
        try:
            sim.step(np.zeros(2))
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=step)
    worker.start()
    time.sleep(0.2)
    assert worker.is_alive()  # it hangs
    sim.close()
    worker.join(timeout=5)
    assert not worker.is_alive()
    assert isinstance(errors[0], SimulatorError) and "closed while hanging" in str(errors[0])


def test_once_file_faults_once_and_a_restarted_simulator_runs_clean(tmp_path: Path) -> None:
    env_id = f"joynexus/Faulty-v0?at_step=2&once_file={tmp_path / 'faulted'}"
    first = make_simulator(env_id, obs_mode="state")
    with pytest.raises(SimulatorError):
        rollout(first, seed=0, steps=10)
    restarted = make_simulator(env_id, obs_mode="state")
    assert len(rollout(restarted, seed=0, steps=10)) == 11


def test_an_isolated_simulator_replays_the_in_process_episode_exactly() -> None:
    isolated = IsolatedSimulator("joynexus/Push-v0", timeout_s=30, obs_mode="rgb+state", cameras=2)
    try:
        assert isolated.spec == make_simulator("joynexus/Push-v0", obs_mode="rgb+state", cameras=2).spec
        local = make_simulator("joynexus/Push-v0", obs_mode="rgb+state", cameras=2)
        assert_same_rollout(rollout(isolated, seed=4, steps=20), rollout(local, seed=4, steps=20))
        with pytest.raises(InvalidAction, match="shape"):  # the caller's errors come back as themselves
            isolated.step(np.zeros(5))
        assert set(isolated.privileged()) >= {"agent", "block", "goal"}
    finally:
        isolated.close()


def test_an_isolated_hang_times_out_kills_the_child_and_the_object_is_dead() -> None:
    sim = IsolatedSimulator("joynexus/Faulty-v0?fault=hang&at_step=1", timeout_s=1.0, obs_mode="state")
    sim.reset(0)
    started = time.monotonic()
    with pytest.raises(SimulatorError, match="step timed out after 1 s; killed"):
        sim.step(np.zeros(2))
    assert time.monotonic() - started < 10
    assert sim._proc.poll() is not None  # the child is gone
    with pytest.raises(SimulatorError, match="process is gone"):
        sim.reset(0)
    sim.close()


def test_an_isolated_process_that_dies_is_reported_with_its_exit_code() -> None:
    sim = IsolatedSimulator("joynexus/Faulty-v0?fault=exit&at_step=2", timeout_s=30, obs_mode="state")
    sim.reset(0)
    sim.step(np.zeros(2))
    with pytest.raises(SimulatorError, match="process exited with code 17"):
        sim.step(np.zeros(2))
    sim.close()


def test_the_vulkan_probe_really_asks_the_driver() -> None:
    """With the Vulkan loader pointed at no driver, the probe must say no (and why)."""
    status = probe_vulkan(env={**os.environ, "VK_ICD_FILENAMES": "/nonexistent/icd.json"})
    assert not status.available
    assert "rendering device" in status.reason or "Incompatible" in status.reason, status.reason


def test_an_isolated_simulator_that_cannot_start_says_why() -> None:
    with pytest.raises(ConfigError, match="unknown env id"):
        IsolatedSimulator("joynexus/Nope-v0", timeout_s=30)
