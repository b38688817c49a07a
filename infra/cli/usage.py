"""``joynexus metering`` (the faust metering role) and ``joynexus usage`` (its per-tenant totals)."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Annotated

import typer
from rich.table import Table

from infra.cli.common import fail, load_settings, out
from infra.errors import JoynexusError

app = typer.Typer(no_args_is_help=True)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_window(text: str) -> int:
    """``90``, ``90s``, ``15m``, ``1h``, ``1d`` -> seconds."""
    match = re.fullmatch(r"(\d+)([smhd]?)", text.strip())
    if not match or int(match.group(1)) == 0:
        raise typer.BadParameter(f"{text!r}: use a positive number of s, m, h or d (e.g. 1h)")
    return int(match.group(1)) * _UNITS[match.group(2) or "s"]


@app.command("metering")
def metering(
    parent_pid: Annotated[int | None, typer.Option(help="The supervisor's pid: stop when it dies.")] = None,
) -> None:
    """Run the metering role (a faust-streaming worker) until stopped: UsageRecorded into
    per-tenant tumbling-window tables."""
    from infra.runtime.affinity import pin_process

    settings = load_settings()
    try:  # first: before faust and the Kafka clients start threads of their own
        pin_process(settings.cpu_affinity, "metering")
    except JoynexusError as exc:
        fail(exc)
    if parent_pid is not None:  # a killed supervisor's metering would stay in its group for good
        from infra.runtime.host import die_with_parent

        die_with_parent(parent_pid)
    from consumers.metering import run_worker

    run_worker(settings)


@app.command("usage")
def usage(
    tenant: Annotated[str | None, typer.Argument(help="One tenant (default: all).")] = None,
    window: Annotated[str, typer.Option("--window", "-w", help="Window width: 1h, 15m, 1d...")] = "1h",
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Metered usage per tenant and window: device-seconds and steps by role and resource."""
    from consumers.metering import read_usage

    settings = load_settings()
    try:
        rows = asyncio.run(read_usage(settings, tenant, parse_window(window)))
    except (JoynexusError, ValueError) as exc:
        fail(exc)
    if as_json:
        for row in rows:
            print(json.dumps({"tenant": row.tenant, "window_start": row.window_start.isoformat(),
                              "window_end": row.window_end.isoformat(), "seconds": row.seconds,
                              "steps": row.steps, "events": row.events, "by_resource": row.by_resource}))
        return
    table = Table("tenant", "window (UTC)", "device-seconds", "steps", "events", "by role|resource")
    for row in rows:
        detail = ", ".join(f"{k} {v[0]:.2f}s" + (f"/{int(v[1])} steps" if v[1] else "")
                           for k, v in sorted(row.by_resource.items()))
        table.add_row(row.tenant, f"{row.window_start:%Y-%m-%d %H:%M}-{row.window_end:%H:%M}",
                      f"{row.seconds:.3f}", str(row.steps), str(row.events), detail)
    out.print(table)
