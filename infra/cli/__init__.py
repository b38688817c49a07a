"""The ``joynexus`` command line, one module per command group.

    joynexus broker fetch|up|down|status|logs     the local Kafka broker            (broker.py)
    joynexus topics ensure|list|delete            topic provisioning                (bus.py)
    joynexus replay TOPIC [window] [--json]       read events without touching any group
    joynexus schemas                              schema names and fingerprints
    joynexus roundtrip                            a short event round trip through the broker
    joynexus backbone presets|build               the shared backbone               (assets.py)
    joynexus dataset generate|feed                offline demonstrations for SFT
    joynexus up [--roles] [--scale] | run KIND    the service as processes          (service.py)
    joynexus demo [--quick]                       3 RL + 1 SFT tenants, then evaluations
    joynexus health [--json]                      every role instance's heartbeat   (health.py)
    joynexus submit FILE [-f] | status | cancel   tenants' jobs                     (jobs.py)
    joynexus report RUN_DIR [-o report.html]      a run as one HTML page            (report.py)
"""

from __future__ import annotations

import typer

from infra.cli import assets, broker, bus, health, jobs, report, service

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True, help="joynexus: multi-tenant VLA post-training on Kafka.")
app.add_typer(broker.app, name="broker")
for group in (bus, assets, service, health, jobs, report):  # commands and sub-groups at the top level
    app.registered_commands.extend(group.app.registered_commands)
    app.registered_groups.extend(group.app.registered_groups)
