"""What the event bus costs, measured against doing without it, in the same run.

    python -m benchmarks.bus_overhead [--n 300] [--json PATH] [--tasks T ...] [--inflight 8]
                                      [--backbone PRESET] [--skip-payloads]

For three payloads (a Heartbeat, an Observation with a 64x64 RGB image, a
FeatureBatch of 8x64x256 float32 features):

* codec: Avro encode + decode of the event vs the bare minimum (numpy
  ``tobytes`` + ``frombuffer`` of the same arrays);
* latency: one event at a time through the real broker (produce with acks=all,
  consumer receives) vs handing the same object over an in-process asyncio.Queue;
* throughput: N events produced in a burst and consumed back, events/s and MB/s.

Then, per task (``benchmarks/bus_roundtrip.py``): the observation -> action
round trip through Kafka against an in-process call (p50/p99, actions/s with
several sessions in flight), and the bus's share of an RL step (env step +
backbone forward + round trip).

Starts the local broker from settings if it is not running (``joynexus broker up``).
Prints markdown tables with ratios; ``--json`` writes {"payloads": [...], "round_trip": [...]}.
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
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from rich.progress import Progress

from infra.broker import LocalBroker
from infra.connection import client_options
from infra.logging import configure_logging
from infra.settings import Settings
from infra.topics import TopicAdmin
from producers.producer import EventProducer
from schemas import events as ev
from schemas.codec import Codec
from schemas.tensors import from_numpy, to_numpy


def payloads() -> dict[str, tuple[ev.Event, list[np.ndarray]]]:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (1, 64, 64, 3), dtype=np.uint8)
    proprio = rng.standard_normal(7).astype(np.float32)
    features = rng.standard_normal((8, 64, 256)).astype(np.float32)
    actions = rng.standard_normal((8, 4, 7)).astype(np.float32)
    env = ev.Envelope(tenant_id="bench")
    return {
        "Heartbeat": (ev.Heartbeat(envelope=env, role="bench", instance_id="i", host="h", pid=1,
                                   status=ev.RoleStatus.HEALTHY, sequence=1), []),
        "Observation 64px": (ev.Observation(envelope=env, session_id="s", episode_id="e", step=0,
                                            instruction="push the cube", image=from_numpy(image),
                                            proprio=from_numpy(proprio)), [image, proprio]),
        "FeatureBatch 512KiB": (ev.FeatureBatch(
            envelope=env, job_id="j", batch_id="b", sequence=0, policy_version=0, backbone_id="x",
            features={"sequence": from_numpy(features)}, targets={"actions": from_numpy(actions)},
            group_size=8, source_offset=0), [features, actions]),
    }


def _median_us(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def codec_cost(event: ev.Event, arrays: list[np.ndarray], repeats: int) -> tuple[float, float, int]:
    codec = Codec()
    data = codec.encode(event)

    def avro() -> None:
        decoded = codec.decode(codec.encode(event))
        for tensor in _tensors(decoded):
            to_numpy(tensor)

    def raw() -> None:
        for a in arrays:
            np.frombuffer(a.tobytes(), dtype=a.dtype).reshape(a.shape)

    return _median_us(avro, repeats), _median_us(raw, repeats), len(data)


def _tensors(event: ev.Event) -> list[ev.Tensor]:
    found = []
    for value in event.__dict__.values():
        if isinstance(value, ev.Tensor):
            found.append(value)
        elif isinstance(value, dict):
            found += [v for v in value.values() if isinstance(v, ev.Tensor)]
    return found


async def queue_latency(event: ev.Event, n: int) -> float:
    queue: asyncio.Queue = asyncio.Queue()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await queue.put(event)
        await queue.get()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


async def kafka_latency_and_throughput(settings: Settings, event: ev.Event, n: int,
                                       progress: Progress) -> tuple[float, float, float, float]:
    topic = f"bench.bus.{uuid.uuid4().hex[:8]}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_topic(topic, 1)
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(**client_options(settings), group_id=None,
                                enable_auto_commit=False, fetch_max_wait_ms=5,
                                max_partition_fetch_bytes=16 * 1024 * 1024)
    await consumer.start()
    consumer.assign([tp])
    await consumer.seek_to_end(tp)
    codec = Codec()
    try:
        async with EventProducer(settings, codec) as producer:
            task = progress.add_task(f"latency {type(event).__name__}", total=n)
            samples = []
            for _ in range(n):
                start = time.perf_counter()
                await producer.send(topic, event)
                record = await consumer.getone()
                codec.decode(record.value)
                samples.append(time.perf_counter() - start)
                progress.advance(task)
            latency_ms = statistics.median(samples) * 1e3
            p99_ms = float(np.percentile(samples, 99) * 1e3)

            start = time.perf_counter()
            for _ in range(n):
                await producer.enqueue(topic, event)
            await producer.flush()
            received = 0
            while received < n:
                batch = await consumer.getmany(tp, timeout_ms=1000)
                for record in batch.get(tp, []):
                    codec.decode(record.value)
                    received += 1
            rate = n / (time.perf_counter() - start)
    finally:
        await consumer.stop()
        async with TopicAdmin(settings) as admin:
            await admin.delete_topics([topic])
    return latency_ms, p99_ms, rate, rate * len(codec.encode(event)) / 2**20


async def main(args: argparse.Namespace) -> dict:
    from benchmarks import bus_roundtrip

    n, json_path = args.n, args.json
    settings = Settings()
    configure_logging("WARNING", settings.log_format)
    if settings.bootstrap_servers is None:  # no external broker named: use the local one
        await asyncio.to_thread(LocalBroker(settings).up)
    rows = []
    with Progress(transient=True) as progress:
        for name, (event, arrays) in ({} if args.skip_payloads else payloads()).items():
            avro_us, raw_us, size = codec_cost(event, arrays, repeats=max(50, n))
            queue_ms = await queue_latency(event, n)
            kafka_ms, kafka_p99, rate, mbps = await kafka_latency_and_throughput(
                settings, event, n, progress)
            rows.append({"payload": name, "bytes": size, "codec_us": avro_us, "raw_us": raw_us,
                         "codec_ratio": avro_us / max(raw_us, 1e-3), "kafka_ms": kafka_ms,
                         "kafka_p99_ms": kafka_p99, "queue_ms": queue_ms,
                         "latency_ratio": kafka_ms / queue_ms, "events_per_s": rate, "mib_per_s": mbps,
                         "compression": settings.compression_type})
    if rows:
        print("| payload | wire bytes | codec us | raw us | codec/raw | kafka p50 ms | kafka p99 ms "
              "| queue ms | kafka/queue | burst events/s | MiB/s |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['payload']} | {r['bytes']} | {r['codec_us']:.1f} | {r['raw_us']:.1f} | "
                  f"{r['codec_ratio']:.1f}x | {r['kafka_ms']:.2f} | {r['kafka_p99_ms']:.2f} | "
                  f"{r['queue_ms']:.4f} | {r['latency_ratio']:.0f}x | {r['events_per_s']:.0f} | "
                  f"{r['mib_per_s']:.1f} |")
    trips = await bus_roundtrip.run(settings, args.tasks, args.n, args.inflight, args.backbone)
    print("\nobservation -> action round trip, and the bus's share of an RL step\n")
    print(bus_roundtrip.markdown(trips, args.inflight))
    result = {"payloads": rows, "round_trip": [t.as_dict() for t in trips]}
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=2))
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=300, help="events (and round-trip steps) per measurement")
    parser.add_argument("--json", type=Path, default=None, help="write rows as JSON here")
    parser.add_argument("--tasks", nargs="+", default=["joynexus/Reach-v0", "PushCube-v1"])
    parser.add_argument("--inflight", type=int, default=8, help="sessions stepping at once (round trip)")
    parser.add_argument("--backbone", default=None,
                        help="preset of the RL step's forward (default: settings)")
    parser.add_argument("--skip-payloads", action="store_true", help="only the round trip")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
