"""``joynexus report RUN_DIR [-o report.html]``: a run directory as one self-contained HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infra.cli.common import console, load_settings

app = typer.Typer(no_args_is_help=True)


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (demo or benchmark).")],
    output: Annotated[Path | None,
                      typer.Option("-o", "--output", help="Default: RUN_DIR/report.html.")] = None,
) -> None:
    """Curves per tenant, the device timeline by tenant, group sizes, shared vs isolated bars."""
    from infra.runtime.report import write_report

    load_settings()
    if not run_dir.is_dir():
        console.print(f"[red]error:[/red] {run_dir} is not a directory")
        raise typer.Exit(1)
    console.print(f"report: {write_report(run_dir, output)}")
