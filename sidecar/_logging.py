"""structlog set-up: JSON lines on stdout (journald takes them).

Timestamps are UTC epoch seconds, like every time field capd exposes. Lines
are rendered with orjson and written as bytes: one line per call is on the hot
path, so the cheap renderer matters.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import sys
import time
from typing import Any, BinaryIO, TextIO

import orjson
import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


class CoalescingWriter:
    """A file for structlog: lines written in one event-loop turn go out in one write.

    ``flush()`` inside a running loop schedules the real write for the end of
    the current turn (``call_soon``); outside a loop it writes at once. Under
    load many call lines share one system call instead of one each.
    """

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._pending: list[bytes] = []
        self._scheduled = False
        atexit.register(self.drain)

    def write(self, data: bytes) -> int:
        """Queue ``data``."""
        self._pending.append(data)
        return len(data)

    def flush(self) -> None:
        """Write queued lines now, or at the end of this loop turn."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.drain()
            return
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self.drain)

    def drain(self) -> None:
        """Write every queued line and flush the underlying file."""
        self._scheduled = False
        pending, self._pending = self._pending, []
        if pending:
            self._raw.write(b"".join(pending))
            self._raw.flush()


def _dumps(event: object, **_kw: object) -> bytes:
    return orjson.dumps(event, default=repr)


class _CallEvents:
    """Where the per-call event goes: straight to the JSON writer, or through structlog.

    One call is one log line, so the line is on the dispatch hot path. In JSON
    mode it is rendered here with the same keys structlog's chain would give it
    (the fields, ``event``, ``level``, ``timestamp``), skipping the processor
    chain; in console mode, or before logging is configured, structlog renders it.
    """

    writer: CoalescingWriter | None = None
    enabled = True
    fallback = structlog.get_logger("capd.gateway")


def log_call(fields: dict[str, Any]) -> None:
    """Log one ``call`` event at info level with ``fields`` (the dict is consumed)."""
    if not _CallEvents.enabled:
        return
    writer = _CallEvents.writer
    if writer is None:
        _CallEvents.fallback.info("call", **fields)
        return
    fields["event"] = "call"
    fields["level"] = "info"
    fields["timestamp"] = time.time()
    writer.write(orjson.dumps(fields, default=repr) + b"\n")
    writer.flush()


def configure_logging(level: str = "info", log_format: str = "auto",
                      stream: TextIO | None = None) -> CoalescingWriter | None:
    """Log at ``level`` and above: JSON lines, or a human console rendering.

    ``log_format`` is ``json``, ``console`` or ``auto`` (console when stdout
    is a terminal, JSON otherwise, as under journald).
    """
    out = stream or sys.stdout
    console = log_format == "console" or (log_format == "auto" and out.isatty())
    _CallEvents.enabled = _LEVELS[level] <= logging.INFO
    _CallEvents.writer = None
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
    ]
    if console:
        structlog.configure(
            processors=[*shared, structlog.processors.TimeStamper(fmt="iso", utc=True),
                        structlog.dev.ConsoleRenderer(colors=out.isatty())],
            wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
            logger_factory=structlog.PrintLoggerFactory(out),
            cache_logger_on_first_use=True,
        )
        return None
    writer = CoalescingWriter(out.buffer)
    _CallEvents.writer = writer
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.TimeStamper(fmt=None, utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=_dumps),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        # A CoalescingWriter is a binary file as far as BytesLogger uses one.
        logger_factory=structlog.BytesLoggerFactory(writer),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    return writer
