"""structlog, configured once: JSON lines on stderr (or into a file), with context bound per record.

Roles bind ``role`` once and ``tenant``/``topic``/``partition``/``offset`` per
record (``structlog.contextvars.bound_contextvars``), so every line a handler
logs says which record it was working on.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import structlog

__all__ = ["configure_logging", "get_logger"]

_configured = False


class RepeatFilter(logging.Filter):
    """Lets an identical library message through at most once per ``interval_s``.

    While a broker is down, aiokafka's fetcher retries metadata without backoff
    and logs "Unable to update metadata" thousands of times a second (measured:
    14,099 lines in a 2 s outage). The retries are aiokafka's; the flood of
    identical lines is not useful, so repeats are folded into a count.
    """

    def __init__(self, interval_s: float = 5.0):
        super().__init__()
        self.interval_s = interval_s
        self._last: dict[tuple[str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.getMessage())
        now = time.monotonic()
        last, suppressed = self._last.get(key, (float("-inf"), 0))
        if now - last < self.interval_s:
            self._last[key] = (last, suppressed + 1)
            return False
        if suppressed:
            record.suppressed_repeats = suppressed
        self._last[key] = (now, 0)
        if len(self._last) > 10_000:  # messages with ever-changing text must not leak memory
            self._last.clear()
        return True


class _Lines:
    """The stream logs are written to: stderr, a file, or both.

    stderr is looked up at every write, not captured once, so a live display that
    redirects ``sys.stderr`` (rich's ``Live``) prints log lines above itself."""

    def __init__(self, path: Path | None, stderr: bool):
        self.file = open(path, "a", buffering=1) if path is not None else None  # noqa: SIM115 - process-long
        self.stderr = stderr

    def write(self, text: str) -> int:
        if self.file is not None:
            self.file.write(text)
        if self.stderr:
            sys.stderr.write(text)
        return len(text)

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()
        if self.stderr:
            sys.stderr.flush()


_stream: _Lines | None = None


def configure_logging(level: str = "INFO", fmt: str = "json", file: Path | None = None,
                      stderr: bool = True) -> None:
    """(Re)configure logging for the process; safe to call again with new values.

    Lines go to stderr, or to ``file`` (appended), or to both (``stderr=True`` with a file)."""
    global _configured, _stream
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    if _stream is not None and _stream.file is not None:
        _stream.file.close()
    _stream = _Lines(file, stderr or file is None)
    renderer = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=file is None and sys.stderr.isatty())
    )
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=_stream),
        # Loggers are module globals created at import; not caching them lets a
        # later configure_logging (the CLI's, a test's) take effect everywhere.
        cache_logger_on_first_use=False,
    )
    # aiokafka and other libraries log through the standard library: render
    # their records with the same processors, so the stream stays one JSON per line.
    handler = logging.StreamHandler(_stream)
    handler.addFilter(RepeatFilter())
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name,
                           structlog.stdlib.ExtraAdder(("suppressed_repeats",)),
                           structlog.processors.format_exc_info],
    ))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric, logging.WARNING))
    _configured = True


def get_logger(name: str | None = None, **bound: object) -> structlog.typing.FilteringBoundLogger:
    """A lazy logger: it renders with whatever configuration is current when it logs."""
    if not _configured:
        configure_logging()
    if name:
        bound = {"component": name, **bound}
    return structlog.get_logger(**bound)
