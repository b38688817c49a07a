"""Running the service: ``joynexus up``, ``run KIND``, ``demo``."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from infra.cli.common import console, fail, load_settings
from infra.errors import JoynexusError

app = typer.Typer(no_args_is_help=True)


@app.command()
def up(
    roles: Annotated[str, typer.Option(help="Comma-separated process kinds to run on this machine "
                                            "(default: device, master, env, optimizer, rollout, "
                                            "evaluator, health).")] = "",
    scale: Annotated[str, typer.Option(help="Instances per kind, e.g. env=3,optimizer=2 (default 1; env "
                                            "starts at JOYNEXUS_ENV_MIN).")] = "",
    autoscale: Annotated[bool, typer.Option(help="Scale env workers between JOYNEXUS_ENV_MIN and "
                                                 "JOYNEXUS_ENV_MAX from their backlog.")] = True,
    cpus: Annotated[str, typer.Option(help="CPU affinity per kind, e.g. device=0,rest=1 (rest: every kind "
                                           "not named; CPUS like 1, 1-3, 0+2). Default: "
                                           "JOYNEXUS_CPU_AFFINITY, else no pinning.")] = "",
) -> None:
    """Start and supervise one process per role instance until Ctrl-C / SIGTERM; logs go to
    JOYNEXUS_HOME/logs/<instance>.log. A second machine runs `up --roles env` against the same broker."""
    from infra.runtime.supervisor import DEFAULT_KINDS, parse_cpus, parse_scale, run_up

    settings = load_settings()
    kinds = tuple(r.strip() for r in roles.split(",") if r.strip()) or DEFAULT_KINDS
    try:
        if cpus:  # the children read it from the settings the supervisor passes them
            settings = settings.model_copy(update={"cpu_affinity": parse_cpus(cpus)})
        asyncio.run(run_up(settings, kinds, parse_scale(scale), autoscale))
    except JoynexusError as exc:
        fail(exc)


@app.command()
def run(
    kind: Annotated[str, typer.Argument(help="device (inference + backbone-train), master, env, inference, "
                                             "backbone-train, optimizer, rollout, evaluator, health")],
    instance: Annotated[str | None, typer.Option(help="Instance id (default: KIND-<pid>.<host>).")] = None,
    restarts: Annotated[int, typer.Option(help="How often the supervisor restarted this instance.")] = 0,
    parent_pid: Annotated[int | None, typer.Option(help="The supervisor's pid: stop when it dies.")] = None,
    step_timeout: Annotated[float, typer.Option(help="env: watchdog seconds per simulator call.")] = 30.0,
    group: Annotated[str, typer.Option(help="env: consumer group (a pool of workers).")] = "env",
    tenants: Annotated[str, typer.Option(help="env: regex of the tenant ids to serve.")] = r"[^.]+",
) -> None:
    """Run one process kind in the foreground until Ctrl-C / SIGTERM (what `up` starts per instance)."""
    import os
    import socket

    from infra.runtime.affinity import pin_process

    settings = load_settings()
    try:  # first: before torch or the Kafka clients start threads of their own
        pin_process(settings.cpu_affinity, kind)
    except JoynexusError as exc:
        fail(exc)
    from infra.runtime.host import run_instance

    env_options = {"step_timeout_s": step_timeout, "group_id": group, "tenants": tenants}
    try:
        asyncio.run(run_instance(settings, kind, instance or f"{kind}-{os.getpid()}.{socket.gethostname()}",
                                 restarts, env_options if kind == "env" else None, parent_pid))
    except JoynexusError as exc:
        fail(exc)


@app.command()
def demo(
    quick: Annotated[bool, typer.Option("--quick", help="A smoke-test sized run (minutes).")] = False,
    maniskill: Annotated[bool, typer.Option(help="Include the ManiSkill PushCube tenant.")] = True,
    verbose: Annotated[bool, typer.Option("--verbose", help="The demo's JSON log lines on stderr too "
                                                            "(they always go to RUN_DIR/demo.log).")] = False,
) -> None:
    """The paper's scenario: 3 RL tenants + 1 SFT tenant on one shared backbone, then evaluations."""
    import torch

    from infra.runtime.demo import demo_backbone, run_demo

    chosen = load_settings()
    settings = demo_backbone(chosen, gpu=torch.cuda.is_available())
    if settings.backbone != chosen.backbone:
        console.print(f"no GPU and no backbone chosen: the demo runs the `{settings.backbone}` preset "
                      "(JOYNEXUS_BACKBONE=small or mini-pretrained to choose another)")
    try:
        asyncio.run(run_demo(settings, quick=quick, maniskill=maniskill, console=console, verbose=verbose))
    except JoynexusError as exc:
        fail(exc)
    except (KeyboardInterrupt, asyncio.CancelledError):
        console.print("demo stopped; its processes are stopped too")
        raise typer.Exit(130) from None
