"""A small HTTP/1.1 server for the Unix socket: httptools (llhttp) parsing on an asyncio Protocol.

capd's API is a handful of JSON routes on a local socket, so the server does
only what they need, and does it with little Python per request:

- keep-alive by default (HTTP/1.1 rules, ``Connection: close`` honoured) and
  pipelined requests answered strictly in order, one at a time per connection:
  every answer (the handler's, a 413, a 400, a 408, ``100 Continue``) waits in
  one queue per connection behind the answers before it;
- ``Content-Length`` and chunked request bodies (llhttp decodes chunks),
  ``Expect: 100-continue`` answered, bodies bounded (413 before reading when
  the length is declared, as soon as it is passed when chunked);
- malformed requests answered 400 and the connection closed once the answers
  before it are out;
- flow control (after uvicorn's ``flow_control.py``): while a connection's
  answers are not drained it is neither read nor answered further;
- bounded buffering: a request claims its size from a budget shared by all
  connections (``max_buffered_bytes``) before its body is read, a connection
  holds at most ``MAX_PIPELINED`` requests and two requests' worth of bytes,
  and a connection that must wait is simply not read;
- slow clients: a request must arrive whole within ``request_timeout_s`` (else
  408), a connection idle between requests for ``idle_timeout_s`` is closed, as
  is one whose answers have not been read for ``idle_timeout_s``;
- at most ``max_connections``: the one silent longest with nothing in progress
  is evicted for a newcomer; when every one is busy the newcomer is answered 503
  (both logged at most once a second, with counts);
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
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Final, Literal, Protocol, cast
from urllib.parse import unquote

import httptools
import structlog

from ._http_limits import BufferBudget, FlowControl, ServerState

log = structlog.get_logger("capd.http")

MAX_HEADER_BYTES = 64 * 1024
MAX_PIPELINED = 16
# A body past the limit is read and dropped up to this much, so that the client
# sees the 413 instead of a broken pipe; beyond it the connection is closed.
DISCARD_LIMIT = 64 * 1024 * 1024
# A chunked body is parsed this much at a time. llhttp cannot pause inside what
# it is given, and a chunked body's end is not known in advance, so a request
# pipelined right behind one is parsed before it can be held back: at most this
# much of it.
CHUNKED_SLICE = 16 * 1024

SEPARATE_BODY_BYTES = 64 * 1024
"""A body larger than this is written on its own, not copied into one piece with its head."""

_REASONS = {s.value: s.phrase.encode("latin-1") for s in HTTPStatus}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_HEADERS_END = b"\r\n\r\n"


_ONCE = frozenset({"capd-grant", "capd-session", "capd-timeout", "idempotency-key"})
"""Headers that decide who calls or how: sent twice, the request is refused (400)."""


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
    # The connection it came on (its ``gone()`` is an event set when the client leaves).
    connection: Any = None


class StreamBody(Protocol):
    """A body written as it is made (chunked): ``run`` sends pieces with ``send`` until
    it is done; ``gone`` is set when the client goes away (``send`` then raises)."""

    async def run(self, send: Callable[[bytes], Awaitable[None]], gone: asyncio.Event) -> None:
        """Write the body."""
        ...


@dataclass(slots=True)
class HttpResponse:
    """One answer: the body is already encoded, or ``stream`` writes it as it is made."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    stream: StreamBody | None = None


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


def _problem(status: int, detail: str) -> HttpResponse:
    """A problem+json answer the server makes itself, in the API's form."""
    title = HTTPStatus(status).phrase
    body = {"type": "urn:capd:problem:" + title.lower().replace(" ", "-"), "title": title,
            "status": status, "detail": detail}
    return HttpResponse(status, json.dumps(body).encode(), "application/problem+json")


_INTERNAL_ERROR: Final = HttpResponse(500, b'{"title":"Internal Error","status":500}',
                                      "application/problem+json")
"""The answer when the handler failed in a way the API did not turn into a problem."""


def encode_response(response: HttpResponse, *, keep_alive: bool, head: bool = False) -> bytes:
    """The bytes of ``response`` on the wire (only the head of a streamed one)."""
    length = (b"Transfer-Encoding: chunked" if response.stream is not None
              else b"Content-Length: %d" % len(response.body))
    lines = [b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%s\r\n" % (
        response.status, _REASONS.get(response.status, b"Unknown"),
        response.content_type.encode("latin-1"), length)]
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


# -- what a connection's answer queue holds -------------------------------------


@dataclass(slots=True)
class _Call:
    """A request for the handler; it holds ``reserved`` bytes until the handler returns."""

    request: HttpRequest
    reserved: int


_Item = _Call | HttpResponse | bytes
"""A request for the handler; an answer the server makes itself (413, 400, 408: the
connection closes after it); or ``100 Continue`` (the body being read may come)."""


# -- one connection -------------------------------------------------------------


LINGER_S = 2.0
"""How long a refused client gets to read its answer and close before it is dropped."""


class HttpConnection(asyncio.Protocol):
    """One client connection: parses requests, answers them in order, holds back when it must.

    Received bytes are parsed a header block or a declared body at a time (llhttp
    cannot be paused inside what it is given), so that parsing can stop exactly
    where the next request would have to wait: for its claim on the budget, for
    room in the queue (``MAX_PIPELINED``) or for earlier answers to drain. What is
    not parsed yet waits in ``_buf`` and the socket is not read meanwhile.
    """

    def __init__(self, state: ServerState[HttpConnection, ServerHooks]) -> None:
        self._state = state
        self._hooks = state.hooks
        self._clock = state.clock
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport
        self._loop: asyncio.AbstractEventLoop
        self._flow: FlowControl
        self.last_active = 0.0
        self.reserved_bytes = 0  # kept by the budget
        self._peer: Any = None
        self._pending: collections.deque[_Item] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._eof = False
        self._done = False  # nothing after the last request is parsed
        self._answered_last = False  # the closing answer is written
        self._refused = False  # the closing answer is the server's own refusal
        self._lingering_since: float | None = None  # EOF sent after a refusal
        self._feeding = False
        # Received bytes not parsed yet: self._buf[self._pos:].
        self._buf = b""
        self._pos = 0
        self._tail = b""  # the last bytes of a header block parsed so far
        # Claims: the request being read holds ``_claim`` or is ``_owed`` it (its claim
        # waits); requests completed while a claim waits are parked until it is granted.
        self._claim = 0
        self._owed = 0
        self._claim_waits = False
        self._parked: list[tuple[HttpRequest, int]] = []
        # The request being parsed.
        self._in_message = False
        self._in_body = False
        self._started_at: float | None = None
        self._body_left: int | None = None  # declared body bytes still to come
        self._expects = False
        self._discarding = False
        self._url = b""
        self._headers: dict[str, str] = {}
        self._twice: str | None = None  # a header that must come once, sent again
        self._header_bytes = 0
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._gone: asyncio.Event | None = None  # made on demand; set when the client leaves

    # -- asyncio.Protocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Read the peer's credentials once; take a place among the server's connections."""
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self._transport = cast(asyncio.Transport, transport)
        self._loop = asyncio.get_running_loop()
        self._flow = FlowControl(self._transport)
        self.last_active = self._clock()
        try:
            self._peer = self._hooks.peer_of(transport.get_extra_info("socket"))
        except OSError as exc:  # the peer left before we asked; nothing to serve
            log.warning("peer_credentials_unreadable", error=str(exc))
            self.close()
            return
        if not self._state.admit(self, self.last_active):
            self._transport.write(encode_response(_problem(
                503, f"capd is at its connection limit ({self._state.max_connections} open "
                "connections); retry in a moment, and close connections you do not use"),
                keep_alive=False))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection; a running handler finishes and its answer is dropped."""
        self._closing = True
        self._pending.clear()
        self._parked.clear()
        self._buf = b""
        self._pos = 0
        self._state.forget(self)
        self._state.budget.forget(self)
        self._flow.drained.set()  # a serving task waiting to write wakes, and ends
        if self._gone is not None:
            self._gone.set()  # a streamed answer stops (and cancels its work)

    def eof_received(self) -> bool:
        """The client finished sending: answer what it asked, then close."""
        self._eof = True
        if self._lingering_since is not None:  # it read the refusal and left
            return False
        if self._gone is not None:  # a streamed call's client closed its end: it has left
            self._gone.set()
        # True keeps the transport open for the answers.
        return self.busy or self._owes_more()

    def data_received(self, data: bytes) -> None:
        """Parse what can be taken now; keep the rest and stop reading until it can."""
        if self._closing or self._done:  # after the last request, bytes are dropped
            return
        self.last_active = self._clock()
        self._state.touch(self)
        if self._pos < len(self._buf):
            self._buf = self._buf[self._pos:] + data
        else:
            self._buf = data
        self._pos = 0
        self._resume_parsing()

    def pause_writing(self) -> None:
        """The transport's buffer passed its high-water mark: answer and read nothing more."""
        self._flow.pause_writing(self._clock())
        self._update_reading()

    def resume_writing(self) -> None:
        """The buffer drained: answer and read again."""
        self._flow.resume_writing()
        self._resume_parsing()

    # -- parsing ------------------------------------------------------------------

    def _resume_parsing(self) -> None:
        """Parse what waits, then read the socket if more can be taken."""
        if self._closing:
            return
        self._feed()
        self._update_reading()

    def _feed(self) -> None:
        """Give llhttp the received bytes, one header block or declared body at a time,
        while the connection may take more; a malformed request is refused (400)."""
        if self._feeding:  # a callback below led back here; the loop goes on
            return
        self._feeding = True
        try:
            while self._pos < len(self._buf) and self._may_parse():
                start = self._pos
                self._pos = end = start + self._piece_length()
                piece = (self._buf if start == 0 and end == len(self._buf)
                         else memoryview(self._buf)[start:end])
                try:
                    self._parser.feed_data(piece)
                except httptools.HttpParserUpgrade:
                    if not self._done:
                        self._refuse(self._hooks.malformed("protocol upgrades are not supported"))
                except httptools.HttpParserError as exc:
                    if not self._done:  # after the last request, what follows is dropped
                        # a callback's own error is wrapped by the parser: say the cause
                        cause = exc.__context__ if isinstance(
                            exc.__context__, httptools.HttpParserError) else exc
                        self._refuse(self._hooks.malformed(f"malformed HTTP request: {cause}"))
        finally:
            self._feeding = False
        if self._pos >= len(self._buf):
            self._buf = b""
            self._pos = 0

    def _may_parse(self) -> bool:
        """Whether the next piece may be parsed now."""
        if self._done or self._closing or self._claim_waits:
            return False
        if self._in_message:  # finish the request being read: its bytes are claimed
            return True
        return not self._flow.write_paused and len(self._pending) < MAX_PIPELINED

    def _piece_length(self) -> int:
        """How many of the waiting bytes to parse next: never past the end of a header
        block or of a declared body, so that parsing can stop right there."""
        start, left = self._pos, len(self._buf) - self._pos
        if self._in_body:
            return min(left, self._body_left or CHUNKED_SLICE)
        if self._tail:  # the block's end may straddle what came before
            end = (self._tail + self._buf[start:start + 3]).find(_HEADERS_END)
            if end >= 0:
                n = end + 4 - len(self._tail)
                self._tail = b""
                return n
        end = self._buf.find(_HEADERS_END, start)
        if end < 0:
            self._tail = (self._tail + self._buf[max(start, len(self._buf) - 3):])[-3:]
            return left
        self._tail = b""
        block = end + 4 - start
        # The usual case, one request and its whole body in one read, in one piece when
        # its claim is sure to be granted at once (the cut would change nothing).
        rest = left - block
        if rest and self._buf.find(b"\r\nContent-Length: %d\r\n" % rest, start, end + 2) >= 0 \
                and self._state.budget.fits(self, left):
            return left
        return block

    def _update_reading(self) -> None:
        """Read the socket only while what arrives can be parsed now: one decision, one place.

        Once nothing more is parsed the socket is still read (and the bytes dropped),
        so that closing after the last answer does not reset the client's side.
        """
        if self._closing or self._eof:  # after EOF there is nothing more to read
            return
        flow = self._flow
        hold = flow.write_paused or (not self._done and (
            self._pos < len(self._buf) or not self._may_parse()))
        if hold:
            flow.pause_reading()
        elif flow.read_paused:
            flow.resume_reading()
            if self._in_message:  # the time we held it back does not count against it
                self._started_at = self._clock()

    # -- httptools callbacks ----------------------------------------------------

    def on_message_begin(self) -> None:
        if self._done:
            return
        self._in_message = True
        self._in_body = False
        self._started_at = self._clock()
        self._body_left = None
        self._expects = False
        self._url = b""
        self._headers = {}
        self._twice = None
        self._header_bytes = 0
        self._body = []
        self._body_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_header_bytes(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        if key in _ONCE and key in self._headers:
            self._twice = key
        self._headers[key] = value.decode("latin-1")
        self._count_header_bytes(len(name) + len(value))

    def on_headers_complete(self) -> None:
        if self._done:
            return
        self._in_body = True
        self._tail = b""
        if self._parser.should_upgrade():
            self._refuse(self._hooks.malformed("protocol upgrades are not supported"))
            return
        if self._twice is not None:  # which one would count is not for us to guess
            self._refuse(self._hooks.malformed(f"the {self._twice} header is sent twice; "
                                               "send it once"))
            return
        headers = self._headers
        declared = headers.get("content-length")
        length = int(declared) if declared is not None and declared.isdigit() else 0
        chunked = "transfer-encoding" in headers  # llhttp takes no other coding in a request
        self._expects = headers.get("expect", "").lower() == "100-continue"
        max_body = self._hooks.max_body_bytes
        if length > max_body:
            if self._expects or length > DISCARD_LIMIT:
                # A client waiting for 100 Continue never sends the body; one sending
                # more than the discard limit is not worth reading.
                self._refuse(self._hooks.too_large())
            else:
                self._refuse_body()
                self._body_left = length
            return
        self._body_left = None if chunked else length
        n = self._header_bytes + (max_body if chunked else length)
        budget = self._state.budget
        if self._claim_waits:  # only after a chunked body, in the same piece
            budget.add(self, n)
            self._owed = n
        elif budget.claim(self, n):
            self._claim = n
        else:
            self._claim_waits = True
            self._owed = n
        if self._expects and not self._claim_waits:
            self._send_continue()

    def on_body(self, body: bytes) -> None:
        if self._done:
            return
        self._body_bytes += len(body)
        if self._body_left is not None:
            self._body_left -= len(body)
        if self._discarding:
            if self._body_bytes > DISCARD_LIMIT:
                self._end_parsing()
            return
        if self._body_bytes > self._hooks.max_body_bytes:  # chunked, past the limit
            self._refuse_body()
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._done:
            return
        self._in_message = self._in_body = False
        self._started_at = None
        self._tail = b""
        if self._discarding:
            self._end_parsing()
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
            connection=self,
        )
        size = self._header_bytes + self._body_bytes
        budget = self._state.budget
        if self._owed:  # its claim waits: park it until granted
            budget.add(self, size - self._owed)  # a chunked body claims what came
            self._owed = 0
            self._parked.append((request, size))
            return
        claim, self._claim = self._claim, 0
        if claim > size:  # a chunked body claimed max_body_bytes
            budget.release(self, claim - size)
            claim = size
        self._accept(request, claim)

    def _count_header_bytes(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > MAX_HEADER_BYTES:
            raise httptools.HttpParserError(
                "the request line and headers exceed 64 KiB; send large values in the body")

    # -- claims and the end of parsing ----------------------------------------------

    def admitted(self) -> None:
        """The budget granted this connection's waiting claim: queue what was parked,
        let the request being read go on, parse again (soon, not inside the budget)."""
        if self._closing:  # what it was granted is given back when the connection is lost
            return
        self._claim_waits = False
        self._claim, self._owed = self._owed, 0
        parked, self._parked = self._parked, []
        for request, claim in parked:
            if self._done:  # a parked request closed the connection
                self._state.budget.release(self, claim)
            else:
                self._accept(request, claim)
        if self._in_body and self._expects and not self._done:
            self._send_continue()
        self._loop.call_soon(self._resume_parsing)

    def _accept(self, request: HttpRequest, claim: int) -> None:
        """Queue ``request``; after one that closes the connection nothing more is parsed."""
        self._enqueue(_Call(request, claim))
        if not request.keep_alive:
            self._end_parsing()

    def _settle_claims(self) -> None:
        """The request being read will not be handled: give its claim back, stop waiting,
        and queue the requests parked before it (their bytes are already here, so they
        are taken even over the budget), keeping the order of answers."""
        budget = self._state.budget
        budget.withdraw(self)
        budget.release(self, self._claim)
        self._claim = self._owed = 0
        self._claim_waits = False
        parked, self._parked = self._parked, []
        for request, claim in parked:
            budget.take(self, claim)
            self._enqueue(_Call(request, claim))
            if not request.keep_alive:
                break

    def _end_parsing(self) -> None:
        """Parse nothing more; close once the last answer is written."""
        self._settle_claims()
        self._done = True
        self._discarding = False
        self._in_message = self._in_body = False
        self._started_at = None
        self._buf = b""
        self._pos = 0
        self._maybe_finish()
        self._update_reading()

    def _refuse(self, response: HttpResponse) -> None:
        """Answer ``response`` after every earlier answer, parse nothing more, then close."""
        self._end_parsing()
        self._enqueue(response)

    def _refuse_body(self) -> None:
        """Queue a 413 now; the rest of the body is read and dropped, then the connection closed."""
        self._settle_claims()
        self._body = []
        self._discarding = True
        self._enqueue(self._hooks.too_large())

    def _maybe_finish(self) -> None:
        if self._answered_last and not self._discarding and self._refused:
            self._linger()
        elif self._answered_last and not self._discarding:
            self.close()

    def _linger(self) -> None:
        """Close after a refusal without losing it: end our side after the answer, then
        read and drop what the client still sends until it closes (at most ``LINGER_S``).
        Closing at once would reset the connection under a byte that arrives meanwhile,
        and the client would read the reset instead of the answer."""
        if self._eof or not self._transport.can_write_eof():
            self.close()
            return
        if self._flow.read_paused:
            self._flow.resume_reading()
        self._closing = True
        self._lingering_since = self._clock()
        self._transport.write_eof()

    # -- answering --------------------------------------------------------------

    def _enqueue(self, item: _Item) -> None:
        self._pending.append(item)
        if self._task is None:
            self._task = self._loop.create_task(self._serve())
            self._task.add_done_callback(_log_crash)

    def _send_continue(self) -> None:
        """``100 Continue`` now if nothing is owed before it, else in its turn."""
        if self.busy:
            self._enqueue(_CONTINUE)
        else:
            self._write(_CONTINUE)

    async def _serve(self) -> None:
        """Answer the queue in order, waiting while earlier answers are not drained.

        Ends when the queue is empty (the next item starts a new task) or the
        connection closes. A handler is never cancelled by a disconnect.
        """
        try:
            while self._pending and not self._closing:
                if self._flow.write_paused:
                    await self._flow.drained.wait()
                    continue
                item = self._pending.popleft()
                if self._flow.read_paused:  # the queue has room again
                    self._resume_parsing()
                if isinstance(item, _Call):
                    if not await self._answer(item):
                        return
                elif isinstance(item, HttpResponse):  # a refusal the server makes itself
                    self._write(encode_response(item, keep_alive=False))
                    self._answered_last = self._refused = True
                    self._maybe_finish()
                    return
                else:
                    self._write(item)
            if self._eof and not self._closing and not self._owes_more():
                self.close()
        finally:
            self._task = None

    async def _answer(self, call: _Call) -> bool:
        """Handle one request and write its answer; False when the connection is done."""
        request = call.request
        try:
            response = await self._hooks.handler(request)
        except Exception as exc:  # the API turns errors into answers; this is a guard
            log.error("handler_crashed", path=request.path, error=repr(exc))
            response = _INTERNAL_ERROR
        finally:
            self._state.budget.release(self, call.reserved)
        if self._closing:
            return False
        # A large body is written after its head rather than joined to it (a copy of it).
        separate = len(response.body) > SEPARATE_BODY_BYTES and request.method != "HEAD"
        try:
            data = encode_response(response, keep_alive=request.keep_alive,
                                   head=request.method == "HEAD" or separate)
        except (UnicodeEncodeError, TypeError) as exc:  # a header HTTP cannot carry
            log.error("response_unencodable", path=request.path, error=repr(exc))
            data = encode_response(_INTERNAL_ERROR, keep_alive=request.keep_alive)
            separate = False
        self._write(data)
        if separate:
            self._write(response.body)
        if (response.stream is not None and request.method != "HEAD"
                and not await self._stream(response.stream)):
            return False
        if not request.keep_alive:
            self._answered_last = True
            self._maybe_finish()
            return False
        return True

    async def _stream(self, body: StreamBody) -> bool:
        """Write a streamed body as chunks; False when the client left before its end."""
        gone = self.gone()

        async def send(piece: bytes) -> None:
            while self._flow.write_paused and not self._closing:
                await self._flow.drained.wait()
            if self._closing:
                raise ConnectionResetError("the client closed the stream")
            if piece:
                self._write(b"%x\r\n%s\r\n" % (len(piece), piece))

        try:
            await body.run(send, gone)
        except ConnectionResetError:
            return False
        except Exception as exc:  # the stream's end is all that can still be said
            log.error("stream_crashed", error=repr(exc))
            self.abort()
            return False
        if self._closing:
            return False
        self._write(b"0\r\n\r\n")
        return True

    def gone(self) -> asyncio.Event:
        """An event set when the client goes away or closes its end (already set if it
        has). A handler that should stop then (a streamed call) waits on it; others
        never ask, and a half-closed connection still gets their answers."""
        if self._gone is None:
            self._gone = asyncio.Event()
            if self._closing or self._eof:
                self._gone.set()
        return self._gone

    def _write(self, data: bytes) -> None:
        self._transport.write(data)
        self.last_active = self._clock()
        self._state.touch(self)

    # -- deadlines and closing ------------------------------------------------------

    def check_deadlines(self, now: float) -> Literal["stalled", "timed_out", "idle"] | None:
        """Act on a passed deadline and say which; None when none has passed.

        A connection whose answers have not drained for the idle timeout is dropped; a
        request not whole within the request timeout (while it was being read) is
        answered 408 after the answers before it; an idle connection is closed.
        """
        state, flow = self._state, self._flow
        if flow.write_paused_at is not None and now - flow.write_paused_at > state.idle_timeout_s:
            self.abort()
            return "stalled"
        if self._lingering_since is not None:  # the refusal sent, the client still there
            if now - self._lingering_since > LINGER_S \
                    and not self._transport.get_write_buffer_size():
                self.abort()
            return None
        if self._closing:
            return None
        if self._started_at is not None:
            if flow.read_paused or now - self._started_at <= state.request_timeout_s:
                return None
            if self._discarding:  # its 413 is queued: stop reading the rest
                self._end_parsing()
            else:
                self._refuse(_problem(408, "the request did not arrive whole within "
                                      f"{state.request_timeout_s:g} s; send the headers and "
                                      "body without pausing, then retry"))
            return "timed_out"
        idle_s = now - self.last_active
        if not self.busy and not self._claim_waits and idle_s > state.idle_timeout_s:
            self.close()
            return "idle"
        return None

    def _owes_more(self) -> bool:
        """Whether requests already received may still need answers."""
        return self._claim_waits or bool(self._parked) or self._pos < len(self._buf)

    @property
    def busy(self) -> bool:
        """Whether a request is being answered or waits to be."""
        return self._task is not None or bool(self._pending) or bool(self._parked)

    def close(self) -> None:
        """Close the connection once what is written has gone out."""
        self._closing = True
        self._transport.close()

    def abort(self) -> None:
        """Close the connection now, dropping what is not written yet."""
        self._closing = True
        self._transport.abort()


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("connection_task_crashed", error=repr(exc))


class HttpServer:
    """Serves ``hooks`` on a listening socket until :meth:`close`.

    ``idle_timeout_s``: a keep-alive connection with nothing in progress, or one
    whose answers are not read, is closed after this. ``request_timeout_s``: a
    request's headers and body must arrive within this of its first byte (else 408).
    ``max_connections``: open connections at most (see :meth:`ServerState.admit`).
    ``max_buffered_bytes``: request bytes held across all connections (see
    :class:`BufferBudget`).
    """

    def __init__(self, hooks: ServerHooks, *, idle_timeout_s: float = 75.0,
                 request_timeout_s: float = 10.0, max_connections: int = 4096,
                 max_buffered_bytes: int = 64 << 20) -> None:
        if min(idle_timeout_s, request_timeout_s) <= 0 or max_connections < 1:
            raise ValueError("timeouts must be positive and max_connections at least 1")
        budget = BufferBudget(max_buffered_bytes,
                               per_connection_bytes=2 * (hooks.max_body_bytes + MAX_HEADER_BYTES))
        self._state: ServerState[HttpConnection, ServerHooks] = ServerState(
            hooks, idle_timeout_s=idle_timeout_s, request_timeout_s=request_timeout_s,
            max_connections=max_connections, budget=budget)
        # Deadlines are checked often enough to be kept within a quarter of themselves.
        self._reap_every_s = min(1.0, idle_timeout_s / 4, request_timeout_s / 4)
        self._server: asyncio.Server | None = None
        self._reaper: asyncio.TimerHandle | None = None

    async def start(self, sock: Any) -> None:
        """Accept connections on the bound, listening Unix socket ``sock``."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(
            lambda: HttpConnection(self._state), sock=sock, backlog=1024)
        self._reaper = loop.call_later(self._reap_every_s, self._reap)

    def stats(self) -> dict[str, int]:
        """A snapshot for metrics, all counts or bytes: ``connections`` open;
        ``buffered_bytes`` claimed by requests now (``peak_buffered_bytes`` ever;
        ``waiting_for_buffer``: connections whose claim waits); ``queued_answers``,
        ``write_buffer_bytes``, ``reading_paused``, ``writing_paused`` summed over the
        connections; and since start, connections ``evicted`` for newcomers, newcomers
        ``refused`` (503), requests ``timed_out`` (408), and connections dropped as
        ``stalled`` (answers unread)."""
        state = self._state
        conns = list(state.connections)
        return {
            "connections": len(conns),
            "buffered_bytes": state.budget.used_bytes,
            "peak_buffered_bytes": state.budget.peak_bytes,
            "waiting_for_buffer": state.budget.waiting,
            "queued_answers": sum(len(c._pending) for c in conns),
            "write_buffer_bytes": sum(c._transport.get_write_buffer_size() for c in conns
                                      if not c._closing),
            "reading_paused": sum(c._flow.read_paused for c in conns),
            "writing_paused": sum(c._flow.write_paused for c in conns),
            "evicted": state.evicted,
            "refused": state.refused,
            "timed_out": state.timed_out,
            "stalled": state.stalled,
        }

    def _reap(self) -> None:
        """Act on passed deadlines: requests too slow (408), answers unread, idle connections."""
        now = self._state.clock()
        self._state.flush_log(now)
        timed_out = stalled = 0
        for conn in list(self._state.connections):
            outcome = conn.check_deadlines(now)
            timed_out += outcome == "timed_out"
            stalled += outcome == "stalled"
        if timed_out or stalled:
            self._state.timed_out += timed_out
            self._state.stalled += stalled
            log.info("slow_clients_closed", timed_out=timed_out, stalled=stalled,
                     open=len(self._state.connections))
        self._reaper = asyncio.get_running_loop().call_later(self._reap_every_s, self._reap)

    async def close(self, grace_s: float = 2.0) -> None:
        """Stop accepting, close idle connections, give busy ones ``grace_s`` to answer;
        then drop what is left, answers not yet read included."""
        if self._reaper is not None:
            self._reaper.cancel()
        if self._server is not None:
            self._server.close()
        connections = self._state.connections
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while True:
            for conn in [c for c in connections if not c.busy]:
                conn.close()
            if not connections or loop.time() >= deadline:
                break
            await asyncio.sleep(0.02)
        for conn in list(connections):
            conn.abort()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=1.0)
