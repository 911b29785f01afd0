"""The HTTP/1.1 + JSON API on the Unix socket, generated from the operator table.

Errors are ``application/problem+json`` bodies: malformed JSON 400, a browser
(``Origin``/``Referer``) 403, unknown capability or route 404, a body over the
limit 413, invalid parameters 422 (with pydantic's error list), draining 503.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
import structlog
from aiohttp import web
from structlog.contextvars import bind_contextvars

from recovery import (
    IdempotencyConflict,
    InvalidTransition,
    QueueClosed,
    UnknownJob,
    UnknownTool,
)
from registry import CapdError, UnknownCapability

from ._errors import BadRequest, Draining, InvalidParams
from ._gateway import Caller
from ._handlers import Context, Reply
from ._peers import PeerPolicy, RateLimiter
from ._table import COMMANDS, OperatorCommand

if TYPE_CHECKING:
    from ._daemon import Daemon

log = structlog.get_logger("capd.api")

PROBLEM_JSON = "application/problem+json"
_CRED = struct.Struct("3i")
MAX_BODY_BYTES = web.AppKey("max_body_bytes", int)

Endpoint = Callable[[web.Request], Awaitable[web.StreamResponse]]


def problem(status: int, title: str, detail: str, **extra: Any) -> web.Response:
    """A problem+json response."""
    body = {"type": f"urn:capd:problem:{title.lower().replace(' ', '-')}", "title": title,
            "status": status, "detail": detail, **extra}
    return web.Response(status=status, body=dumps(body), content_type=PROBLEM_JSON)


def _fallback(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return str(value)


def dumps(body: Any) -> bytes:
    """JSON bytes; values JSON cannot hold (a Path, a set, a model) become strings or lists."""
    return orjson.dumps(body, default=_fallback)


class RequestIds:
    """Request ids unique to this boot: a random prefix and a counter (no syscall per call)."""

    def __init__(self) -> None:
        self._prefix = os.urandom(4).hex()
        self._counter = itertools.count(1)

    def next(self) -> str:
        """A fresh request id."""
        return f"{self._prefix}-{next(self._counter):x}"


class PeerCredentials:
    """SO_PEERCRED of each connection, read once and kept while the transport lives."""

    def __init__(self) -> None:
        self._cache: weakref.WeakKeyDictionary[Any, Caller] = weakref.WeakKeyDictionary()

    def of(self, request: web.Request) -> Caller:
        """The credentials of ``request``'s peer (empty when not a Unix socket)."""
        transport = request.transport
        if transport is None:
            return Caller()
        cached = self._cache.get(transport)
        if cached is not None:
            return cached
        sock = transport.get_extra_info("socket")
        caller = Caller()
        if sock is not None and sock.family == socket.AF_UNIX:
            pid, uid, gid = _CRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
            )
            caller = Caller(pid=pid, uid=uid, gid=gid)
        self._cache[transport] = caller
        return caller


def _to_response(reply: Reply, request_id: str) -> web.Response:
    headers = {"X-Request-Id": request_id, **reply.headers}
    if isinstance(reply.body, bytes):  # already rendered (Prometheus text)
        return web.Response(status=reply.status, body=reply.body, headers={
            **headers, "Content-Type": reply.content_type})
    return web.Response(status=reply.status, body=dumps(reply.body),
                        content_type=reply.content_type, headers=headers)


def _refusal(request: web.Request) -> web.Response | None:
    if "Origin" in request.headers or "Referer" in request.headers:
        return problem(403, "Forbidden", "requests carrying Origin or Referer are refused: "
                       "a browser must never drive the capd socket")
    return None


def _problem_for(exc: Exception, request: web.Request) -> web.Response:
    """Translate an error raised while handling ``request`` into a problem response."""
    match exc:
        case BadRequest():
            return problem(400, "Bad Request", str(exc))
        case InvalidParams():
            return problem(422, "Invalid Parameters", str(exc), errors=exc.errors)
        case UnknownCapability():
            return problem(404, "Unknown Capability", str(exc), suggestions=exc.suggestions)
        case UnknownTool():
            return problem(404, "Unknown Tool", str(exc))
        case Draining():
            return problem(503, "Draining", str(exc))
        case UnknownJob():
            return problem(404, "Unknown Job", str(exc))
        case IdempotencyConflict():
            return problem(409, "Idempotency Conflict", str(exc))
        case InvalidTransition():
            return problem(409, "Invalid Transition", str(exc))
        case QueueClosed():
            return problem(503, "Queue Closed", str(exc))
        case web.HTTPRequestEntityTooLarge():
            return problem(413, "Payload Too Large",
                           f"request body is larger than {request.app[MAX_BODY_BYTES]} bytes; "
                           "send less, or raise max_body_bytes in capd.toml")
        case CapdError():
            log.error("request_failed", path=request.path, error=str(exc))
            return problem(500, "Internal Error", str(exc))
    log.error("request_crashed", path=request.path, error=repr(exc))
    return problem(500, "Internal Error", f"{type(exc).__name__}: {exc}")


def _endpoint(
    daemon: Daemon, row: OperatorCommand, creds: PeerCredentials, ids: RequestIds,
    peers: PeerPolicy, limiter: RateLimiter,
) -> Endpoint:
    limited = row.id == "call"

    # No aiohttp middleware: the guard lives here, one coroutine per request.
    async def handle(request: web.Request) -> web.StreamResponse:
        refused = _refusal(request)
        if refused is not None:
            return refused
        caller = creds.of(request)
        if not peers.allows(caller):
            log.warning("peer_denied", uid=caller.uid, gid=caller.gid, pid=caller.pid,
                        path=request.path)
            return problem(403, "Forbidden", "this uid may not use the capd socket; ask the "
                           "operator to add it to allow_uids or allow_gids")
        if limited:
            wait_s = limiter.take(caller)
            if wait_s is not None:
                response = problem(429, "Too Many Requests",
                                   f"uid {caller.uid} is over its call rate; retry later")
                response.headers["Retry-After"] = str(max(1, round(wait_s)))
                return response
        request_id = request.headers.get("X-Request-Id") or ids.next()
        bind_contextvars(request_id=request_id)
        try:
            body: Any = None
            if row.method == "POST" and request.can_read_body:
                raw = await request.read()
                if raw.strip():
                    try:
                        body = orjson.loads(raw)
                    except orjson.JSONDecodeError as exc:
                        raise BadRequest(f"malformed JSON body: {exc}") from None
            ctx = Context(daemon=daemon, path=dict(request.match_info),
                          query=dict(request.query) if request.query_string else {},
                          body=body, caller=caller, request_id=request_id,
                          idempotency_key=request.headers.get("Idempotency-Key"))
            reply = await row.handler(ctx)
        except Exception as exc:  # every failure becomes a problem+json answer
            response = _problem_for(exc, request)
            response.headers["X-Request-Id"] = request_id
            return response
        return _to_response(reply, request_id)

    return handle


async def _not_found(request: web.Request) -> web.StreamResponse:
    return _refusal(request) or problem(
        404, "Not Found", f"{request.method} {request.path}: no such route; see GET /status"
    )


def _method_not_allowed(allowed: str) -> Endpoint:
    async def handle(request: web.Request) -> web.StreamResponse:
        return _refusal(request) or problem(
            405, "Method Not Allowed", f"{request.method} {request.path}: use {allowed}",
        )

    return handle


def make_app(daemon: Daemon, *, max_body_bytes: int, peers: PeerPolicy | None = None,
             limiter: RateLimiter | None = None) -> web.Application:
    """The aiohttp application: one route per operator table row."""
    app = web.Application(client_max_size=max_body_bytes)
    creds = PeerCredentials()
    ids = RequestIds()
    peers = peers or PeerPolicy()
    limiter = limiter or RateLimiter(0, 1)
    app[MAX_BODY_BYTES] = max_body_bytes
    for row in COMMANDS:
        resource = app.router.add_resource(row.path, name=row.id)
        resource.add_route(row.method, _endpoint(daemon, row, creds, ids, peers, limiter))
        # Same path, other method: 405 as problem+json (aiohttp would answer text).
        resource.add_route("*", _method_not_allowed(row.method))
    app.router.add_route("*", "/{tail:.*}", _not_found)
    return app
