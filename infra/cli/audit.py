"""``joynexus audit verify``: prove a tenant's policy versions from the event log (consumers/audit.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer
from rich.table import Table

from infra.cli.common import fail, load_settings, out
from infra.errors import JoynexusError

app = typer.Typer(no_args_is_help=True)
audit_app = typer.Typer(no_args_is_help=True, help="Re-derive policies from the log and compare.")
app.add_typer(audit_app, name="audit")


@audit_app.command("verify")
def verify(
    tenant: Annotated[str, typer.Option("--tenant", "-t", help="Tenant to audit.")],
    version: Annotated[int | None, typer.Option("--version", help="Only this version.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per version.")] = False,
) -> None:
    """Fold TENANT's logged feature batches from each job's initial checkpoint, as the optimizer
    does, and compare every version with the policy store bit for bit; exit 1 on any mismatch."""
    from backbone.info import set_torch_threads
    from consumers.audit import audit_tenant

    settings = load_settings()
    set_torch_threads(settings.torch_threads)  # the optimizer's thread count: same kernels, same bits
    try:
        results = asyncio.run(audit_tenant(settings, tenant, version))
    except (JoynexusError, ValueError) as exc:
        fail(exc)
    if as_json:
        for r in results:
            print(json.dumps({"version": r.version, "job": r.job_id, "how": r.how, "ok": r.ok,
                              "detail": r.detail, "features_offsets": r.offsets,
                              "duplicates_skipped": r.duplicates}))
    else:
        table = Table("version", "job", "how", "features offsets", "batches", "verdict",
                      title=f"audit of tenant {tenant}")
        for r in results:
            verdict = "[green]ok[/green]" if r.ok else f"[red]FAILED[/red] {r.detail}"
            table.add_row(str(r.version), r.job_id or "-", r.how, r.offset_range, str(len(r.offsets)),
                          verdict if not r.ok else f"{verdict} ({r.detail})")
        out.print(table)
    failed = [r.version for r in results if not r.ok]
    if failed or not results:
        out.print(f"audit FAILED for version(s) {failed}" if failed else "no versions to audit")
        raise typer.Exit(1)
    out.print(f"audit passed: {len(results)} version(s) of {tenant} re-derived from the log, bit for bit")
