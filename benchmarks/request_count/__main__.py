"""``python -m benchmarks.request_count DIR``: the Kafka requests that ``sitecustomize.py`` counted
in DIR, added up per process kind (the role after ``run``, ``metering``, or the script's name)."""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

__all__ = ["by_kind", "main"]


def _kind(argv: list[str]) -> str:
    if "run" in argv[:-1]:
        return argv[argv.index("run") + 1]
    if "metering" in argv:
        return "metering"
    return Path(argv[0]).stem if argv else "?"


def by_kind(folder: Path) -> dict[str, collections.Counter[str]]:
    kinds: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for path in sorted(folder.glob("*.json")):
        dump = json.loads(path.read_text())
        kinds[_kind(dump["argv"])].update(dump["counts"])
    return dict(kinds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    kinds = by_kind(args.folder)
    if not kinds:
        parser.error(f"no counts in {args.folder} (was JOYNEXUS_REQUEST_COUNT_DIR set to it?)")
    table = Table(title=f"Kafka requests per process kind ({args.folder})")
    for column in ("kind", "requests", "produce", "fetch", "records produced", "records / produce",
                   "records by stream"):
        table.add_column(column)
    for kind, c in sorted(kinds.items()):
        requests = sum(n for k, n in c.items() if k.startswith("request "))
        produce, fetch = c["request ProduceRequest"], c["request FetchRequest"]
        streams = {k.removeprefix("records "): n for k, n in c.items() if k.startswith("records ")}
        records = sum(streams.values())
        table.add_row(kind, f"{requests:,}", f"{produce:,}", f"{fetch:,}", f"{records:,}",
                      f"{records / produce:.2f}" if produce else "-",
                      ", ".join(f"{s} {n:,}" for s, n in sorted(streams.items(), key=lambda i: -i[1])))
    Console().print(table)


if __name__ == "__main__":
    main()
