"""What the connections of one HTTP server share, and how one transport is paced.

- :class:`BufferBudget`: the bytes of requests all connections may hold at once;
- :class:`ServerState`: hooks, limits and the open set (connection cap, eviction);
- :class:`FlowControl`: reading and writing state of one transport.

The connection itself (parsing, ordering answers, timeouts) is ``_http.py``.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Generic, Literal, Protocol, TypeVar

import structlog

log = structlog.get_logger("capd.http")


class Evictable(Protocol):
    """A connection as an open set sees it: whether a request is in progress, and how to
    close it at once."""

    @property
    def busy(self) -> bool: ...
    def abort(self) -> None: ...


class Holder(Evictable, Protocol):
    """A connection, as the budget and the open set see it."""

    reserved_bytes: int

    def admitted(self) -> None: ...


class BufferBudget:
    """Bytes of requests (header block and body) the connections of one server may hold.

    A request claims its size when its headers are complete, before any of its body
    is parsed (its declared length, or ``max_body_bytes`` while a chunked body is
    read), and gives it back when the handler returns. A claim that does not fit the
    server's total, or its connection's share while that connection holds others,
    waits in line and its connection parses and reads nothing more until
    :meth:`_grant` calls ``conn.admitted()``. So what is claimed never passes
    ``limit_bytes``, except that a request is always let in when nothing is held (a
    body may be ``max_body_bytes`` whatever the budget). Besides the claims, each
    connection holds at most the header block it is reading. Claims short of server
    space are granted in arrival order, so a large one is not starved by small ones;
    one short of its connection's share waits for that connection's own answers
    without holding up the line.
    """

    def __init__(self, limit_bytes: int, per_connection_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.per_connection_bytes = per_connection_bytes
        self.used_bytes = 0
        self.peak_bytes = 0
        self._waiting: dict[Holder, int] = {}  # insertion order is the line
        self._line_blocked = False  # a waiter is short of server space: newcomers queue
        self._granting = False
        self._grant_again = False

    @property
    def waiting(self) -> int:
        """Connections whose claim waits."""
        return len(self._waiting)

    def fits(self, conn: Holder, n: int) -> bool:
        """Whether a claim of ``n`` bytes by ``conn`` would be granted now."""
        return not self._line_blocked and self._short_of(conn, n) is None

    def claim(self, conn: Holder, n: int) -> bool:
        """Take ``n`` bytes for ``conn`` now (True), or queue the claim (False)."""
        short = "line" if self._line_blocked and self._waiting else self._short_of(conn, n)
        if short is None:  # the usual case: the body of take(), spared a call
            conn.reserved_bytes += n
            self.used_bytes += n
            if self.used_bytes > self.peak_bytes:
                self.peak_bytes = self.used_bytes
            return True
        self._waiting[conn] = n
        if short == "server":
            self._line_blocked = True
        return False

    def add(self, conn: Holder, n: int) -> None:
        """Grow (or shrink) ``conn``'s waiting claim; grants wait for the next release."""
        self._waiting[conn] += n

    def take(self, conn: Holder, n: int) -> None:
        """Take ``n`` bytes for ``conn`` unconditionally (bytes it already holds)."""
        conn.reserved_bytes += n
        self.used_bytes += n
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)

    def release(self, conn: Holder, n: int) -> None:
        """Give back ``n`` of ``conn``'s bytes (never more than it holds) and grant what fits."""
        if n > conn.reserved_bytes:
            n = conn.reserved_bytes
        if n <= 0:
            return
        conn.reserved_bytes -= n
        self.used_bytes -= n
        if self._waiting:
            self._grant()

    def withdraw(self, conn: Holder) -> None:
        """Drop ``conn``'s waiting claim, if any."""
        if self._waiting.pop(conn, None) is not None:
            self._grant()  # also unblocks the line when its head was this one

    def forget(self, conn: Holder) -> None:
        """``conn`` is gone: drop its claim and give back everything it holds."""
        was_waiting = self._waiting.pop(conn, None) is not None
        held, conn.reserved_bytes = conn.reserved_bytes, 0
        self.used_bytes -= held
        if was_waiting or (held and self._waiting):
            self._grant()  # also unblocks the line when its head was this one

    def _short_of(self, conn: Holder, n: int) -> Literal["connection", "server"] | None:
        if conn.reserved_bytes and conn.reserved_bytes + n > self.per_connection_bytes:
            return "connection"
        if self.used_bytes and self.used_bytes + n > self.limit_bytes:
            return "server"
        return None

    def _grant(self) -> None:
        """Grant waiting claims that fit, in line order; never re-entered."""
        if self._granting:  # a connection admitted below released bytes: go round again
            self._grant_again = True
            return
        self._granting = True
        try:
            again = True
            while again:
                self._grant_again = False
                blocked = False
                for conn in list(self._waiting):
                    n = self._waiting.get(conn)
                    if n is None:
                        continue
                    short = self._short_of(conn, n)
                    if short == "connection":
                        continue
                    if short == "server":
                        blocked = True
                        break
                    del self._waiting[conn]
                    self.take(conn, n)
                    conn.admitted()
                self._line_blocked = blocked
                again = self._grant_again
        finally:
            self._granting = False


K = TypeVar("K", bound=Evictable)


class OpenSet(Generic[K]):
    """Open connections in activity order, at most ``max_connections``: a new one evicts
    the connection silent longest with nothing in progress, and is refused only when
    every open one is busy. Evictions and refusals are logged one line a second at most
    (``<prefix>connection_evicted``, ``<prefix>connection_refused``), counting those since
    the last."""

    def __init__(self, max_connections: int, *, event_prefix: str = "") -> None:
        self.max_connections = max_connections
        # Open connections, the one active longest ago first (see touch()).
        self.connections: collections.OrderedDict[K, None] = collections.OrderedDict()
        self.evicted = self.refused = self.timed_out = 0
        self._prefix = event_prefix
        # evictions and refusals not logged yet, and when each was last logged
        self._unlogged = {"evicted": 0, "refused": 0}
        self._logged_at = {"evicted": -1.0, "refused": -1.0}

    def admit(self, conn: K, now: float) -> bool:
        """Count ``conn`` in, evicting the connection silent longest with nothing in progress
        if the limit is reached; False when every open connection is busy."""
        if len(self.connections) >= self.max_connections and not self.evict(now):
            return self.refuse(now)
        self.connections[conn] = None
        return True

    def evict(self, now: float, among: Callable[[K], bool] = lambda _c: True) -> bool:
        """Close the connection silent longest with nothing in progress (of those ``among``
        takes); False when there is none."""
        # In activity order, so the first one not busy is the one silent longest.
        victim = next((c for c in self.connections if not c.busy and among(c)), None)
        if victim is None:
            return False
        self.forget(victim)
        victim.abort()
        self.evicted += 1
        self._note("evicted", now)
        return True

    def refuse(self, now: float) -> bool:
        """Count a connection refused; False (what :meth:`admit` answers)."""
        self.refused += 1
        self._note("refused", now)
        return False

    def touch(self, conn: K) -> None:
        """``conn`` was just active: it moves to the end of the eviction order."""
        if conn in self.connections:
            self.connections.move_to_end(conn)

    def forget(self, conn: K) -> None:
        self.connections.pop(conn, None)

    def _note(self, what: str, now: float) -> None:
        self._unlogged[what] += 1
        if now - self._logged_at[what] >= 1.0:
            self.flush_log(now)

    def flush_log(self, now: float) -> None:
        """Log the evictions and refusals not logged yet (the reaper calls this too)."""
        for what, count in self._unlogged.items():
            if count:
                self._unlogged[what] = 0
                self._logged_at[what] = now
                log.warning(f"{self._prefix}connection_{what}", count=count,
                            open=len(self.connections), max_connections=self.max_connections,
                            evicted=self.evicted, refused=self.refused)


C = TypeVar("C", bound=Holder)
H = TypeVar("H")


class ServerState(OpenSet[C], Generic[C, H]):
    """What the connections of one server share: hooks, limits, the open set, the budget."""

    def __init__(self, hooks: H, *, idle_timeout_s: float, request_timeout_s: float,
                 max_connections: int, budget: BufferBudget) -> None:
        super().__init__(max_connections)
        self.hooks = hooks
        # Not loop.time(): uvloop's is cached per loop iteration, and "silent
        # longest" must tell apart connections made in the same one.
        self.clock: Callable[[], float] = time.monotonic
        self.idle_timeout_s = idle_timeout_s
        self.request_timeout_s = request_timeout_s
        self.budget = budget
        self.stalled = 0


class FlowControl:
    """Reading and writing state of one transport (after uvicorn's ``flow_control.py``)."""

    __slots__ = ("_transport", "drained", "read_paused", "write_paused", "write_paused_at")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.read_paused = False
        self.write_paused = False
        self.write_paused_at: float | None = None
        self.drained = asyncio.Event()
        self.drained.set()

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self._transport.resume_reading()

    def pause_writing(self, now: float) -> None:
        if not self.write_paused:
            self.write_paused = True
            self.write_paused_at = now
            self.drained.clear()

    def resume_writing(self) -> None:
        if self.write_paused:
            self.write_paused = False
            self.write_paused_at = None
            self.drained.set()
