"""Environment steps per second through the bus vs stepping the simulator directly, same run.

    python -m benchmarks.env_throughput [--env joynexus/Reach-v0] [--sessions 3] [--steps 300]

"direct": one loop calls reset/step with the same deterministic actions.
"bus": the env role (an in-process EnvWorker) steps the same sessions, each step
waiting for an Action that a stand-in inference service sends back through
Kafka (Observation -> Action round trip), rollouts committed per episode.
Starts the local broker if it is not running. Prints a table with the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from pathlib import Path

from consumers.env import simulator_for
from consumers.env.worker import EnvWorker
from infra.broker import LocalBroker
from infra.logging import configure_logging
from infra.settings import Settings
from infra.topics import TopicAdmin, tenant_topic
from tests.helpers import read_topic, running
from tests.test_env_role import ActionSource, action_for, request_sessions, session_request


def direct(env_id: str, sessions: int, episodes: int, steps: int) -> tuple[int, float]:
    total, start = 0, time.perf_counter()
    for s in range(sessions):
        spec = session_request("bench", f"bench-s{s}", env_id, episodes, steps)
        sim = simulator_for(spec)
        for k in range(episodes):
            sim.reset(spec.seed + k)
            for step in range(steps):
                result = sim.step(action_for(spec.session_id, f"{spec.session_id}/{k}", step,
                                             sim.spec.action_dim))
                total += 1
                if result.terminated or result.truncated:
                    break
        sim.close()
    return total, time.perf_counter() - start


async def through_bus(settings: Settings, env_id: str, sessions: int, episodes: int,
                      steps: int) -> tuple[int, float]:
    tenant = f"bench-{uuid.uuid4().hex[:6]}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_shared()
        await admin.ensure_tenant(tenant)
    requests = [session_request(tenant, f"{tenant}-s{s}", env_id, episodes, steps) for s in range(sessions)]
    probe = simulator_for(requests[0])
    source = ActionSource(settings, rf"^nexus\.t\.{tenant}\.observations$", probe.spec.action_dim,
                          f"bench-act-{tenant}")
    probe.close()
    worker = EnvWorker(settings, simulator_for, worker_id=f"bench-{tenant}", group_id=f"env-{tenant}",
                       tenants=tenant)
    async with running(source), running(worker):
        # Group joins and pattern discovery are start-up costs, not stepping: wait them out.
        while not (worker.consumer.assignment() and source.loop.consumer.assignment()):
            await asyncio.sleep(0.05)
        start = time.perf_counter()
        await request_sessions(settings, requests)
        rollouts = tenant_topic(settings, tenant, "rollouts")
        while True:
            done = {r.event.episode_id for r in await read_topic(settings, rollouts)}
            if len(done) >= sessions * episodes:
                break
            await asyncio.sleep(0.2)
        elapsed = time.perf_counter() - start
    total = len(await read_topic(settings, rollouts))
    async with TopicAdmin(settings) as admin:
        await admin.delete_tenant(tenant)
    return total, elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="joynexus/Reach-v0")
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    settings = Settings()
    configure_logging("WARNING", settings.log_format)
    if settings.bootstrap_servers is None:
        await asyncio.to_thread(LocalBroker(settings).up)
    d_steps, d_s = direct(args.env, args.sessions, args.episodes, args.steps)
    b_steps, b_s = await through_bus(settings, args.env, args.sessions, args.episodes, args.steps)
    row = {"env": args.env, "sessions": args.sessions, "direct_steps_per_s": d_steps / d_s,
           "bus_steps_per_s": b_steps / b_s, "direct_steps": d_steps, "bus_steps": b_steps}
    row["ratio"] = row["bus_steps_per_s"] / row["direct_steps_per_s"]
    print("| env | sessions | direct steps/s | bus steps/s | bus/direct |")
    print("|---|---|---|---|---|")
    print(f"| {row['env']} | {row['sessions']} | {row['direct_steps_per_s']:.0f} | "
          f"{row['bus_steps_per_s']:.0f} | {row['ratio']:.3f} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(row, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
