"""A small HTTP/1.1 server for the Unix socket: httptools (llhttp) parsing on an asyncio Protocol.

capd's API is a handful of JSON routes on a local socket, so the server does
only what they need, and does it with little Python per request:

- keep-alive by default (HTTP/1.1 rules, ``Connection: close`` honoured) and
  pipelined requests answered in order, one at a time per connection;
- ``Content-Length`` and chunked request bodies (llhttp decodes chunks),
  ``Expect: 100-continue`` answered, bodies bounded (413 before reading when
  the length is declared, as soon as it is passed when chunked);
- malformed requests answered 400 and the connection closed;
- a connection idle for ``idle_timeout_s`` (75 s) between requests is closed;
- a client that half-closes after its request (``nc -N``) still gets its answer;
- the peer's credentials read once per connection;
- a handler that is still running when its client goes away finishes its work
  (a call is never cut half-way by a disconnect); its answer is dropped.

The rest (routing, JSON, problem bodies) is the API's job (``_api.py``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import unquote

import httptools
import structlog

log = structlog.get_logger("capd.http")

MAX_HEADER_BYTES = 64 * 1024
MAX_PIPELINED = 16
# A body past the limit is read and dropped up to this much, so that the client
# sees the 413 instead of a broken pipe; beyond it the connection is closed.
DISCARD_LIMIT = 64 * 1024 * 1024

_REASONS = {s.value: s.phrase.encode("latin-1") for s in HTTPStatus}


@dataclass(slots=True)
class HttpRequest:
    """One parsed request. Header names are lower case."""

    method: str
    path: str
    query_string: str
    headers: dict[str, str]
    body: bytes
    peer: Any
    keep_alive: bool = True


@dataclass(slots=True)
class HttpResponse:
    """One answer: the body is already encoded."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


def _internal_error() -> HttpResponse:
    """The answer when the handler failed in a way the API did not turn into a problem."""
    return HttpResponse(500, b'{"title":"Internal Error","status":500}',
                        "application/problem+json")


def encode_response(response: HttpResponse, *, keep_alive: bool, head: bool = False) -> bytes:
    """The bytes of ``response`` on the wire."""
    lines = [b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n" % (
        response.status, _REASONS.get(response.status, b"Unknown"),
        response.content_type.encode("latin-1"), len(response.body))]
    for name, value in response.headers.items():
        lines.append(b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1")))
    if not keep_alive:
        lines.append(b"Connection: close\r\n")
    lines.append(b"\r\n")
    if not head:
        lines.append(response.body)
    return b"".join(lines)


@dataclass(frozen=True)
class ServerHooks:
    """What the server needs from the API: the handler, the peer lookup, two error pages."""

    handler: Handler
    peer_of: Callable[[Any], Any]
    too_large: Callable[[], HttpResponse]
    malformed: Callable[[str], HttpResponse]
    max_body_bytes: int


class HttpConnection(asyncio.Protocol):
    """One client connection."""

    def __init__(self, hooks: ServerHooks, connections: set[HttpConnection]) -> None:
        self._hooks = hooks
        self._connections = connections
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.last_active = 0.0
        self._peer: Any = None
        self._pending: collections.deque[HttpRequest] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._paused = False
        self._closing = False
        self._eof = False
        # The request being parsed.
        self._url = b""
        self._headers: dict[str, str] = {}
        self._header_bytes = 0
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._too_large = False

    # -- asyncio.Protocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Remember the transport and read the peer's credentials once."""
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self._transport = cast(asyncio.Transport, transport)
        self._loop = asyncio.get_running_loop()
        self.last_active = self._loop.time()
        try:
            self._peer = self._hooks.peer_of(transport.get_extra_info("socket"))
        except OSError as exc:  # the peer left before we asked; nothing to serve
            log.warning("peer_credentials_unreadable", error=str(exc))
            self._closing = True
            self._transport.close()
            return
        self._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection; a running handler finishes and its answer is dropped."""
        self._closing = True
        self._pending.clear()
        self._connections.discard(self)

    def eof_received(self) -> bool:
        """The client finished sending: answer what it asked, then close."""
        self._eof = True
        return self.busy  # True keeps the transport open for the answers

    def data_received(self, data: bytes) -> None:
        """Feed the parser; a malformed request is answered 400 and the connection closed."""
        if self._closing:
            return
        if self._loop is not None:
            self.last_active = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(self._hooks.malformed("protocol upgrades are not supported"))
        except httptools.HttpParserError as exc:
            if not self._closing:
                self._fail(self._hooks.malformed(f"malformed HTTP request: {exc}"))

    # -- httptools callbacks ----------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._header_bytes = 0
        self._body = []
        self._body_bytes = 0
        self._too_large = False

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_header_bytes(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")
        self._count_header_bytes(len(name) + len(value))

    def on_headers_complete(self) -> None:
        length = self._headers.get("content-length")
        expects = self._headers.get("expect", "").lower() == "100-continue"
        if length is not None and length.isdigit() and int(length) > self._hooks.max_body_bytes:
            self._refuse_body()
            # A client waiting for 100 Continue never sends the body; one sending more
            # than the discard limit is not worth reading: close after the answer.
            if (expects or int(length) > DISCARD_LIMIT) and self._transport is not None:
                self._closing = True
                self._transport.close()
        elif expects and self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._too_large:
            if self._body_bytes > DISCARD_LIMIT and self._transport is not None:
                self._transport.close()
            return
        if self._body_bytes > self._hooks.max_body_bytes:
            self._refuse_body()
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._too_large:
            if self._transport is not None:
                self._transport.close()
            return
        parsed = httptools.parse_url(self._url)
        request = HttpRequest(
            method=self._parser.get_method().decode("ascii"),
            path=unquote(parsed.path.decode("latin-1")),
            query_string=(parsed.query or b"").decode("latin-1"),
            headers=self._headers,
            body=b"".join(self._body),
            peer=self._peer,
            keep_alive=self._parser.should_keep_alive(),
        )
        self._pending.append(request)
        if self._task is None and self._loop is not None:
            self._task = self._loop.create_task(self._serve())
        elif len(self._pending) >= MAX_PIPELINED and not self._paused and self._transport:
            self._transport.pause_reading()
            self._paused = True

    # -- answering --------------------------------------------------------------

    async def _serve(self) -> None:
        """Answer pending requests in order."""
        try:
            while self._pending:
                request = self._pending.popleft()
                try:
                    response = await self._hooks.handler(request)
                except Exception as exc:  # the API turns errors into answers; this is a guard
                    log.error("handler_crashed", path=request.path, error=repr(exc))
                    response = _internal_error()
                if self._closing or self._transport is None:
                    return
                try:
                    data = encode_response(response, keep_alive=request.keep_alive,
                                           head=request.method == "HEAD")
                except (UnicodeEncodeError, TypeError) as exc:  # a header HTTP cannot carry
                    log.error("response_unencodable", path=request.path, error=repr(exc))
                    data = encode_response(_internal_error(), keep_alive=request.keep_alive)
                self._transport.write(data)
                if self._loop is not None:
                    self.last_active = self._loop.time()
                if not request.keep_alive:
                    self._closing = True
                    self._transport.close()
                    return
                if self._paused:
                    self._paused = False
                    self._transport.resume_reading()
            if self._eof and self._transport is not None:
                self._closing = True
                self._transport.close()
        finally:
            self._task = None

    def _refuse_body(self) -> None:
        """Answer 413 now; the rest of the body is read and dropped, then the connection closed."""
        self._too_large = True
        self._body = []
        if self._transport is not None:
            self._transport.write(encode_response(self._hooks.too_large(), keep_alive=False))

    def _count_header_bytes(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > MAX_HEADER_BYTES:
            raise httptools.HttpParserError("request line and headers exceed 64 KiB")

    def _fail(self, response: HttpResponse) -> None:
        self._closing = True
        if self._transport is not None:
            self._transport.write(encode_response(response, keep_alive=False))
            self._transport.close()

    @property
    def busy(self) -> bool:
        """Whether a request is being answered or waits to be."""
        return self._task is not None or bool(self._pending)

    def close(self) -> None:
        """Close the connection now."""
        self._closing = True
        if self._transport is not None:
            self._transport.close()


class HttpServer:
    """Serves ``hooks`` on a listening socket until :meth:`close`."""

    def __init__(self, hooks: ServerHooks, *, idle_timeout_s: float = 75.0) -> None:
        self._hooks = hooks
        self._idle_timeout_s = idle_timeout_s
        self._connections: set[HttpConnection] = set()
        self._server: asyncio.Server | None = None
        self._reaper: asyncio.TimerHandle | None = None

    async def start(self, sock: Any) -> None:
        """Accept connections on the bound, listening Unix socket ``sock``."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(
            lambda: HttpConnection(self._hooks, self._connections), sock=sock, backlog=1024)
        self._reaper = loop.call_later(self._idle_timeout_s / 4, self._reap_idle)

    def _reap_idle(self) -> None:
        """Close connections that sent nothing and waited for nothing for the idle timeout."""
        loop = asyncio.get_running_loop()
        cutoff = loop.time() - self._idle_timeout_s
        for conn in [c for c in self._connections if not c.busy and c.last_active < cutoff]:
            conn.close()
        self._reaper = loop.call_later(self._idle_timeout_s / 4, self._reap_idle)

    async def close(self, grace_s: float = 2.0) -> None:
        """Stop accepting, close idle connections, give busy ones ``grace_s`` to answer."""
        if self._reaper is not None:
            self._reaper.cancel()
        if self._server is not None:
            self._server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while True:
            for conn in [c for c in self._connections if not c.busy]:
                conn.close()
            if not self._connections or loop.time() >= deadline:
                break
            await asyncio.sleep(0.02)
        for conn in list(self._connections):
            conn.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=1.0)
