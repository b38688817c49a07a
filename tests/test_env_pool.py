"""The env worker's simulator pool: a finished session's simulator serves the next session of the
same tenant and shape, never another tenant's, and idle ones are closed."""

from __future__ import annotations

import threading
import time

from consumers.env.pool import SimulatorPool
from envs import make_simulator
from schemas import events as ev
from tests.test_sim_builtin import assert_same_rollout, rollout


def request(tenant: str, image_size: int = 32) -> ev.EnvSessionRequested:
    return ev.EnvSessionRequested(
        envelope=ev.Envelope(tenant_id=tenant), session_id=f"{tenant}-s", job_id="j",
        env_id="joynexus/Reach-v0", obs_mode="rgb", image_size=image_size, cameras=1, seed=0, episodes=1,
        max_episode_steps=10)


def make(spec: ev.EnvSessionRequested):
    return make_simulator(spec.env_id, obs_mode=spec.obs_mode, image_size=spec.image_size,
                          max_episode_steps=spec.max_episode_steps)


class Tracked:
    """A real simulator whose close() is recorded (the built-in ones have nothing to release)."""

    def __init__(self, spec: ev.EnvSessionRequested):
        self.sim, self.closed = make(spec), threading.Event()

    def close(self) -> None:
        self.closed.set()


def test_a_kept_simulator_serves_the_same_tenant_and_shape_only() -> None:
    pool = SimulatorPool(make)
    first = pool.acquire(request("a"))
    pool.release(request("a"), first)
    assert pool.acquire(request("b")) is not first  # tenants never share a simulator
    assert pool.acquire(request("a", image_size=48)) is not first  # nor do different shapes
    assert pool.acquire(request("a")) is first
    assert (pool.made, pool.reused) == (3, 1) and pool.idle == 0


def test_a_kept_simulator_plays_the_same_episodes_as_a_new_one() -> None:
    pool = SimulatorPool(make)
    used = pool.acquire(request("a"))
    rollout(used, seed=5, steps=10)  # another episode first
    pool.release(request("a"), used)
    again = pool.acquire(request("a"))
    assert again is used
    assert_same_rollout(rollout(again, seed=3, steps=10), rollout(make(request("a")), seed=3, steps=10))


def test_idle_simulators_beyond_the_limit_or_too_old_are_closed() -> None:
    now = [0.0]
    pool = SimulatorPool(Tracked, max_idle=1, idle_ttl_s=60.0, clock=lambda: now[0])
    kept, extra = pool.acquire(request("a")), pool.acquire(request("a"))
    pool.release(request("a"), kept)
    pool.release(request("a"), extra)  # over max_idle: closed
    assert pool.idle == 1 and extra.closed.wait(5) and not kept.closed.is_set()
    now[0] = 30.0
    assert pool.expire() == 0
    now[0] = 61.0
    assert pool.expire() == 1 and pool.idle == 0
    assert kept.closed.wait(5)


def test_a_start_in_flight_is_counted_so_the_worker_is_not_judged_stalled() -> None:
    release = threading.Event()

    def slow(spec: ev.EnvSessionRequested):
        release.wait(10)
        return make(spec)

    pool = SimulatorPool(slow)
    started = threading.Thread(target=pool.acquire, args=(request("a"),))
    started.start()
    deadline = time.monotonic() + 5
    while pool.starting == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.starting == 1
    release.set()
    started.join(10)
    assert pool.starting == 0 and pool.made == 1
