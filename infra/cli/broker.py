"""``joynexus broker``: the local single-node Apache Kafka broker."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from infra.broker import LocalBroker
from infra.cli.common import console, fail, load_settings
from infra.errors import JoynexusError
from infra.settings import get_settings

app = typer.Typer(no_args_is_help=True, help="The local single-node Apache Kafka broker.")



@app.command("fetch")
def broker_fetch() -> None:
    """Resolve the Kafka jars from Maven Central into the cache (done by `up` too)."""
    try:
        libs = LocalBroker(load_settings()).fetch()
    except JoynexusError as exc:
        fail(exc)
    console.print(f"Kafka {get_settings().kafka_version} jars in {libs}")


@app.command("up")
def broker_up(
    secure: Annotated[bool, typer.Option(
        "--secure", help="SASL/SCRAM listeners, ACLs (StandardAuthorizer), a service principal. "
        "Fixed per work directory when its storage is formatted.")] = False,
) -> None:
    """Fetch (once), format (once) and start the broker; wait until it answers."""
    settings = load_settings()
    if secure:
        settings = settings.model_copy(update={"broker_secure": True})
    broker = LocalBroker(settings)
    try:
        status = broker.up()
    except JoynexusError as exc:
        fail(exc)
    console.print(f"broker [green]ready[/green] on {status.bootstrap} "
                  f"(Kafka {status.version}, pid {status.pid}, data {status.data_dir})")
    if broker.secure:  # the path only: passwords are never printed or logged here
        console.print(f"secure: credentials of the service and the super user in {broker.secrets_file} "
                      f"(mode 600); load them with  set -a; . {broker.secrets_file}; set +a")


@app.command("down")
def broker_down() -> None:
    """Stop the broker this work directory started (never another process)."""
    stopped = LocalBroker(load_settings()).down()
    console.print("broker stopped" if stopped else "no broker of ours was running")


@app.command("status")
def broker_status() -> None:
    """Print whether the broker runs and answers; exit 1 when it does not."""
    status = LocalBroker(load_settings()).status()
    print(json.dumps({"running": status.running, "ready": status.ready, "pid": status.pid,
                      "bootstrap": status.bootstrap, "version": status.version,
                      "data_dir": str(status.data_dir), "log_file": str(status.log_file)}))
    raise typer.Exit(0 if status.ready else 1)


@app.command("logs")
def broker_logs(lines: Annotated[int, typer.Option("-n", "--lines")] = 100) -> None:
    """Print the last lines of the broker's log."""
    print(LocalBroker(load_settings()).logs(lines))


@app.command("grant-service")
def broker_grant_service() -> None:
    """On a secure broker that `broker up --secure` did not start (docker compose --profile
    secure, a managed cluster): create or re-key the service principal and its ACLs. Needs
    JOYNEXUS_ADMIN_PASSWORD; uses JOYNEXUS_SASL_PASSWORD as the service's password, or makes one
    and prints it once."""
    import asyncio

    from infra.runtime.tenancy import TenantManager, new_password

    settings = load_settings()
    given = settings.sasl_password.get_secret_value() if settings.sasl_password else None
    password = given or new_password()

    async def go() -> None:
        async with TenantManager(settings) as tm:
            await tm.grant_service(password)

    try:
        asyncio.run(go())
    except JoynexusError as exc:
        fail(exc)
    console.print(f"service principal [green]{settings.service_username}[/green] ready")
    if not given:  # only a password made here is shown, and only on stdout
        print(f"JOYNEXUS_SECURITY_PROTOCOL=SASL_PLAINTEXT\nJOYNEXUS_SASL_USERNAME={settings.service_username}"
              f"\nJOYNEXUS_SASL_PASSWORD={password}")

