"""The device timeline: one record per backbone forward (queue, start, end, the tenant of each row).

The device gate (``backbone/gate.py``) appends a ``ForwardRecord`` for every
forward it admits; ``backbone/grouped.py`` tells it whose rows the forward
computed. This is the raw material of the report's timeline (tenants filling
each other's idle gaps), its group-size histogram and the per-queue busy
fractions, and of the benchmarks' projection model.

Times are seconds on ``time.monotonic()`` relative to the log's own origin
(``ForwardLog.origin``), so records of one process are comparable with each
other and never with another process's. The log keeps the newest
``maxlen`` records (a service runs for days); ``dropped`` counts the rest.

On disk (``forwards.json``, written by ``dump``, read by ``load``)::

    {"format": "joynexus.forwards.v1", "origin_unix": <float, wall clock at origin>,
     "dropped": <int>, "columns": ["queue", "start_s", "end_s", "tenants"],
     "forwards": [["inference", 0.0123, 0.0150, ["alice", "alice", "bob"]], ...]}

Across processes (the device host is its own process; the demo that writes the
report is another), the owner of the gate appends what is new to a JSON-lines file
with ``export_jsonl``: one forward a line, times as Unix seconds,
``["inference", 1764500000.0123, 1764500000.0150, ["alice", "bob"]]``; a file above
``max_bytes`` is moved to ``<name>.1`` (the one before is dropped), so a service that
runs for days keeps a bounded history. ``read_window`` collects the forwards of a
time window from every such file of a directory (several device hosts, restarts).

Pure compute bookkeeping: no Kafka, no torch.
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from infra.jsonl import append_lines, read_rows
from infra.stats import nearest_rank

__all__ = [
    "FORMAT", "JSONL_SUFFIX", "ForwardLog", "ForwardRecord", "group_sizes", "load_forwards", "read_window",
]

FORMAT = "joynexus.forwards.v1"
JSONL_SUFFIX = ".forwards.jsonl"


@dataclass(frozen=True, slots=True)
class ForwardRecord:
    queue: str  # "inference" or "train"
    start_s: float  # seconds since the log's origin
    end_s: float
    tenants: tuple[str, ...]  # one entry per row of the forward (empty when the caller did not say)

    @property
    def busy_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def rows(self) -> int:
        return len(self.tenants)


def group_sizes(records: Iterable[ForwardRecord], queue: str) -> dict[str, float]:
    """How full one queue's forwards were: rows per forward (mean, p50, p90, max) and the share of
    forwards that computed more than one tenant's rows. Percentiles are nearest-rank."""
    sizes, shared = [], 0
    for r in records:
        if r.queue == queue and r.rows:
            sizes.append(r.rows)
            shared += len(set(r.tenants)) > 1
    if not sizes:
        return {"forwards": 0.0}
    sizes.sort()
    return {"forwards": float(len(sizes)), "mean_rows": sum(sizes) / len(sizes),
            "p50_rows": float(nearest_rank(sizes, 0.5)), "p90_rows": float(nearest_rank(sizes, 0.9)),
            "max_rows": float(sizes[-1]), "multi_tenant_share": shared / len(sizes)}


class ForwardLog:
    """Bounded, append-only list of the forwards of one device."""

    def __init__(self, maxlen: int = 100_000, clock=time.monotonic) -> None:
        # measured ~185 bytes a record (3 rows, interned tenant ids): the newest 100k take ~18 MB
        self._clock = clock
        self.origin = clock()
        self.origin_unix = time.time()
        self.records: deque[ForwardRecord] = deque(maxlen=maxlen)
        self.dropped = 0
        self.added = 0  # records ever added
        self._exported = 0  # records ever written by export_jsonl

    def now(self) -> float:
        """Seconds since the origin, on the log's clock."""
        return self._clock() - self.origin

    def add(self, queue: str, start_s: float, end_s: float, tenants: Sequence[str] = ()) -> None:
        if len(self.records) == self.records.maxlen:
            self.dropped += 1
        self.added += 1
        self.records.append(ForwardRecord(queue, start_s, end_s, tuple(sys.intern(t) for t in tenants)))

    def since(self, start_s: float) -> list[ForwardRecord]:
        """Records that started at or after ``start_s`` (a benchmark's window)."""
        return [r for r in self.records if r.start_s >= start_s]

    def to_json(self, records: Iterable[ForwardRecord] | None = None,
                origin_unix: float | None = None) -> dict:
        """``records`` (default: this log's) whose times are relative to ``origin_unix`` (default:
        this log's origin): another clock's records must say which wall time their zero was."""
        rows = self.records if records is None else records
        return {
            "format": FORMAT,
            "origin_unix": self.origin_unix if origin_unix is None else origin_unix,
            "dropped": self.dropped,
            "columns": ["queue", "start_s", "end_s", "tenants"],
            "forwards": [[r.queue, round(r.start_s, 6), round(r.end_s, 6), list(r.tenants)] for r in rows],
        }

    def dump(self, path: Path, records: Iterable[ForwardRecord] | None = None,
             origin_unix: float | None = None) -> Path:
        path.write_text(json.dumps(self.to_json(records, origin_unix), separators=(",", ":")))
        return path


    def export_jsonl(self, path: Path, max_bytes: int = 64 * 2**20) -> int:
        """Appends the records added since the last export to ``path`` (Unix times); returns how many.
        Records dropped from the bounded log before they were exported are skipped."""
        new = min(self.added - self._exported, len(self.records))
        self._exported = self.added
        if new <= 0:
            return 0
        o = self.origin_unix
        return append_lines(path, (json.dumps([r.queue, round(o + r.start_s, 6), round(o + r.end_s, 6),
                                               list(r.tenants)], separators=(",", ":"))
                                   for r in list(self.records)[-new:]), max_bytes)


def read_window(directory: Path, since_unix: float, until_unix: float | None = None) -> list[ForwardRecord]:
    """Forwards that started in [since, until] in every exported file of ``directory``, with times
    relative to ``since_unix``, in start order. A torn last line (a process killed mid-write) is skipped."""
    out = []
    for row in read_rows(directory, JSONL_SUFFIX):
        try:
            queue, start, end, tenants = row
        except (ValueError, TypeError):
            continue
        if start >= since_unix and (until_unix is None or start <= until_unix):
            out.append(ForwardRecord(queue, start - since_unix, end - since_unix, tuple(tenants)))
    return sorted(out, key=lambda r: r.start_s)


def load_forwards(path: Path) -> list[ForwardRecord]:
    """The records of a ``forwards.json``; a file of another format is refused with its name."""
    data = json.loads(Path(path).read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file (format={data.get('format')!r})")
    return [ForwardRecord(q, float(s), float(e), tuple(t)) for q, s, e, t in data["forwards"]]
