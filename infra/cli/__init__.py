"""The ``joynexus`` command line, one module per command group.

    joynexus broker fetch|up [--secure]|down|...  the local Kafka broker            (broker.py)
    joynexus tenant create|delete|list            tenants of a secure broker        (tenants.py)
    joynexus topics ensure|list|delete            topic provisioning                (bus.py)
    joynexus replay TOPIC [window] [--json]       read events without touching any group
    joynexus schemas                              schema names and fingerprints
    joynexus roundtrip                            a short event round trip through the broker
    joynexus backbone presets|build               the shared backbone               (assets.py)
    joynexus dataset generate|feed|upload         offline demonstrations for SFT
    joynexus up [--roles] [--scale] | run KIND    the service as processes          (service.py)
    joynexus demo [--quick] [--verbose]           3 RL + 1 SFT tenants, then evaluations
    joynexus health [--json]                      every role instance's heartbeat   (health.py)
    joynexus submit FILE [-f] | status | cancel   tenants' jobs                     (jobs.py)
    joynexus audit verify --tenant T [--version N]  re-derive policies from the log  (audit.py)
    joynexus metering | usage [TENANT] [--window 1h]  the faust metering role, its totals (usage.py)
    joynexus report RUN_DIR [-o report.html]      a run as one HTML page            (report.py)
"""

from __future__ import annotations

import typer

from infra.cli import assets, audit, broker, bus, health, jobs, report, service, tenants, usage

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True, help="joynexus: multi-tenant VLA post-training on Kafka.")
app.add_typer(broker.app, name="broker")
# their commands and sub-groups sit at the top level
for group in (bus, assets, service, health, jobs, tenants, audit, usage, report):
    app.registered_commands.extend(group.app.registered_commands)
    app.registered_groups.extend(group.app.registered_groups)
