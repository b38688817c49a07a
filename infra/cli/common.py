"""What every command group shares: settings with logging configured, the consoles, failing cleanly."""

from __future__ import annotations

import asyncio
import sys

import typer
from rich.console import Console

from infra.errors import JoynexusError
from infra.logging import configure_logging
from infra.settings import Settings, get_settings

__all__ = ["console", "fail", "load_settings", "out", "print_lines"]

console = Console(stderr=True)
# Tables go to stdout; when piped, rich would squeeze them to 80 columns.
out = Console(width=None if sys.stdout.isatty() else 160)


def load_settings() -> Settings:
    current = get_settings()
    configure_logging(current.log_level, current.log_format)
    return current


def fail(exc: Exception) -> None:
    console.print(f"[red]error:[/red] {exc}")
    raise typer.Exit(1)


def print_lines(lines, prefix: str = "") -> None:
    """Run a coroutine that returns names, print one per line; joynexus errors exit 1."""
    try:
        names = asyncio.run(lines)
    except JoynexusError as exc:
        fail(exc)
    for name in names:
        print(f"{prefix}{name}")
