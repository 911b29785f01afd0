"""The HTTP/1.1 + JSON API on the Unix socket, generated from the operator table.

Errors are ``application/problem+json`` bodies: malformed JSON or HTTP 400, a
browser (``Origin``/``Referer``) 403, unknown capability, agent, topology or
route 404, wrong method 405, a body over the limit 413, invalid parameters 422
(with pydantic's error list), an agent that does not resolve or an invalid
topology 422 (with every problem), draining 503.

The HTTP layer is ``_http.py`` (httptools on an asyncio Protocol); this module
routes a parsed request to its table row and renders the row's reply.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import orjson
import structlog
from structlog.contextvars import bind_contextvars

from capd.recovery import tracing
from capd.registry import USER_CODE_FAILURES

from .._args import validate
from .._errors import (
    BadRequest,
)
from .._table import COMMANDS, MAX_CALLS, OperatorCommand
from ._authority import GRANT_HEADER, GrantRefused, PeerRefused, peer_credentials
from ._grant import Caller, Grant, Profile
from ._handlers import HANDLERS
from ._http import HttpRequest, HttpResponse, ServerHooks
from ._json import MAX_JSON_DEPTH, Unencodable, dumps, json_depth_exceeds
from ._peers import RateLimiter
from ._problems import problem_body
from ._runs import EngineRuns
from ._services import Context, Reply, Services

log = structlog.get_logger("capd.api")

_SESSION = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def session_of(caller: Caller, session: str, grant: Grant) -> str:
    """The qualified name of agent session ``session`` (the ``Capd-Session`` header).

    A session belongs to its uid and grant: another uid, or an agent of the same uid
    under a binding or a narrowing, sending the same name gets a session of its own
    (its loop counts, its consent grants): ``<uid>:<name>``, ``<uid>.<tag>:<name>``.
    """
    if not _SESSION.match(session):
        raise BadRequest("Capd-Session must be 1-64 letters, digits, '.', '_' or '-'")
    if grant.token is not None:
        return f"{grant.tag}:{session}"
    if caller.uid is None:
        return session
    tag = grant.tag
    return f"{caller.uid}:{session}" if tag is None else f"{caller.uid}.{tag}:{session}"

PROBLEM_JSON = "application/problem+json"


def problem(status: int, title: str, detail: str, **extra: Any) -> HttpResponse:
    """A problem+json response."""
    body = {"type": f"urn:capd:problem:{title.lower().replace(' ', '-')}", "title": title,
            "status": status, "detail": detail, **extra}
    return HttpResponse(status, dumps(body), PROBLEM_JSON)


def parse_body(raw: bytes) -> Any:
    """The JSON of a request body; raise :class:`BadRequest` for what capd will not take."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON body: {exc}") from exc
    if body is None:
        raise BadRequest("the body is JSON null; send a JSON object ({} for no parameters) "
                         "or no body at all")
    if json_depth_exceeds(raw, body):
        raise BadRequest(f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels; flatten it")
    return body


class RequestIds:
    """Request ids unique to this boot: a random prefix and a counter (no syscall per call)."""

    def __init__(self) -> None:
        self._prefix = os.urandom(4).hex()
        self._counter = itertools.count(1)

    def next(self) -> str:
        """A fresh request id."""
        return f"{self._prefix}-{next(self._counter):x}"


def _to_response(reply: Reply, request_id: str) -> HttpResponse:
    headers = {"X-Request-Id": request_id, **reply.headers}
    if reply.stream is not None:
        return HttpResponse(reply.status, b"", reply.content_type, headers, reply.stream)
    body = reply.body if isinstance(reply.body, bytes) else dumps(reply.body)
    return HttpResponse(reply.status, body, reply.content_type, headers)


def _problem_for(exc: BaseException, path: str) -> HttpResponse:
    """Translate an error raised while handling a request into a problem response (a
    plugin's ``SystemExit`` or ``KeyboardInterrupt`` is an internal error, said so)."""
    if not isinstance(exc, Exception):
        exc = RuntimeError(f"{type(exc).__name__} ({exc}) raised by a plugin's code")
    status, body = problem_body(exc, path)
    return HttpResponse(status, dumps(body), PROBLEM_JSON)


@dataclass(frozen=True)
class Route:
    """A table row's path as segments; ``{name}`` segments are parameters."""

    row: OperatorCommand
    segments: tuple[str, ...]

    def match(self, parts: list[str]) -> dict[str, str] | None:
        """The path parameters when ``parts`` fits this route."""
        if len(parts) != len(self.segments):
            return None
        params = {}
        for segment, part in zip(self.segments, parts, strict=True):
            if segment.startswith("{"):
                if not part:
                    return None
                params[segment[1:-1]] = part
            elif segment != part:
                return None
        return params


def _bucket(segments: tuple[str, ...] | list[str]) -> tuple[int, str]:
    """The key the router files a path under: its segment count and first segment."""
    return len(segments), segments[1] if len(segments) > 1 else ""


class Router:
    """Method and path to a table row. A fixed path wins over a parameter (/queue/stats)."""

    def __init__(self, rows: tuple[OperatorCommand, ...]) -> None:
        self._static: dict[str, dict[str, OperatorCommand]] = {}
        self._dynamic: list[Route] = []
        for row in rows:
            if "{" in row.path:
                self._dynamic.append(Route(row, tuple(row.path.split("/"))))
            else:
                self._static.setdefault(row.path, {})[row.method] = row
        if any(r.segments[1].startswith("{") for r in self._dynamic):
            raise ValueError("a route's first segment must be fixed (the router files by it)")
        # Parameter routes by (segment count, first segment), in table order: a request
        # is tried only against the routes it could fit.
        self._buckets: dict[tuple[int, str], list[Route]] = {}
        for route in self._dynamic:
            self._buckets.setdefault(_bucket(route.segments), []).append(route)
        # POST /call/{name} is most of the traffic: matched by its prefix alone.
        self._call = next((r.row for r in self._dynamic
                           if (r.row.method, r.row.path) == ("POST", "/call/{name}")), None)

    def routes(self) -> set[tuple[str, str]]:
        """Every (method, path template) served."""
        return ({(m, p) for p, rows in self._static.items() for m in rows}
                | {(r.row.method, r.row.path) for r in self._dynamic})

    def match(self, method: str, path: str
              ) -> tuple[OperatorCommand | None, dict[str, str], list[str]]:
        """(row, path parameters, methods the path allows); no row when nothing fits."""
        if method == "POST" and path.startswith("/call/") and self._call is not None:
            name = path[6:]
            if name and "/" not in name:
                return self._call, {"name": name}, [method]
        method = "GET" if method == "HEAD" else method
        rows = self._static.get(path)
        if rows is not None:
            row = rows.get(method)
            return row, {}, sorted(rows)
        parts = path.split("/")
        allowed = []
        for route in self._buckets.get(_bucket(parts), ()):
            params = route.match(parts)
            if params is None:
                continue
            if route.row.method == method:
                return route.row, params, [method]
            allowed.append(route.row.method)
        return None, {}, sorted(allowed)


def _calls_in(body: Any) -> int:
    """How many calls a ``POST /calls`` body makes (its checks come with its parameters;
    at most the batch's limit, at least one)."""
    calls = body.get("calls") if isinstance(body, dict) else None
    return max(1, min(len(calls), MAX_CALLS)) if isinstance(calls, list) else 1


_IN_PROCESS = Caller()


_RATED = frozenset({"call", "search"})
"""The rows a caller's call rate is spent on (a batch spends one a call, below)."""


NOBODY = Grant("agent", Profile("unknown-peer", ()), bound=True)
"""The grant of a connection whose connecting process is gone while engine runs are in
flight: no capability, no operator row."""


class Api:
    """The socket API: one handler for every request, routed by the operator table."""

    def __init__(self, services: Services, *, max_body_bytes: int,
                 limiter: RateLimiter | None = None, runs: EngineRuns | None = None) -> None:
        self._services = services
        self._runs = runs
        # peer -> the grant of the engine run it belongs to (None: none), per connection
        self._run_grants: dict[int, tuple[Caller, Grant | None]] = {}
        self.max_body_bytes = max_body_bytes
        self._limiter = limiter or RateLimiter(0, 1)
        self._ids = RequestIds()
        self.router = Router(COMMANDS)
        self._callers: dict[tuple[int, str | None, int], tuple[Caller, Grant, Caller]] = {}

    def hooks(self) -> ServerHooks:
        """What the HTTP server calls."""
        return ServerHooks(handler=self.handle, peer_of=peer_credentials,
                           too_large=self.too_large, malformed=self.malformed,
                           max_body_bytes=self.max_body_bytes)

    def too_large(self) -> HttpResponse:
        """413: the body is over the limit."""
        return problem(413, "Payload Too Large",
                       f"request body is larger than {self.max_body_bytes} bytes; "
                       "send less, or raise max_body_bytes in capd.toml")

    @staticmethod
    def malformed(detail: str) -> HttpResponse:
        """400: the request is not HTTP/1.1 capd can read."""
        return problem(400, "Bad Request", detail)

    def _over_rate(self, caller: Caller, count: int) -> HttpResponse | None:
        """The refusal of ``count`` calls over the caller's rate (or over the burst, which
        no wait would let through); None when they may run."""
        limiter = self._limiter
        if limiter.rate_per_s > 0 and count > limiter.burst:
            return problem(400, "Bad Request", (
                f"a batch of {count} calls is more than the call burst ({limiter.burst}); "
                "send at most that many at once"))
        wait_s = limiter.take(caller, count)
        if wait_s is None:
            return None
        response = problem(429, "Too Many Requests",
                           f"uid {caller.uid} is over its call rate; retry later")
        response.headers["Retry-After"] = str(max(1, round(wait_s)))
        return response

    def _run_grant(self, peer: Caller) -> Grant | None:
        """The grant of the engine run ``peer`` belongs to (read once per connection, and
        only while runs are in flight); None when it belongs to none."""
        runs = self._runs
        if runs is None or not runs.active or peer.pid is None:
            return None
        found = self._run_grants.get(id(peer))
        if found is not None and found[0] is peer:
            return found[1]
        grant = runs.grant_of(peer.pid)
        if grant is None and not os.path.exists(f"/proc/{peer.pid}"):
            # the process that connected has exited (it may have handed the connection to
            # a descendant of a run): whose it is cannot be known, so it is nobody's
            grant = NOBODY
        if len(self._run_grants) >= 4096:
            self._run_grants.clear()
        self._run_grants[id(peer)] = (peer, grant)
        return grant

    async def handle(self, request: HttpRequest) -> HttpResponse:
        """Answer one request."""
        headers = request.headers
        if "origin" in headers or "referer" in headers:
            return problem(403, "Forbidden", "requests carrying Origin or Referer are refused: "
                           "a browser must never drive the capd socket")
        row, path_params, allowed = self.router.match(request.method, request.path)
        if row is None:
            if allowed:
                return problem(405, "Method Not Allowed",
                               f"{request.method} {request.path}: use {', '.join(allowed)}")
            return problem(404, "Not Found",
                           f"{request.method} {request.path}: no such route; see GET /status")
        peer: Caller = request.peer or _IN_PROCESS
        # Who the peer is, under the configuration serving now (a reload re-decides).
        authority = self._services.policy.authority
        try:
            run_grant = self._run_grant(peer)
            # an agent's engine, and everything it started, is that agent: never the
            # operator whose uid it may run under
            grant = run_grant if run_grant is not None else authority.grant_for(peer)
            narrowing = headers.get(GRANT_HEADER)
            if narrowing is not None:
                grant = authority.narrow(grant, narrowing)
        except PeerRefused as exc:
            log.warning("peer_denied", uid=peer.uid, gid=peer.gid, pid=peer.pid,
                        path=request.path)
            return problem(403, "Forbidden", str(exc))
        except GrantRefused as exc:
            return problem(403, "Forbidden", str(exc))
        except BadRequest as exc:
            return problem(400, "Bad Request", str(exc))
        if grant.role not in row.roles:
            log.warning("operator_only_denied", uid=peer.uid, pid=peer.pid, command=row.id,
                        grant=grant.describe())
            return problem(403, "Forbidden", (
                f"{' '.join(row.cli)} is for operators only"
                f"{f' ({row.operator_only})' if row.operator_only else ''}; this caller is "
                f"an agent ({grant.describe()}). Run it as root or the daemon's user, or add "
                "the uid to operator_uids in capd.toml"))
        session = headers.get("capd-session")
        caller = peer
        if session or grant is not peer.grant:
            # One Caller per connection, session and grant, made once (the entry holds
            # the peer and the grant, so neither id can be reused while it is kept).
            key = (id(peer), session, id(grant))
            found = self._callers.get(key)
            if found is not None and found[0] is peer and found[1] is grant:
                caller = found[2]
            else:
                try:
                    qualified = session_of(peer, session, grant) if session else None
                except BadRequest as exc:
                    return problem(400, "Bad Request", str(exc))
                caller = Caller(peer.pid, peer.uid, peer.gid, qualified, peer.groups, grant)
                if len(self._callers) >= 4096:
                    self._callers.clear()
                self._callers[key] = (peer, grant, caller)
        if row.id in _RATED:
            refused = self._over_rate(caller, 1)
            if refused is not None:
                return refused
        request_id = headers.get("x-request-id") or self._ids.next()
        bind_contextvars(request_id=request_id)
        try:
            body: Any = None
            if row.method == "POST" and request.body.strip():
                body = parse_body(request.body)
            if row.id == "call-many":  # a token for each call of the batch, read once
                refused = self._over_rate(caller, _calls_in(body))
                if refused is not None:
                    refused.headers["X-Request-Id"] = request_id
                    return refused
            query = (dict(parse_qsl(request.query_string, keep_blank_values=True))
                     if request.query_string else {})
            args = validate(row.params, " ".join(row.cli), path_params, query, headers, body)
            ctx = Context(services=self._services, caller=caller, request_id=request_id,
                          headers=headers,
                          gone=request.connection.gone if request.connection else None)
            if tracing.TRACER is not None and "traceparent" in headers:
                # the caller's trace: a call's spans are its children
                token = tracing.attach(headers)
                try:
                    reply = await HANDLERS[row.handler](ctx, args)
                finally:
                    tracing.detach(token)
            else:
                reply = await HANDLERS[row.handler](ctx, args)
        except USER_CODE_FAILURES as exc:  # every failure (a plugin's SystemExit too)
            # becomes a problem+json answer, never the daemon's end
            response = _problem_for(exc, request.path)
            response.headers["X-Request-Id"] = request_id
            return response
        try:
            return _to_response(reply, request_id)
        except (Unencodable, SystemExit, KeyboardInterrupt) as exc:  # a body JSON cannot hold
            # (or a plugin's serializer that exited): say so, never a bare 500
            log.error("reply_unencodable", path=request.path, error=str(exc))
            response = problem(500, "Internal Error",
                               f"the answer cannot be written as JSON: {exc}")
            response.headers["X-Request-Id"] = request_id
            return response
