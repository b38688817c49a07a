"""Tenants' jobs: ``joynexus submit``, ``status``, ``cancel``."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from infra.cli.common import console, fail, load_settings, out
from infra.errors import JoynexusError
from infra.topics import TopicAdmin

app = typer.Typer(no_args_is_help=True)


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
    from schemas.jobspec import JobSpec, JobSpecInvalid

    settings = load_settings()
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
    from infra.jobbook import JobBook

    settings = load_settings()

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
        fail(JoynexusError(f"no job {job!r}"))
    out.print(_jobs_table(sorted(states, key=lambda s: (s.tenant, s.submitted_at or datetime.min))))


@app.command()
def cancel(
    job: Annotated[str, typer.Argument(help="Job id.")],
    tenant: Annotated[str, typer.Option("--tenant", "-t")],
    reason: Annotated[str | None, typer.Option()] = None,
) -> None:
    """Ask the master to cancel a job; its sessions close and every role stops working on it."""
    from producers.client.sdk import Client, JobHandle

    settings = load_settings()

    async def go() -> None:
        async with Client(settings, requested_by="cli") as client:
            await client.cancel(JobHandle(tenant, job), reason)

    asyncio.run(go())
    console.print(f"cancel requested for {job} of {tenant}")
