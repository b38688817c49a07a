"""Running the service: ``joynexus up``, ``run ROLE``, ``demo``."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from infra.cli.common import console, fail, load_settings
from infra.errors import JoynexusError

app = typer.Typer(no_args_is_help=True)


@app.command()
def up(
    roles: Annotated[str, typer.Option(help="Comma-separated roles to host (default: all).")] = "",
) -> None:
    """Run every role (or the named ones) under one supervisor, one log stream, until Ctrl-C."""
    from infra.runtime.supervisor import ROLES, run_roles

    settings = load_settings()
    names = tuple(r.strip() for r in roles.split(",") if r.strip()) or ROLES
    try:
        asyncio.run(run_roles(settings, names))
    except (JoynexusError, ValueError) as exc:
        fail(exc)


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
    settings = load_settings()
    if role == "env":
        from consumers.env import run_env_role

        asyncio.run(run_env_role(settings, worker_id, step_timeout, group or "env", tenants))
        return
    from infra.runtime.supervisor import ROLES, run_roles

    if role not in ROLES:
        raise typer.BadParameter(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    asyncio.run(run_roles(settings, (role,)))


@app.command()
def demo(
    quick: Annotated[bool, typer.Option("--quick", help="A smoke-test sized run (about 2 minutes).")] = False,
    maniskill: Annotated[bool, typer.Option(help="Include the ManiSkill PushCube tenant.")] = True,
) -> None:
    """The paper's scenario: 3 RL tenants + 1 SFT tenant on one shared backbone, then evaluations."""
    from infra.runtime.demo import run_demo

    settings = load_settings()
    try:
        asyncio.run(run_demo(settings, quick=quick, maniskill=maniskill, console=console))
    except JoynexusError as exc:
        fail(exc)
