"""systemd integration in pure Python: sd_notify, the watchdog, socket activation.

Nothing happens when the variables are absent, so the same daemon runs by
hand, under launchd, or under systemd with ``Type=notify`` or
``Type=notify-reload``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping

import structlog

log = structlog.get_logger("capd.systemd")

SD_LISTEN_FDS_START = 3


class Notifier:
    """Sends sd_notify datagrams to ``$NOTIFY_SOCKET`` (abstract names start with ``@``)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self._address: str | bytes | None = None
        if address.startswith("@"):
            self._address = b"\0" + address[1:].encode()
        elif address.startswith("/"):
            self._address = address
        self._sock: socket.socket | None = None
        self.sent: list[str] = []

    @property
    def enabled(self) -> bool:
        """Whether a notify socket was given."""
        return self._address is not None

    def notify(self, *fields: str) -> None:
        """Send ``fields`` as one datagram (``READY=1``, ``STATUS=…``); never raises."""
        if self._address is None:
            return
        message = "\n".join(fields)
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(message.encode(), self._address)
            self.sent.append(message)
        except OSError as exc:
            log.warning("sd_notify_failed", error=str(exc), message=message)

    def ready(self, status: str) -> None:
        """The daemon serves: ``READY=1`` with a status line."""
        self.notify("READY=1", f"STATUS={status}")

    def reloading(self, monotonic_usec: int | None = None) -> None:
        """A reload starts (systemd's notify-reload protocol)."""
        usec = monotonic_usec if monotonic_usec is not None else time.clock_gettime_ns(
            time.CLOCK_MONOTONIC) // 1000
        self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}", "STATUS=reloading")

    def stopping(self) -> None:
        """Shutdown begins."""
        self.notify("STOPPING=1", "STATUS=draining")

    def close(self) -> None:
        """Close the datagram socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def watchdog_interval_s(environ: Mapping[str, str] | None = None) -> float | None:
    """Half of ``$WATCHDOG_USEC`` in seconds, when the watchdog is meant for this process."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2 / 1e6 if value > 0 else None


async def run_watchdog(
    notifier: Notifier,
    interval_s: float,
    stop: asyncio.Event,
    *,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> int:
    """Send ``WATCHDOG=1`` every ``interval_s`` from the event loop itself, until ``stop``.

    A stuck loop stops the pings, and systemd restarts the daemon. Returns
    how many pings were sent. ``sleep`` is injectable for tests.
    """
    pings = 0
    while not stop.is_set():
        notifier.notify("WATCHDOG=1")
        pings += 1
        await (sleep(interval_s) if sleep is not None else _wait(stop, interval_s))
    return pings


async def report_status(notifier: Notifier, status_line: Callable[[int | None], str],
                        queued: Callable[[], Awaitable[int | None]], stop: asyncio.Event,
                        interval_s: float = 2.0) -> None:
    """Send ``STATUS=`` whenever the status line changes (checked every ``interval_s``),
    until ``stop``; ``queued`` counts the jobs waiting (None: not known)."""
    last = ""
    while not stop.is_set():
        line = status_line(await queued())
        if line != last:
            notifier.notify(f"STATUS={line}")
            last = line
        await _wait(stop, interval_s)


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    """Until ``stop`` is set, or ``seconds`` at most."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()


def inherited_socket(environ: Mapping[str, str] | None = None) -> socket.socket | None:
    """The listening Unix socket handed over by socket activation, if any.

    Uses ``$LISTEN_FDS``/``$LISTEN_PID`` (and ``$LISTEN_FDNAMES``: the fd named
    ``api`` when there are several). The variables are removed so that
    children do not inherit them.
    """
    env = os.environ if environ is None else environ
    try:
        count = int(env.get("LISTEN_FDS", "0"))
        pid = int(env.get("LISTEN_PID", "0"))
    except ValueError:
        return None
    if count < 1 or pid != os.getpid():
        return None
    names = env.get("LISTEN_FDNAMES", "").split(":") if env.get("LISTEN_FDNAMES") else []
    index = names.index("api") if "api" in names else 0
    if env is os.environ:
        for key in ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
            os.environ.pop(key, None)
    sock = socket.socket(fileno=SD_LISTEN_FDS_START + index)
    if sock.family != socket.AF_UNIX:
        sock.detach()
        return None
    sock.setblocking(False)
    return sock
