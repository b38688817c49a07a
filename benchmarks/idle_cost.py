"""What an idle service costs, and what each tenant adds to it, measured on this machine.

    python -m benchmarks.idle_cost [--tenants 28] [--window 60] [--settle 30] [--json PATH]

The service runs as OS processes (as ``joynexus up`` runs it, the multi-tenant
benchmark's deployment and placement) with no job at all, twice in one run:
first with only the shared topics (baseline), then after ``--tenants`` tenants'
topics were created (what a benchmark of 3 repeats leaves: 7 rounds of 4
tenants). After ``--settle`` seconds (the new topics' rebalances done), the CPU
seconds of every process kind, the broker and this process are read over
``--window`` seconds. Printed: CPU share of one core per kind, both phases, and
the difference per tenant.

None of it is work: heartbeats, long polls, metadata refreshes, group
coordination. Every second of it is taken from the simulators and the device
while a benchmark runs, so what grows with tenants ever registered makes a
service slower with its age.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks.multi_tenant import default_cpus, processes, steal_seconds
from infra.runtime.affinity import pin_process
from infra.settings import Settings


async def measure(device, window_s: float) -> tuple[dict[str, float], float]:
    """CPU share of one core per process kind over ``window_s``, and the share the VM's host stole
    (both CPUs together: not the service's, so not in its totals)."""
    before, stolen, began = device.cpu(), steal_seconds(), time.monotonic()
    await asyncio.sleep(window_s)
    after, took = device.cpu(), time.monotonic() - began
    shares = {k.removeprefix("cpu_").removesuffix("_s"): (after[k] - before[k]) / took
              for k in after if k.startswith("cpu_")}
    return shares, (steal_seconds() - stolen) / took


async def main(args: argparse.Namespace) -> dict:
    from infra.broker import LocalBroker
    from infra.topics import TopicAdmin

    settings = Settings()
    settings = settings.model_copy(update={"cpu_affinity": default_cpus()})
    pin_process(settings.cpu_affinity, "benchmark")
    if settings.bootstrap_servers is None:
        await asyncio.to_thread(LocalBroker(settings).up)
    console = Console() if Console().is_terminal else Console(width=140)
    phases: dict[str, dict[str, float]] = {}
    steal: dict[str, float] = {}
    async with processes(settings, console, args.env_workers) as (device, _store), \
            TopicAdmin(settings) as admin:
        await admin.ensure_shared()
        with console.status("baseline: shared topics only"):
            await asyncio.sleep(args.settle)
            phases["shared topics only"], steal["shared topics only"] = await measure(device, args.window)
        tag = time.strftime("%m%d%H%M%S")
        for i in range(args.tenants):
            await admin.ensure_tenant(f"idle-{i}-{tag}")
        on_broker = len(await admin.tenants())
        with console.status(f"{args.tenants} tenants' topics ({on_broker} tenants on the broker)"):
            await asyncio.sleep(args.settle)
            name = f"+{args.tenants} tenants"
            phases[name], steal[name] = await measure(device, args.window)
    base, more = phases.values()
    table = Table(title=f"idle service: CPU, % of one core ({args.window:.0f} s windows)")
    table.add_column("process")
    for name in phases:
        table.add_column(name, justify="right")
    table.add_column("per tenant", justify="right")
    for kind in sorted(base, key=lambda k: -more[k]):
        per = (more[kind] - base[kind]) / args.tenants
        table.add_row(kind, f"{100 * base[kind]:.1f}", f"{100 * more[kind]:.1f}", f"{100 * per:+.2f}")
    total = {name: sum(p.values()) for name, p in phases.items()}
    first, last = total.values()
    table.add_row("total", f"{100 * first:.1f}", f"{100 * last:.1f}",
                  f"{100 * (last - first) / args.tenants:+.2f}")
    console.print(table)
    console.print("CPU stolen by the VM's host, % of one core (not in the totals): "
                  + ", ".join(f"{name} {100 * share:.1f}" for name, share in steal.items()))
    result = {"tenants": args.tenants, "window_s": args.window, "settle_s": args.settle,
              "cpu_share": phases, "total": total, "steal_share": steal}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=28, help="tenants whose topics are created")
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured per phase")
    parser.add_argument("--settle", type=float, default=30.0, help="seconds waited before each window")
    parser.add_argument("--env-workers", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.tenants < 1 or args.window <= 0 or args.settle < 0:
        parser.error("--tenants >= 1, --window > 0, --settle >= 0")
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
