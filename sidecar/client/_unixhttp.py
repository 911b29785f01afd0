"""The MCP bridge's hop to the daemon: a small keep-alive HTTP/1.1 client over its Unix socket.

:class:`DaemonLink` is what the bridge holds (JSON in and out, the bridge's session
and grant on every request, :class:`DaemonDown` when nothing answers);
:class:`UnixHttp` is the HTTP under it.

The bridge sends one short JSON request at a time per tool call and waits for its
answer, so what an HTTP client library adds (URL objects, header multidicts, a
streaming reader, a connection pool with its own tasks) is most of what the hop
costs. This client keeps a few connections open and does only what the daemon's
server (``sidecar/server/_http.py``) needs:

- requests with ``Content-Length`` bodies, one at a time per connection; as many
  connections as requests are in flight, and up to :data:`MAX_IDLE` kept open
  between requests, each for at most :data:`IDLE_S` (the daemon closes idle
  ones after 75 s; aiohttp's client, which this replaces, keeps them 15 s);
- answers read by httptools' parser (the one the daemon's server uses): with
  ``Content-Length`` (all the daemon sends), chunked, or read until the connection
  closes; ``1xx`` interim answers skipped; ``Connection: close`` and HTTP/1.0 honoured;
- a connection that failed, timed out, was cancelled mid-request, or that the
  daemon closed, is dropped, and the next request opens a new one. An idempotent
  request that fails on a kept connection before its answer began is sent once
  more on a new connection, as aiohttp does (RFC 9112 §9.3.1); a ``POST`` never is.

Failures to reach or read the daemon raise :class:`OSError` (``FileNotFoundError``,
``ConnectionRefusedError``, ``ConnectionResetError``, ``TimeoutError`` after
``timeout_s``, :class:`BadResponse` for what is not HTTP). A header name or value
with a control character raises ``ValueError`` before anything is sent.

It needs an asyncio event loop (anyio's asyncio backend is one).
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httptools

from .._errors import DaemonDown

OnChunk = Callable[[bytes], Awaitable[None]]

IDLE_S = 15.0
MAX_IDLE = 8
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
_FORBIDDEN_HEADER_CHARS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_MAX_HEAD = 64 * 1024


class BadResponse(ConnectionError):
    """What the socket answered is not an HTTP/1.x response this client can read."""


class _Dropped(ConnectionResetError):
    """The connection closed before any byte of the answer came."""


class _Connection(asyncio.Protocol):
    """One connection: bytes in, one pending answer at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.lost: BaseException | None = None
        self.last_used = 0.0
        self.reused = False
        self.timed_out = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.lost = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def expire(self) -> None:
        """The exchange took too long: fail it, and drop the connection."""
        self.timed_out = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(TimeoutError("the daemon did not answer in time"))
        self.close()

    async def more(self) -> None:
        """Wait for more bytes (or the end of the connection)."""
        if self.timed_out:
            raise TimeoutError("the daemon did not answer in time")
        if self.closed:
            if self.lost is not None:
                raise ConnectionResetError(f"connection lost: {self.lost}") from self.lost
            raise ConnectionResetError("the daemon closed the connection")
        waiter = self.waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self.waiter = None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class UnixHttp:
    """Keep-alive HTTP/1.1 to the server on ``socket_path``."""

    def __init__(self, socket_path: Path | str, *, host: str = "capd",
                 timeout_s: float = 300.0) -> None:
        self.socket_path = str(socket_path)
        self.timeout_s = timeout_s
        self._host = host
        self._idle: list[_Connection] = []

    async def request(self, method: str, target: str, *, body: bytes | None = None,
                      headers: dict[str, str] | None = None,
                      content_type: str = "application/json",
                      on_chunk: OnChunk | None = None) -> tuple[int, bytes]:
        """Send ``method target`` with ``body``; return the status and the body's bytes.

        With ``on_chunk``, a chunked answer is handed over a chunk at a time as it
        arrives (and the body returned is empty); cancelling the request closes its
        connection, which the daemon takes as the client leaving."""
        head = self._head(method, target, body, headers, content_type)
        retry = method in IDEMPOTENT
        while True:
            conn = await self._take()
            # One timer for the whole exchange (cheaper than asyncio.timeout's bookkeeping).
            timer = asyncio.get_running_loop().call_later(self.timeout_s, conn.expire)
            try:
                status, data, keep = await self._exchange(conn, method, head, body, on_chunk)
            except _Dropped as exc:
                conn.close()
                if retry and conn.reused:
                    retry = False
                    continue
                raise ConnectionResetError(str(exc)) from None
            except BaseException:
                conn.close()  # an answer may still come: never reuse the connection
                raise
            finally:
                timer.cancel()
            if keep and not conn.closed and len(self._idle) < MAX_IDLE:
                conn.last_used = time.monotonic()
                conn.reused = True
                self._idle.append(conn)
            else:
                conn.close()
            return status, data

    async def close(self) -> None:
        """Close every kept connection."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # -- the parts ------------------------------------------------------------------

    def _head(self, method: str, target: str, body: bytes | None,
              headers: dict[str, str] | None, content_type: str) -> bytes:
        lines = [f"{method} {target} HTTP/1.1\r\nHost: {self._host}\r\n"]
        if headers:
            for name, value in headers.items():
                if (_FORBIDDEN_HEADER_CHARS.search(name) is not None
                        or _FORBIDDEN_HEADER_CHARS.search(value) is not None):
                    raise ValueError("Forbidden control character detected in headers. "
                                     "Potential header injection attack.")
                lines.append(f"{name}: {value}\r\n")
        if body is not None:
            lines.append(f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n")
        elif method in ("POST", "PUT", "PATCH"):
            lines.append("Content-Length: 0\r\n")
        lines.append("\r\n")
        return "".join(lines).encode("utf-8")

    async def _take(self) -> _Connection:
        """A kept connection still open and not idle too long, else a new one."""
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and now - conn.last_used < IDLE_S:
                return conn
            conn.close()
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.timeout_s):
            _transport, conn = await loop.create_unix_connection(_Connection, self.socket_path)
        return conn

    async def _exchange(self, conn: _Connection, method: str, head: bytes,
                        body: bytes | None, on_chunk: OnChunk | None = None
                        ) -> tuple[int, bytes, bool]:
        """Write the request and read its answer: (status, body, whether to keep the connection)."""
        assert conn.transport is not None
        conn.buf.clear()
        if conn.closed:
            raise _Dropped("the daemon closed the connection")
        conn.transport.write(head + body if body else head)
        answer, received = _Answer(), 0
        while not (answer.done or (answer.head_done and method == "HEAD")):
            if not conn.buf:
                if conn.closed and not received:
                    raise _Dropped("the daemon closed the connection before answering")
                if conn.closed and answer.head_done and not answer.framed:
                    answer.keep = False  # no length: the body ended with the connection
                    break
                await conn.more()
                continue
            data = bytes(conn.buf)
            conn.buf.clear()
            received += len(data)
            try:
                answer.parser.feed_data(data)
            except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
                raise BadResponse(f"not an HTTP/1.x answer this client reads: {exc}") from None
            if not answer.head_done and received > _MAX_HEAD:
                raise BadResponse("the answer's head is too long")
            if on_chunk is not None and answer.chunked:
                pieces, answer.pieces = answer.pieces, []
                for piece in pieces:
                    await on_chunk(piece)
        return answer.status, b"".join(answer.pieces), answer.keep


class _Answer:
    """One answer as httptools' parser reads it (these are its callbacks), after any
    ``1xx`` interim answers."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status, self.keep = 0, False
        self.on_message_begin()

    def on_message_begin(self) -> None:
        self.head_done = self.done = self.framed = self.chunked = False
        self.pieces: list[bytes] = []

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        self.framed |= name in (b"content-length", b"transfer-encoding")
        self.chunked |= name == b"transfer-encoding" and b"chunked" in value.lower()

    def on_headers_complete(self) -> None:
        self.status, self.keep = self.parser.get_status_code(), self.parser.should_keep_alive()
        self.head_done = not 100 <= self.status < 200

    def on_body(self, data: bytes) -> None:
        self.pieces.append(data)

    def on_message_complete(self) -> None:
        if self.head_done:  # the answer, not an interim one
            self.done, self.keep = True, self.parser.should_keep_alive()


class DaemonLink:
    """HTTP over the daemon's Unix socket: kept-alive connections, a fresh one after any failure."""

    def __init__(self, socket_path: Path, *, session: str | None = None,
                 grant: str | None = None) -> None:
        self.socket_path = socket_path
        # One agent session per bridge process (one MCP client): the daemon's unit of loop
        # detection and of session consent grants.
        self.agent_session = session or secrets.token_hex(8)
        self._base_headers = {"Capd-Session": self.agent_session}
        if grant is not None:  # what the daemon holds every request of this bridge to
            self._base_headers["Capd-Grant"] = grant
        self._http = UnixHttp(socket_path, timeout_s=300.0)

    async def request(self, method: str, path: str, *, query: dict[str, str] | None = None,
                      body: Any = None, headers: dict[str, str] | None = None,
                      on_chunk: OnChunk | None = None) -> tuple[int, Any]:
        """Send one request; raise :class:`DaemonDown` if nothing answers. A streamed
        answer's chunks go to ``on_chunk`` as they come (its body is then None)."""
        if "/." in path:  # dot segments: resolved (RFC 3986 §5.2.4), as a URL library would
            from yarl import URL

            path = URL(f"http://capd{path}").raw_path
        if query:
            path = f"{path}?{urlencode(query)}"
        all_headers = {**self._base_headers, **(headers or {})}
        payload = json.dumps(body).encode() if method == "POST" and body is not None else None
        try:
            status, data = await self._http.request(method, path, body=payload,
                                                    headers=all_headers, on_chunk=on_chunk)
        except OSError as exc:
            await self.close()
            raise DaemonDown(
                f"capd is not reachable on {self.socket_path} ({exc.__class__.__name__}): is "
                "the daemon running? Start it with `capd serve`; this bridge reconnects by "
                "itself."
            ) from exc
        text = data.decode("utf-8")
        try:
            return status, json.loads(text) if text else None
        except ValueError:
            return status, text

    async def close(self) -> None:
        """Close the kept connections."""
        await self._http.close()
