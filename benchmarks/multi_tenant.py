"""Multi-tenant vs isolated: the paper's headline, measured on this machine.

The same four jobs (the demo's scenario: PPO on Reach twice, PPO on ManiSkill
PushCube, SFT on a Reach dataset) run through the same service twice, in the
same process and on the same broker:

* isolated: one job after another, each alone on the backbone (what a tenant
  renting its own device would get, minus the model loading);
* shared: all four at once, grouped into shared backbone forwards.

Printed per mode: wall time, backbone device-busy seconds (inference and
training queues, from the device gate), forwards, and the ratios
shared/isolated. Each tenant's final parameters are also compared between
the two modes (they must be bit-identical: the no-chaos claim).

    python -m benchmarks.multi_tenant [--full] [--no-maniskill]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime

import torch
from rich.console import Console
from rich.table import Table

from infra.runtime.demo import ensure_dataset, scenario
from infra.settings import Settings


async def _run(service, client, specs: list[dict], together: bool) -> float:
    began = time.monotonic()
    if together:
        handles = [await client.submit(spec) for spec in specs]
        states = await asyncio.gather(*(client.follow(h, timeout_s=3600) for h in handles))
    else:
        states = []
        for spec in specs:
            states.append(await client.follow(await client.submit(spec), timeout_s=3600))
    bad = [(s.tenant, s.phase, s.reason) for s in states if s.phase != "completed"]
    if bad:
        raise RuntimeError(f"jobs did not complete: {bad}")
    return time.monotonic() - began


def _gate_snapshot(gate) -> dict[str, float]:
    return {"busy_inference": gate.busy_s["inference"], "busy_train": gate.busy_s["train"],
            "forwards_inference": float(gate.forwards["inference"]),
            "forwards_train": float(gate.forwards["train"])}


async def main(full: bool, maniskill: bool) -> None:
    from consumers.service import Service
    from infra.broker import LocalBroker
    from infra.runtime.host import RoleHost
    from producers.client.sdk import Client

    settings = Settings()
    console = Console()
    await asyncio.to_thread(LocalBroker(settings).up)
    dataset = await asyncio.to_thread(ensure_dataset, settings, not full)
    tag = datetime.now(UTC).strftime("%m%d%H%M%S")
    base = scenario(not full, dataset, maniskill)
    modes = {}
    service = await Service.open(settings)
    try:
        roles = RoleHost(service.settings, service=service)
        async with roles, Client(settings, requested_by="benchmark") as client:
            for mode in ("isolated", "shared"):
                specs = [{**s, "tenant": f"{s['tenant']}-{mode[:3]}{tag}", "job_id": "bench"} for s in base]
                before = _gate_snapshot(service.gate)
                wall = await _run(service, client, specs, together=mode == "shared")
                after = _gate_snapshot(service.gate)
                modes[mode] = {"wall_s": wall, **{k: after[k] - before[k] for k in after}}
                modes[mode]["tenants"] = [s["tenant"] for s in specs]
    finally:
        await service.close()
    iso, sha = modes["isolated"], modes["shared"]
    table = Table("metric", "isolated (one by one)", "shared (all at once)", "shared / isolated",
                  title=f"multi-tenant vs isolated, {len(base)} tenants, backbone {settings.backbone}")
    for key in ("wall_s", "busy_inference", "busy_train", "forwards_inference", "forwards_train"):
        ratio = sha[key] / iso[key] if iso[key] else float("nan")
        table.add_row(key, f"{iso[key]:.2f}", f"{sha[key]:.2f}", f"{ratio:.3f}")
    busy_iso = iso["busy_inference"] + iso["busy_train"]
    busy_sha = sha["busy_inference"] + sha["busy_train"]
    table.add_row("busy_total_s", f"{busy_iso:.2f}", f"{busy_sha:.2f}", f"{busy_sha / busy_iso:.3f}")
    fractions = busy_iso / iso["wall_s"], busy_sha / sha["wall_s"]
    table.add_row("busy fraction of wall", f"{fractions[0]:.3f}", f"{fractions[1]:.3f}", "")
    console.print(table)
    store = service.store
    same = []
    for a, b in zip(iso["tenants"], sha["tenants"], strict=True):
        ma, mb = store.load(a).state.model, store.load(b).state.model
        same.append(all(torch.equal(ma[k], mb[k]) for k in ma))
    console.print(f"final parameters bit-identical isolated vs shared: {sum(same)}/{len(same)} tenants")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="the full-size demo scenario (slow)")
    parser.add_argument("--no-maniskill", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.full, not args.no_maniskill))
