"""``joynexus tenant create|delete|list``: tenants of a secure broker (needs the super user)."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer
from rich.table import Table

from infra.cli.common import console, fail, load_settings, out
from infra.errors import JoynexusError

app = typer.Typer(no_args_is_help=True)
tenant_app = typer.Typer(no_args_is_help=True, help="Tenants: credentials, topics, ACLs, quotas.")
app.add_typer(tenant_app, name="tenant")


def _run(coro):
    try:
        return asyncio.run(coro)
    except JoynexusError as exc:
        fail(exc)


@tenant_app.command("create")
def tenant_create(
    tenant: Annotated[str, typer.Argument(help="Tenant id (also its SCRAM user name).")],
    rotate: Annotated[bool, typer.Option("--rotate", help="Give an existing tenant a new password.")] = False,
) -> None:
    """SCRAM credentials, topics, ACLs and quotas for TENANT; prints its credentials ONCE."""
    from infra.runtime.tenancy import TenantManager

    settings = load_settings()

    async def go() -> str:
        async with TenantManager(settings) as tm:
            return await tm.create(tenant, rotate=rotate)

    password = _run(go())
    console.print(f"tenant [green]{tenant}[/green] ready; its credentials are shown this once:")
    # stdout carries only the lines a tenant sources, so `> alice.env` captures exactly them.
    print(f"JOYNEXUS_SECURITY_PROTOCOL=SASL_PLAINTEXT\nJOYNEXUS_SASL_MECHANISM={settings.sasl_mechanism}\n"
          f"JOYNEXUS_SASL_USERNAME={tenant}\nJOYNEXUS_SASL_PASSWORD={password}")


@tenant_app.command("delete")
def tenant_delete(
    tenant: Annotated[str, typer.Argument(help="Tenant id.")],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
) -> None:
    """Remove TENANT's topics, ACLs, credentials, quotas, checkpoints, tensors and datasets."""
    from infra.runtime.tenancy import TenantManager

    settings = load_settings()
    if not yes:
        typer.confirm(f"delete tenant {tenant} and its whole history?", abort=True)

    async def go() -> dict[str, int]:
        async with TenantManager(settings) as tm:
            return await tm.delete(tenant)

    gone = _run(go())
    console.print(f"tenant {tenant} deleted: " + ", ".join(f"{k} {v}" for k, v in gone.items()))


@tenant_app.command("list")
def tenant_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Tenants with their credentials, topic and ACL counts and quotas."""
    from infra.runtime.tenancy import TenantManager

    settings = load_settings()

    async def go():
        async with TenantManager(settings) as tm:
            return await tm.list()

    infos = _run(go())
    if as_json:
        for info in infos:
            print(json.dumps({"tenant": info.tenant, "credentials": info.has_credentials,
                              "topics": info.topics, "acls": info.acls, "quotas": info.quotas}))
        return
    table = Table("tenant", "credentials", "topics", "acls", "produce B/s", "fetch B/s")
    for info in infos:
        table.add_row(info.tenant, "yes" if info.has_credentials else "no", str(len(info.topics)),
                      str(len(info.acls)), f"{info.quotas.get('producer_byte_rate', 0):.0f}",
                      f"{info.quotas.get('consumer_byte_rate', 0):.0f}")
    out.print(table)
