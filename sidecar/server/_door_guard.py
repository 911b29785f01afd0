"""The HTTP front door's edges: what uvicorn leaves open, bounded the socket API's way.

uvicorn serves the MCP front door (``_mcp_http.py``). Its h11 protocol closes a
keep-alive connection idle between requests, but never one that sends half a
request head; and its ``limit_concurrency`` answers 503 to everyone once that many
connections are open, whoever holds them. So a local user with no token could hold
1,100 half-sent connections and keep every token holder out. :func:`guarded_h11` is
uvicorn's h11 protocol with the edges of capd's own server (``_http_limits.py``):

- a head timeout: a connection that has not sent a whole request head within
  ``head_timeout_s`` of connecting, or of its last answer, is closed;
- an idle timeout: one with nothing in flight is closed ``idle_timeout_s`` after its
  last answer (uvicorn's keep-alive timer, set from the same value);
- caps: at most ``max_connections`` in all and ``max_per_peer`` from one address; at
  either cap a new connection evicts the one silent longest that has no request in
  progress (a half-sent or an idle one) and is refused only when every one is busy.
  Connections that never finish a head can therefore never keep a token holder out.

The daemon sizes ``max_connections`` within its descriptor limit beside the Unix
socket's own cap (``_daemon.py``), so the socket always keeps its descriptors.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

from ._http_limits import OpenSet

log = structlog.get_logger("capd.mcp_http")


class DoorConnections(OpenSet[Any]):
    """The open connections of one front door (the socket's open set, ``OpenSet``), also
    held to ``max_per_peer`` from one address; ``head_timeout_s`` bounds each head (and
    TLS handshake)."""

    def __init__(self, max_connections: int, max_per_peer: int, head_timeout_s: float) -> None:
        super().__init__(max_connections, event_prefix="mcp_http_")
        self.max_per_peer, self.head_timeout_s = max_per_peer, head_timeout_s
        self.per_peer: collections.Counter[str] = collections.Counter()
        self._peer_of: dict[Any, str] = {}
        self.closed = False  # the door stopped: a connection finishing its handshake is dropped

    def admit_from(self, conn: Any, peer: str) -> bool:
        """Count ``conn`` (from ``peer``) in: at the per-address cap the silent-longest idle
        connection of that address makes room, at the total cap any idle one; False
        (refuse it) when none can."""
        now = time.monotonic()
        if self.per_peer[peer] >= self.max_per_peer and not self.evict(
                now, lambda c: self._peer_of.get(c) == peer):
            return self.refuse(now)
        if not self.admit(conn, now):
            return False
        self._peer_of[conn] = peer
        self.per_peer[peer] += 1
        return True

    def forget(self, conn: Any) -> None:
        """``conn`` is gone (or going); once only."""
        super().forget(conn)
        peer = self._peer_of.pop(conn, None)
        if peer is not None:
            self.per_peer[peer] -= 1
            if not self.per_peer[peer]:
                del self.per_peer[peer]


def guarded_h11(connections: DoorConnections) -> type[H11Protocol]:
    """uvicorn's h11 protocol held to ``connections``' caps and head timeout."""
    head_timeout_s = connections.head_timeout_s

    class GuardedH11(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        @property
        def busy(self) -> bool:
            """Whether a request is in progress (its head was read, its answer not done)."""
            return self.cycle is not None and not self.cycle.response_complete

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            peer = self.client[0] if self.client else "?"
            # closed: its door stopped during its handshake
            if connections.closed or not connections.admit_from(self, peer):
                transport.abort()
            else:
                self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            connections.forget(self)
            self._arm_head_timer(arm=False)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            connections.touch(self)
            super().data_received(data)
            if self.busy:
                self._arm_head_timer(arm=False)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not self.busy:
                self._arm_head_timer()  # the next head has head_timeout_s to come whole

        def abort(self) -> None:
            """Close now (evicted): nothing is in progress, so nothing is lost."""
            self._arm_head_timer(arm=False)
            self.transport.abort()

        def _arm_head_timer(self, arm: bool = True) -> None:
            """Start the head timer anew (``arm``), or stop it."""
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = (self.loop.call_later(head_timeout_s, self._head_timed_out)
                                if arm else None)

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.busy or self.transport.is_closing():
                return
            connections.timed_out += 1
            connections.forget(self)
            self.transport.abort()

    return GuardedH11


class PendingTls:
    """An accepted connection in its TLS handshake, as the open set counts it: nothing in
    progress (evictable), closed by shutting its socket down."""

    busy = False

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.shutdown(socket.SHUT_RDWR)


async def accept_tls(listener: socket.socket, connections: DoorConnections,
                     ssl_context: ssl.SSLContext, make_http: Callable[[], asyncio.Protocol],
                     handshakes: set[asyncio.Task[None]]) -> None:
    """Accept on ``listener`` until cancelled: each connection is counted at once (evicting
    an idle one at a cap, or refused when all are busy), like any other, and only then
    does its TLS handshake run, bounded by ``head_timeout_s``; after it, the connection is
    the h11 protocol ``make_http`` makes. (A protocol factory that refused by raising
    would stop uvloop's listener; a handshake run by the server would be neither counted
    nor evictable.)"""
    loop = asyncio.get_running_loop()
    timeout_s = connections.head_timeout_s

    async def handshake(pending: PendingTls) -> None:
        try:
            await loop.connect_accepted_socket(make_http, sock=pending.conn, ssl=ssl_context,
                                               ssl_handshake_timeout=timeout_s)
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
            log.debug("mcp_http_handshake_failed", error=repr(exc))
            connections.timed_out += 1
            with contextlib.suppress(OSError):
                pending.conn.close()
        finally:
            connections.forget(pending)

    while True:
        try:
            conn, address = await loop.sock_accept(listener)
        except OSError as exc:  # out of descriptors for a moment: the cap frees some
            log.warning("mcp_http_accept_failed", error=str(exc))
            await asyncio.sleep(0.1)
            continue
        pending = PendingTls(conn)
        peer = str(address[0]) if isinstance(address, tuple) else "?"
        if connections.closed or not connections.admit_from(pending, peer):
            conn.close()
            continue
        task = loop.create_task(handshake(pending))
        handshakes.add(task)
        task.add_done_callback(handshakes.discard)
