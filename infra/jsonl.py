"""JSON-lines files that a long-running process appends to and another process reads.

``append_lines`` appends lines to a file; a file above ``max_bytes`` is moved to ``<name>.1``
first (the one before is dropped), so a service that runs for days keeps a bounded history.
``read_rows`` decodes every line of every such file of a directory (``.1`` files included); a
line that does not decode (a process killed mid-write) is skipped. The device timeline
(``backbone/timeline.py``) and the step trace (``consumers/step_trace.py``) are written this way.

Only the standard library.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["append_lines", "read_rows"]


def append_lines(path: Path, lines: Iterable[str], max_bytes: int) -> int:
    """Appends ``lines`` to ``path`` (made with its folder when missing); returns how many."""
    lines = list(lines)
    if not lines:
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size > max_bytes:
        path.replace(path.with_name(path.name + ".1"))
    with path.open("a") as f:
        f.write("\n".join(lines) + "\n")
    return len(lines)


def read_rows(directory: Path, suffix: str) -> Iterator[Any]:
    """Each decoded line of the files in ``directory`` whose names contain ``suffix``, file by file."""
    for path in sorted(Path(directory).glob(f"*{suffix}*")):
        for line in path.read_text().splitlines():
            try:
                yield json.loads(line)
            except ValueError:
                continue
