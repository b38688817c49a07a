"""The bus: ``joynexus topics ensure|list|delete``, ``replay``, ``schemas``, ``roundtrip``."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from datetime import UTC, datetime
from enum import Enum
from typing import Annotated, Any

import typer
from rich.table import Table

from infra.cli.common import console, fail, load_settings, out, print_lines
from infra.errors import JoynexusError
from infra.settings import Settings
from infra.topics import SHARED_STREAMS, TopicAdmin, shared_topic, tenant_topic

app = typer.Typer(no_args_is_help=True)
topics_app = typer.Typer(no_args_is_help=True, help="Create, list and delete topics.")
app.add_typer(topics_app, name="topics")


@topics_app.command("ensure")
def topics_ensure(tenant: Annotated[list[str] | None, typer.Option("--tenant", "-t")] = None) -> None:
    """Create the shared topics and, for each --tenant, that tenant's topics (idempotent)."""
    async def run() -> list[str]:
        async with TopicAdmin(load_settings()) as admin:
            names = await admin.ensure_shared()
            for t in tenant or ():
                names += await admin.ensure_tenant(t)
            return names
    print_lines(run())


@topics_app.command("list")
def topics_list(tenant: Annotated[str | None, typer.Option("--tenant", "-t")] = None) -> None:
    """List one tenant's topics, or every tenant."""
    async def run() -> list[str]:
        async with TopicAdmin(load_settings()) as admin:
            return await (admin.tenant_topics(tenant) if tenant else admin.tenants())
    print_lines(run())


@topics_app.command("delete")
def topics_delete(
    tenant: Annotated[str, typer.Option("--tenant", "-t")],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
) -> None:
    """Delete every topic of a tenant (its whole event history)."""
    if not yes:
        typer.confirm(f"Delete all topics of tenant {tenant!r}?", abort=True)

    async def run() -> list[str]:
        async with TopicAdmin(load_settings()) as admin:
            return await admin.delete_tenant(tenant)
    print_lines(run(), prefix="deleted ")


# ---------------------------------------------------------------------- replay
def _resolve_topic(settings: Settings, topic: str, tenant: str | None) -> str:
    if tenant:
        return tenant_topic(settings, tenant, topic)
    if topic in {s.stream for s in SHARED_STREAMS}:
        return shared_topic(settings, topic)
    return topic


def _jsonable(value: Any, raw_bytes: bool) -> Any:
    if isinstance(value, bytes):
        if raw_bytes:
            return base64.b64encode(value).decode()
        return {"bytes": len(value), "sha256": hashlib.sha256(value).hexdigest()[:16]}
    if isinstance(value, dict):
        return {k: _jsonable(v, raw_bytes) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, raw_bytes) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    return value


def _parse_time(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"not an ISO-8601 time: {value!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@app.command()
def replay(
    topic: Annotated[str, typer.Argument(help="Topic, or a stream name with --tenant (e.g. features).")],
    tenant: Annotated[str | None, typer.Option("--tenant", "-t")] = None,
    partition: Annotated[list[int] | None, typer.Option("--partition", "-p")] = None,
    from_offset: Annotated[int | None, typer.Option(help="First offset (inclusive).")] = None,
    from_time: Annotated[str | None, typer.Option(help="ISO time (inclusive), UTC if naive.")] = None,
    to_offset: Annotated[int | None, typer.Option(help="Last offset (exclusive).")] = None,
    to_time: Annotated[str | None, typer.Option(help="ISO time (exclusive).")] = None,
    limit: Annotated[int | None, typer.Option(help="Stop after N records.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    uncommitted: Annotated[bool, typer.Option(help="Also show aborted/open transactions.")] = False,
    raw_bytes: Annotated[bool, typer.Option("--bytes", help="Print bytes as base64.")] = False,
) -> None:
    """Print a window of a topic, decoded, without joining or moving any consumer group."""
    from consumers.bus.replay import replay as replay_window

    if from_offset is not None and from_time is not None:
        raise typer.BadParameter("give --from-offset or --from-time, not both")
    if to_offset is not None and to_time is not None:
        raise typer.BadParameter("give --to-offset or --to-time, not both")
    settings = load_settings()
    name = _resolve_topic(settings, topic, tenant)

    async def run() -> int:
        count = 0
        async for rec in replay_window(
            settings, name, partitions=partition, from_offset=from_offset,
            from_time=_parse_time(from_time), to_offset=to_offset, to_time=_parse_time(to_time),
            limit=limit, read_uncommitted=uncommitted,
        ):
            count += 1
            line = {
                "topic": rec.topic, "partition": rec.partition, "offset": rec.offset,
                "timestamp": datetime.fromtimestamp(rec.timestamp_ms / 1000, UTC).isoformat(),
                "key": rec.key.decode(errors="replace") if rec.key is not None else None,
                "headers": {k: v.decode(errors="replace") for k, v in rec.headers},
                "type": type(rec.event).__name__ if rec.event else None,
            }
            if rec.event is not None:
                line["event"] = _jsonable(rec.event.model_dump(), raw_bytes)
            else:
                line["error"] = rec.error
                line["value"] = _jsonable(rec.value or b"", raw_bytes)
            if as_json:
                print(json.dumps(line), flush=True)
            else:
                what = line["type"] or f"UNDECODABLE ({rec.error})"
                print(f"{line['topic']}[{line['partition']}]@{line['offset']} {line['timestamp']} "
                      f"key={line['key']} {what} {json.dumps(line.get('event', line.get('value')))}",
                      flush=True)
        return count
    try:
        count = asyncio.run(run())
    except JoynexusError as exc:
        fail(exc)
    console.print(f"{count} record(s)")


# --------------------------------------------------------------------- schemas
@app.command()
def schemas() -> None:
    """List the current schemas with their CRC-64-AVRO fingerprints."""
    from schemas.registry import SchemaRegistry

    table = Table("schema", "fingerprint", "file")
    registry = SchemaRegistry()
    for name in registry.names():
        version = registry.current(name)
        table.add_row(name, version.fingerprint.hex(), version.source.name)
    out.print(table)


# ------------------------------------------------------------------- roundtrip
@app.command()
def roundtrip(
    tenant: Annotated[str, typer.Option("--tenant", "-t")] = "demo",
    count: Annotated[int, typer.Option(help="Events per stream.")] = 20,
) -> None:
    """Provision a tenant, publish events of every kind, consume them back, and report."""
    from infra.runtime.roundtrip import run_roundtrip

    settings = load_settings()
    try:
        report = asyncio.run(run_roundtrip(settings, tenant, count))
    except JoynexusError as exc:
        fail(exc)
    # Age = receipt time - creation time; events are built first and sent as one burst,
    # so this is the burst's delivery time, not a per-event latency (benchmarks/bus_overhead.py).
    table = Table("topic", "event", "sent", "received", "age p50 ms", "age max ms",
                  title=f"round trip for tenant {tenant!r} via {settings.bootstrap}")
    for row in report.rows:
        table.add_row(row.topic, row.event, str(row.sent), str(row.received),
                      f"{row.p50_ms:.1f}", f"{row.max_ms:.1f}")
    out.print(table)
    if not report.ok:
        console.print("[red]round trip lost or changed events[/red]")
        raise typer.Exit(1)
    console.print(f"[green]ok[/green]: {report.total} events, every one back intact. "
                  f"Replay them: joynexus replay status --tenant {tenant} --json")
