"""The observation -> action round trip through Kafka vs an in-process call, and its share of an RL step.

Used by ``benchmarks/bus_overhead.py`` (which prints it); runnable alone:

    python -m benchmarks.bus_roundtrip [--tasks joynexus/Reach-v0 PushCube-v1] [--n 200]
                                       [--inflight 8] [--backbone tiny]

Per task, with that task's real observation (a simulator reset, the job spec's
default ``rgb+state`` at 32 px, as the env role publishes it):

* kafka: a client publishes the Observation (acks=all, as the env role does) to
  an observations topic; a responder consumes it (read_committed, the roles'
  consumer settings), decodes it, publishes an Action (zeros: no compute, so
  only the bus is timed) to an actions topic, and the client consumes that.
  p50/p99 over ``--n`` sequential steps (one in flight), and throughput
  (actions/s) with ``--inflight`` sessions stepping at once;
* in-process: the same responder called directly (no codec, no broker), same
  p50/p99 and throughput: the baseline, in the same run;
* an RL step without the bus: the task's simulator step (median over ``--n``
  steps with random actions) plus one backbone forward of that observation
  (``--backbone``, median), so "bus share" = kafka p50 / (env step + forward +
  kafka p50): what the round trip costs a tenant's step on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from dataclasses import asdict, dataclass

import numpy as np
from aiokafka.structs import TopicPartition

from consumers.bus.loop import make_consumer
from infra.settings import Settings
from infra.topics import TopicAdmin
from producers.producer import EventProducer
from schemas import events as ev
from schemas.codec import Codec
from schemas.tensors import from_numpy

__all__ = ["RoundTrip", "TaskRow", "measure_task"]


@dataclass(frozen=True)
class RoundTrip:
    p50_ms: float
    p99_ms: float
    per_s: float  # actions per second with ``inflight`` sessions stepping at once


@dataclass(frozen=True)
class TaskRow:
    task: str
    obs_bytes: int
    kafka: RoundTrip
    inprocess: RoundTrip
    env_step_ms: float
    forward_ms: float
    backbone: str

    @property
    def bus_share(self) -> float:
        return self.kafka.p50_ms / (self.env_step_ms + self.forward_ms + self.kafka.p50_ms)

    def as_dict(self) -> dict:
        return asdict(self) | {"bus_share": self.bus_share,
                               "latency_ratio": self.kafka.p50_ms / max(self.inprocess.p50_ms, 1e-6),
                               "throughput_ratio": self.kafka.per_s / self.inprocess.per_s}


def _respond(obs: ev.Observation, action_dim: int) -> ev.Action:
    return ev.Action(envelope=ev.Envelope(tenant_id=obs.envelope.tenant_id), session_id=obs.session_id,
                     episode_id=obs.episode_id, step=obs.step,
                     action=from_numpy(np.zeros(action_dim, dtype=np.float32)), policy_version=0)


def _observation(template: ev.Observation, session: int, step: int) -> ev.Observation:
    return template.model_copy(update={"session_id": f"s{session}", "step": step})


async def _drive(step_once, n: int, inflight: int) -> tuple[list[float], float]:
    """``n`` sequential steps (latency samples), then ``n`` steps over ``inflight`` sessions (rate)."""
    samples = []
    for i in range(n):
        began = time.perf_counter()
        await step_once(0, i)
        samples.append(time.perf_counter() - began)
    per_session = max(1, n // inflight)

    async def session(s: int) -> None:
        for i in range(per_session):
            await step_once(s, i)

    began = time.perf_counter()
    await asyncio.gather(*(session(s) for s in range(inflight)))
    return samples, per_session * inflight / (time.perf_counter() - began)


def _summary(samples: list[float], rate: float) -> RoundTrip:
    return RoundTrip(statistics.median(samples) * 1e3, float(np.percentile(samples, 99)) * 1e3, rate)


async def inprocess_round_trip(template: ev.Observation, action_dim: int, n: int, inflight: int) -> RoundTrip:
    async def step_once(session: int, step: int) -> None:
        _respond(_observation(template, session, step), action_dim)

    return _summary(*await _drive(step_once, n, inflight))


async def kafka_round_trip(settings: Settings, template: ev.Observation, action_dim: int, n: int,
                           inflight: int) -> RoundTrip:
    run = uuid.uuid4().hex[:8]
    obs_topic, act_topic = f"bench.rt.{run}.observations", f"bench.rt.{run}.actions"
    async with TopicAdmin(settings) as admin:
        for topic in (obs_topic, act_topic):
            await admin.ensure_topic(topic, 1)
    codec = Codec()
    waiting: dict[tuple[str, int], asyncio.Future] = {}
    obs_in, act_in = make_consumer(settings, None), make_consumer(settings, None)
    tasks: list[asyncio.Task] = []
    try:
        for consumer, topic in ((obs_in, obs_topic), (act_in, act_topic)):
            await consumer.start()
            consumer.assign([TopicPartition(topic, 0)])
            await consumer.seek_to_end(TopicPartition(topic, 0))
        async with EventProducer(settings, codec) as client, EventProducer(settings, codec) as responder:

            async def serve() -> None:  # the stand-in inference role: decode, answer, publish
                async for record in obs_in:
                    obs = codec.decode(record.value)
                    await responder.send(act_topic, _respond(obs, action_dim), key=obs.session_id)

            async def dispatch() -> None:  # the env role's side: hand each action to its session
                async for record in act_in:
                    action = codec.decode(record.value)
                    future = waiting.pop((action.session_id, action.step), None)
                    if future is not None and not future.done():
                        future.set_result(action)

            tasks = [asyncio.create_task(serve()), asyncio.create_task(dispatch())]

            async def step_once(session: int, step: int) -> None:
                obs = _observation(template, session, step)
                future = asyncio.get_running_loop().create_future()
                waiting[(obs.session_id, step)] = future
                await client.send(obs_topic, obs, key=obs.session_id)
                await asyncio.wait_for(future, 30)

            await step_once(0, -1)  # connections and first fetches are start-up, not steps
            return _summary(*await _drive(step_once, n, inflight))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await obs_in.stop()
        await act_in.stop()
        async with TopicAdmin(settings) as admin:
            await admin.delete_topics([obs_topic, act_topic])


def env_step_ms(task: str, n: int) -> tuple[float, ev.Observation, int]:
    """Median simulator step (random actions, resets excluded), the task's first Observation event,
    and its action size."""
    from envs.registry import make_simulator

    sim = make_simulator(task, obs_mode="rgb+state", image_size=32, max_episode_steps=30)
    try:
        obs = sim.reset(0)
        rng = np.random.default_rng(0)
        template = ev.Observation(
            envelope=ev.Envelope(tenant_id="bench"), session_id="s0", episode_id="e0", step=0,
            instruction=obs.instruction, image=from_numpy(obs.image),
            state=from_numpy(obs.state) if obs.state is not None else None,
            proprio=from_numpy(np.asarray(obs.proprio, dtype=np.float32)))
        low, high = sim.spec.action_low, sim.spec.action_high
        samples, episode = [], 0
        for _ in range(n):
            action = rng.uniform(low, high, sim.spec.action_dim).astype(np.float32)
            began = time.perf_counter()
            result = sim.step(action)
            samples.append(time.perf_counter() - began)
            if result.terminated or result.truncated:
                episode += 1
                sim.reset(episode)
        return statistics.median(samples) * 1e3, template, sim.spec.action_dim
    finally:
        sim.close()


def forward_ms(backbone, template: ev.Observation, n: int) -> float:
    from consumers.convert import observation_request

    prepared = backbone.prepare(observation_request(template, state_in_proprio=True))
    backbone.forward([prepared])  # warm-up
    samples = []
    for _ in range(max(5, n // 10)):
        began = time.perf_counter()
        backbone.forward([prepared])
        samples.append(time.perf_counter() - began)
    return statistics.median(samples) * 1e3


async def measure_task(settings: Settings, task: str, backbone, n: int, inflight: int) -> TaskRow:
    step_ms, template, action_dim = await asyncio.to_thread(env_step_ms, task, n)
    fwd = await asyncio.to_thread(forward_ms, backbone, template, n)
    inproc = await inprocess_round_trip(template, action_dim, n, inflight)
    kafka = await kafka_round_trip(settings, template, action_dim, n, inflight)
    return TaskRow(task, len(Codec().encode(template)), kafka, inproc, step_ms, fwd, backbone.backbone_id)


def markdown(rows: list[TaskRow], inflight: int) -> str:
    lines = ["| task | obs bytes | kafka RT p50 / p99 ms | in-process p50 / p99 ms | kafka/in-process p50 "
             f"| kafka actions/s ({inflight} in flight) | in-process actions/s | env step ms | forward ms "
             "| bus share of an RL step |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        d = r.as_dict()
        lines.append(f"| {r.task} | {r.obs_bytes} | {r.kafka.p50_ms:.2f} / {r.kafka.p99_ms:.2f} "
                     f"| {r.inprocess.p50_ms:.4f} / {r.inprocess.p99_ms:.4f} | {d['latency_ratio']:,.0f}x "
                     f"| {r.kafka.per_s:,.0f} | {r.inprocess.per_s:,.0f} | {r.env_step_ms:.2f} "
                     f"| {r.forward_ms:.2f} | {r.bus_share:.1%} |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=["joynexus/Reach-v0", "PushCube-v1"])
    p.add_argument("--n", type=int, default=200, help="steps per measurement")
    p.add_argument("--inflight", type=int, default=8, help="sessions stepping at once for throughput")
    p.add_argument("--backbone", default=None, help="preset for the forward (default: settings)")
    return p


async def run(settings: Settings, tasks: list[str], n: int, inflight: int,
              preset: str | None) -> list[TaskRow]:
    from backbone.info import set_torch_threads
    from backbone.model import Backbone
    from envs.vulkan import vulkan_available

    set_torch_threads(settings.torch_threads)
    backbone = Backbone.from_preset(preset or settings.backbone, settings.model_dir, settings.device,
                                    settings.dtype)
    rows = []
    for task in tasks:
        if not task.startswith(("joynexus/", "Pendulum", "Reacher", "Pusher")) and not vulkan_available():
            print(f"{task}: skipped, no Vulkan device answers (ManiSkill needs one)")
            continue
        rows.append(await measure_task(settings, task, backbone, n, inflight))
    return rows


async def main(argv: list[str] | None = None) -> list[TaskRow]:
    from infra.broker import LocalBroker
    from infra.logging import configure_logging

    args = parser().parse_args(argv)
    settings = Settings()
    configure_logging("WARNING", settings.log_format)
    if settings.bootstrap_servers is None:
        await asyncio.to_thread(LocalBroker(settings).up)
    rows = await run(settings, args.tasks, args.n, args.inflight, args.backbone)
    print(markdown(rows, args.inflight))
    return rows


if __name__ == "__main__":
    asyncio.run(main())
