"""What a Kafka request costs per observation: a round of sessions' observations sent one request
each against all in one request, through the real broker, in the same run.

    python -m benchmarks.produce_batching [--rounds 1000] [--sessions 8] [--repeats 3] [--json PATH]

Each round publishes one observation per session (the demo's payload: a 32x32 RGB image, a state
and a proprio vector; each session keyed to its own partition) and a consumer in the same process
reads them back, as the inference role does. "alone": each observation sent and acknowledged
before the next (one produce request each, as an env worker sends when its sessions finish their
steps at different times); "together": the round's observations handed to the producer at once
and acknowledged together (one request, as a worker whose sessions stepped as one would send).
The two modes alternate (alone first, then together first) ``--repeats`` times. Printed per
observation: this process's CPU (producing and consuming), the broker's CPU (``/proc``) and the
wall time, medians over the repeats, and the ratio together / alone. It bounds what sending a
round in one request could save; it is not the service.

Starts the local broker from settings if it is not running (``joynexus broker up``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from pathlib import Path

import numpy as np

from benchmarks.multi_tenant import cpu_seconds
from consumers.bus.loop import make_consumer
from infra.broker import LocalBroker
from infra.settings import Settings
from infra.topics import TopicAdmin
from producers.producer import EventProducer
from schemas import events as ev
from schemas.tensors import from_numpy

__all__ = ["main", "measure"]

MODES = ("alone", "together")
DISTINCT_ROUNDS = 50  # observations are built once and sent again: building is not the bus


def observations(sessions: int, rounds: int) -> list[list[ev.Observation]]:
    rng = np.random.default_rng(0)

    def one(i: int, step: int) -> ev.Observation:
        return ev.Observation(
            envelope=ev.Envelope(tenant_id="bench"), session_id=f"s{i}", episode_id=f"s{i}/0", step=step,
            instruction="reach the red target",
            image=from_numpy(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)),
            state=from_numpy(rng.standard_normal(6).astype(np.float32)),
            proprio=from_numpy(rng.standard_normal(4).astype(np.float32)))

    return [[one(i, step) for i in range(sessions)] for step in range(min(rounds, DISTINCT_ROUNDS))]


async def _send_round(producer: EventProducer, topic: str, batch: list[ev.Observation], mode: str) -> None:
    if mode == "alone":
        for obs in batch:
            await producer.send(topic, obs, key=obs.session_id)
    else:  # all appended before the sender wakes, then acknowledged together
        for obs in batch:
            await producer.enqueue(topic, obs, key=obs.session_id)
        await producer.flush()


async def _read_up_to(consumer, read: int, sent: int, timeout_s: float = 30.0) -> int:
    """The round is read back before the next one goes; a lost observation fails the run."""
    deadline = time.monotonic() + timeout_s
    while read < sent:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{sent - read} observation(s) not read back within {timeout_s} s")
        read += sum(map(len, (await consumer.getmany(timeout_ms=1000)).values()))
    return read


async def measure(settings: Settings, rounds: int, sessions: int, repeats: int,
                  broker_pid: int | None) -> dict[str, list[dict[str, float]]]:
    """Per mode, one dict per repeat: client_us, broker_us and wall_us per observation."""
    topic = f"bench.t.batching{uuid.uuid4().hex[:6]}.observations"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_topic(topic, sessions)
    rounds_of = observations(sessions, rounds)
    consumer = make_consumer(settings, f"bench-batching-{uuid.uuid4().hex[:6]}", topics=[topic])
    await consumer.start()
    read, sent = 0, 0
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    try:
        async with EventProducer(settings) as producer:
            for repeat in range(repeats):
                for mode in MODES if repeat % 2 == 0 else MODES[::-1]:
                    cpu, broker, wall = time.process_time(), cpu_seconds(broker_pid), time.monotonic()
                    for r in range(rounds):
                        await _send_round(producer, topic, rounds_of[r % len(rounds_of)], mode)
                        sent += sessions
                        read = await _read_up_to(consumer, read, sent)
                    n = rounds * sessions
                    results[mode].append({
                        "client_us": (time.process_time() - cpu) / n * 1e6,
                        "broker_us": (cpu_seconds(broker_pid) - broker) / n * 1e6,
                        "wall_us": (time.monotonic() - wall) / n * 1e6})
    finally:
        await consumer.stop()
        async with TopicAdmin(settings) as admin:
            await admin.delete_topics([topic])
    return results


def medians(results: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {mode: {key: statistics.median(row[key] for row in rows) for key in rows[0]}
            for mode, rows in results.items()}


def report(results: dict[str, list[dict[str, float]]]) -> str:
    med = medians(results)
    lines = ["| per observation | alone (one request each) | together (one request a round) "
             "| together / alone |", "|---|---|---|---|"]
    for key, label in (("client_us", "this process's CPU, us"), ("broker_us", "broker CPU, us"),
                       ("wall_us", "wall, us")):
        a, t = med["alone"][key], med["together"][key]
        ratio = f"{t / a:.3f}" if a else "-"
        lines.append(f"| {label} | {a:.1f} | {t:.1f} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.sessions < 1 or args.repeats < 1:
        parser.error("--rounds, --sessions and --repeats must be at least 1")
    settings = Settings()
    broker_pid = None
    if settings.bootstrap_servers is None:  # no external broker named: use (and measure) the local one
        broker = LocalBroker(settings)
        broker.up()
        broker_pid = broker.pid()
    results = asyncio.run(measure(settings, args.rounds, args.sessions, args.repeats, broker_pid))
    print(report(results))
    out = {"rounds": args.rounds, "sessions": args.sessions, "repeats": results, "medians": medians(results)}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
