"""The HTTP/1.1 + JSON API on the Unix socket, generated from the operator table.

Errors are ``application/problem+json`` bodies: malformed JSON 400, a browser
(``Origin``/``Referer``) 403, unknown capability or route 404, a body over the
limit 413, invalid parameters 422 (with pydantic's error list), draining 503.
"""

from __future__ import annotations

import json
import socket
import struct
import uuid
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from recovery import UnknownTool
from registry import CapdError, UnknownCapability

from ._errors import BadRequest, Draining, InvalidParams
from ._gateway import Caller
from ._handlers import Context, Reply
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
    return web.Response(status=status, text=json.dumps(body), content_type=PROBLEM_JSON)


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
    return web.Response(status=reply.status, text=json.dumps(reply.body),
                        content_type=reply.content_type, headers=headers)


def _endpoint(daemon: Daemon, row: OperatorCommand, creds: PeerCredentials) -> Endpoint:
    async def handle(request: web.Request) -> web.StreamResponse:
        request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex[:16]
        request["request_id"] = request_id
        body: Any = None
        if request.method == "POST" and request.can_read_body:
            raw = await request.read()
            if raw.strip():
                try:
                    body = json.loads(raw)
                except (ValueError, UnicodeDecodeError) as exc:
                    raise BadRequest(f"malformed JSON body: {exc}") from None
        ctx = Context(daemon=daemon, path=dict(request.match_info), query=dict(request.query),
                      body=body, caller=creds.of(request), request_id=request_id)
        return _to_response(await row.handler(ctx), request_id)

    return handle


@web.middleware
async def _guard(request: web.Request, handler: Endpoint) -> web.StreamResponse:
    if "Origin" in request.headers or "Referer" in request.headers:
        return problem(403, "Forbidden", "requests carrying Origin or Referer are refused: "
                       "a browser must never drive the capd socket")
    try:
        return await handler(request)
    except BadRequest as exc:
        return problem(400, "Bad Request", str(exc))
    except InvalidParams as exc:
        return problem(422, "Invalid Parameters", str(exc), errors=exc.errors)
    except UnknownCapability as exc:
        return problem(404, "Unknown Capability", str(exc), suggestions=exc.suggestions)
    except UnknownTool as exc:
        return problem(404, "Unknown Tool", str(exc))
    except Draining as exc:
        return problem(503, "Draining", str(exc))
    except web.HTTPRequestEntityTooLarge:
        return problem(413, "Payload Too Large",
                       f"request body is larger than {request.app[MAX_BODY_BYTES]} bytes; "
                       "send less, or raise max_body_bytes in capd.toml")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return problem(exc.status, exc.reason, f"{request.method} {request.path}: {exc.reason}")
    except CapdError as exc:
        log.error("request_failed", path=request.path, error=str(exc))
        return problem(500, "Internal Error", str(exc))
    except Exception as exc:
        log.exception("request_crashed", path=request.path)
        return problem(500, "Internal Error", f"{type(exc).__name__}: {exc}")


def make_app(daemon: Daemon, *, max_body_bytes: int) -> web.Application:
    """The aiohttp application: one route per operator table row."""
    app = web.Application(client_max_size=max_body_bytes, middlewares=[_guard])
    creds = PeerCredentials()
    app[MAX_BODY_BYTES] = max_body_bytes
    for row in COMMANDS:
        app.router.add_route(row.method, row.path, _endpoint(daemon, row, creds), name=row.id)
    return app
