"""``joynexus health [--json]``: a table (or JSON lines) of every instance heard from lately.

Read from ``nexus.health`` over the last ``window`` seconds, without joining any
consumer group. Ages are on the senders' clocks (the time of the beat and of
the last progress, relative to now here); ``verdict`` is the health role's
judgement of that process, if any; ``restarts`` counts its supervisor's restarts.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from infra.cli.common import fail, load_settings, out
from infra.errors import JoynexusError
from infra.healthbook import HealthView
from infra.settings import Settings

app = typer.Typer(no_args_is_help=True)


@app.command()
def health(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per instance.")] = False,
    window: Annotated[float, typer.Option(help="Read the heartbeats of the last N seconds.")] = 30.0,
) -> None:
    """Every role instance the health topic has heard from: status, partitions, lag, progress, restarts."""
    settings = load_settings()
    try:
        rows = asyncio.run(health_rows(settings, window))
    except JoynexusError as exc:
        fail(exc)
    print_health(rows, as_json)


async def health_rows(settings: Settings, window_s: float) -> list[dict[str, Any]]:
    async with HealthView(settings, lookback_s=window_s, name="health-cli") as view:
        await view.caught_up()
    now = datetime.now(UTC)
    rows = []
    for state in sorted(view.book.instances.values(), key=lambda s: (s.instance_id, s.role)):
        rows.append({
            "instance": state.instance_id, "role": state.role, "host": state.host, "pid": state.pid,
            "status": state.status, "beat_age_s": round((now - state.beat_at).total_seconds(), 1),
            "partitions": list(state.partitions), "lag": state.lag, "pending": state.pending,
            "progress_age_s": (round((now - state.progress_at).total_seconds(), 1)
                               if state.progress_at else None),
            "restarts": state.restarts, "verdict": state.verdict, "details": state.details,
        })
    return rows


def print_health(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return
    table = Table("instance", "role", "pid", "status", "beat age s", "partitions", "lag", "pending",
                  "progress age s", "restarts", "verdict", "details", title="joynexus health")
    for r in rows:
        details = " ".join(f"{k}={v}" for k, v in sorted(r["details"].items()))
        table.add_row(r["instance"], r["role"], str(r["pid"]), r["status"], f"{r['beat_age_s']:.1f}",
                      str(len(r["partitions"])), str(r["lag"]), str(r["pending"]),
                      "-" if r["progress_age_s"] is None else f"{r['progress_age_s']:.1f}",
                      str(r["restarts"]), r["verdict"] or "-", details[:60])
    out.print(table)
