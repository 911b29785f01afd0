"""The MCP front door over streamable HTTP, served by the daemon for bearer tokens.

``[mcp.http]`` in capd.toml turns it on: the SDK's streamable-HTTP session manager
(spec 2025-06-18 and later: one MCP session per client, its own progress,
cancellation and server-to-client requests) behind a small ASGI gate, served by
uvicorn in the daemon's own event loop on ``listen`` (loopback unless TLS or
``insecure_plaintext`` is set). Every request passes the gate in this order:

1. the path is ``path`` (``/mcp``), else 404;
2. an ``Origin`` header that is not in ``allowed_origins`` is refused with 403 (the
   DNS-rebinding protection the spec asks for; the session manager also checks
   ``Host``);
3. ``Authorization: Bearer capd_...`` must name a token that is known, not revoked
   and not expired (``_tokens.py``), read anew at every request; else 401 with a
   ``WWW-Authenticate`` header saying why. A session is bound to the token that
   opened it: another token's request for it is answered as if it did not exist.

What a session offers is what ``capd mcp`` offers (the same :class:`Bridge`), with
one hop less: its requests go straight to the socket API's handler in process, as a
caller whose grant is the token's — an agent held to the token's profile and/or
allow list and channel (the profile read from the configuration serving now), on
every surface, with the same hidden-is-unknown and 403 answers as on the socket;
its calls are rate-limited, loop-counted and keyed by the token.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import ssl
from collections import OrderedDict
from collections.abc import Callable
from email.utils import formatdate
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlencode

import orjson
import structlog

from ._grant import Caller, Grant, Narrowing
from ._http import MAX_HEADER_BYTES, HttpRequest
from ._tokens import TokenRecord, TokenRefused, TokenStore

if TYPE_CHECKING:
    from ._api import Api
    from ._authority import Authority
    from ._config import McpHttpConfig

log = structlog.get_logger("capd.mcp_http")

TOKEN_SCOPE_KEY = "capd.token"


class LocalLink:
    """The bridge's link to the daemon, in process: a request is handed to the socket
    API's handler with the token's caller as its peer (no socket, no JSON hop back)."""

    def __init__(self, api: Api, door: FrontDoor, record: TokenRecord, session: str) -> None:
        self._api, self._door = api, door
        self.record = record
        self.agent_session = session
        self._peer: tuple[Grant, Caller] | None = None

    def _caller(self) -> Caller:
        grant = self._door.grant_for(self.record)
        if self._peer is None or self._peer[0] is not grant:
            self._peer = (grant, Caller(groups=frozenset(), grant=grant))
        return self._peer[1]

    async def request(self, method: str, path: str, *, query: dict[str, str] | None = None,
                      body: Any = None, headers: dict[str, str] | None = None,
                      on_chunk: Callable[[bytes], Any] | None = None) -> tuple[int, Any]:
        """What the socket API answers ``method path``: (status, the JSON body); a
        streamed answer's chunks go to ``on_chunk`` (its body is then None)."""
        raw_path, _, raw_query = path.partition("?")
        query_string = "&".join(q for q in (raw_query, urlencode(query or {})) if q)
        all_headers = {"capd-session": self.agent_session,
                       **{k.lower(): v for k, v in (headers or {}).items()}}
        payload = orjson.dumps(body) if method == "POST" and body is not None else b""
        response = await self._api.handle(HttpRequest(
            method, unquote(raw_path), query_string, all_headers, payload, self._caller()))
        if response.stream is not None:
            async def send(piece: bytes) -> None:
                if on_chunk is not None:
                    await on_chunk(piece)

            await response.stream.run(send, asyncio.Event())
            return response.status, None
        if not response.body:
            return response.status, None
        if "json" in response.content_type:
            return response.status, orjson.loads(response.body)
        return response.status, response.body.decode("utf-8", "replace")

    async def close(self) -> None:
        """Nothing to close: no connection is held."""


class FrontDoor:
    """The ASGI app: the gate, then the SDK's session manager over per-session bridges."""

    def __init__(self, api: Api, tokens: TokenStore, config: Callable[[], McpHttpConfig],
                 authority: Callable[[], Authority]) -> None:
        from mcp.server.lowlevel import NotificationOptions, Server
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
        from mcp.server.transport_security import TransportSecuritySettings

        from capd.sidecar.client._mcp import Bridge

        from .._paths import capd_version

        self._api, self._tokens = api, tokens
        self._config, self._authority = config, authority
        self.connections: Any = None  # the DoorConnections serve() holds it to
        self._bridge_type = Bridge
        # One bridge per MCP session (by its Mcp-Session-Id), the least recently used
        # forgotten past the session cap (its session has ended or idled out by then).
        self._bridges: OrderedDict[str, Any] = OrderedDict()
        self._grants: dict[tuple[int, str], tuple[Any, Grant]] = {}
        settings = config()
        host, port = settings.host_port
        server: Server[Any] = Server(
            "capd", version=capd_version(),
            instructions="Find capabilities with search_capabilities, read one with "
            "get_capability, call it with invoke_capability.",
            **{f"on_{kind}": self._sdk(kind, args) for kind, args in _ASKS.items()})
        self.server = server
        self.options = server.create_initialization_options(
            NotificationOptions(resources_changed=True, prompts_changed=True))
        hosts = [f"{host}:{port}", f"{host}:*", "127.0.0.1:*", "localhost:*", "[::1]:*"]
        self.manager = StreamableHTTPSessionManager(
            server, security_settings=TransportSecuritySettings(
                enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                allowed_origins=list(settings.allowed_origins)),
            session_idle_timeout=settings.session_idle_timeout_s,
            max_sessions=settings.max_sessions)

    def grant_for(self, record: TokenRecord) -> Grant:
        """The grant of a token under the configuration serving now (one object per
        token and configuration generation: what the gateway's chain cache keys on)."""
        authority = self._authority()
        key = (id(authority), record.id)
        found = self._grants.get(key)
        if found is not None and found[0] is authority:
            return found[1]
        profile = authority.profiles.get(record.profile) if record.profile else None
        if record.profile is not None and profile is None:
            raise TokenRefused(f"token {record.name!r} is bound to profile {record.profile!r}, "
                               "which capd.toml no longer declares")
        narrowing = (Narrowing(frozenset(record.allow), frozenset(), None, f"token {record.name}")
                     if record.allow else None)
        if profile is None and narrowing is None:  # a record that names no reach reaches none
            raise TokenRefused(f"token {record.name!r} names neither a profile nor an allow "
                               "list; make a new one")
        # named by its id too: a token made later under the same name is another caller
        grant = Grant("agent", profile, narrowing, record.channel, bound=True,
                      token=f"{record.name}.{record.id}")
        if len(self._grants) > 4096:
            self._grants.clear()
        self._grants[key] = (authority, grant)
        return grant

    def _sdk(self, kind: str, args: Callable[[Any, Any], tuple[Any, ...]]) -> Any:
        """The SDK's handler of ``kind`` (``call_tool``): the session's bridge answers in
        JSON (its method ``kind``, with ``args(ctx, params)``), made into the SDK's result
        (``CallToolResult``) here; a :class:`BridgeError` becomes the SDK's ``MCPError``."""
        import mcp_types
        from mcp.shared.exceptions import MCPError

        from capd.sidecar.client._mcp import BridgeError

        model = getattr(mcp_types, kind.title().replace("_", "") + "Result")

        async def handle(ctx: Any, params: Any) -> Any:
            bridge = self._bridge(ctx)
            try:
                answer = await getattr(bridge, kind)(*args(ctx, params))
            except BridgeError as exc:
                raise MCPError(exc.code, exc.message) from exc
            return model.model_validate(answer)

        return handle

    def _bridge(self, ctx: Any) -> Any:
        """The bridge of this MCP session (made at its first request), holding the token
        that this request passed the gate with."""
        record: TokenRecord = ctx.request.scope[TOKEN_SCOPE_KEY]
        session_id = ctx.request.headers.get("mcp-session-id") or "stateless"
        key = f"{record.id}:{session_id}"
        bridge = self._bridges.get(key)
        if bridge is None:
            # the agent session capd counts loops and consent by: the MCP session's
            bridge = self._bridge_type(
                LocalLink(self._api, self, record, _session_name(session_id)))
            self._bridges[key] = bridge
            while len(self._bridges) > self._config().max_sessions + 64:
                self._bridges.popitem(last=False)
        else:
            self._bridges.move_to_end(key)
        link = bridge.link
        assert isinstance(link, LocalLink)
        link.record = record
        return bridge

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The gate (path, Origin, token), then the session manager."""
        if scope["type"] != "http":
            return
        settings = self._config()
        if scope.get("path") != settings.path:
            await _answer(send, 404, f"no MCP endpoint here; it is {settings.path}")
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        origin = headers.get("origin")
        if origin is not None and not _origin_allowed(origin, settings.allowed_origins):
            log.warning("mcp_http_origin_refused", origin=origin[:200])
            await _answer(send, 403, f"requests from Origin {origin[:200]!r} are refused; "
                          "an operator may add it to [mcp.http] allowed_origins")
            return
        presented = headers.get("authorization", "")
        try:
            record = self._tokens.check(_bearer(presented))
            self.grant_for(record)  # a token whose profile went away is refused here too
        except TokenRefused as exc:
            reason = str(exc).replace('"', "'")
            if exc.__cause__ is not None:  # the token file: said to the log, not the caller
                log.error("mcp_http_token_file_unreadable", error=str(exc))
                reason = "capd cannot check tokens now; the operator's log says why"
            error = "" if not presented else ', error="invalid_token"'
            await _answer(send, 401, str(exc), {
                "www-authenticate": f'Bearer realm="capd"{error}, error_description="{reason}"'})
            return
        from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
        from mcp.server.auth.provider import AccessToken

        scope[TOKEN_SCOPE_KEY] = record
        # the session manager binds a session to the principal that opened it
        scope["user"] = AuthenticatedUser(AccessToken(token="", client_id=record.id, scopes=[]))
        await self.manager.handle_request(scope, receive, send)


def _no_args(ctx: Any, params: Any) -> tuple[Any, ...]:
    return ()


_ASKS: dict[str, Callable[[Any, Any], tuple[Any, ...]]] = {
    "list_tools": _no_args, "list_resources": _no_args, "list_resource_templates": _no_args,
    "list_prompts": _no_args,
    "call_tool": lambda ctx, params: (params.name, params.arguments, _SdkPeer(ctx)),
    "read_resource": lambda ctx, params: (str(params.uri),),
    "get_prompt": lambda ctx, params: (params.name, params.arguments)}
"""The MCP requests a front door serves: the bridge's method of that name answers each,
with these arguments from the request (its SDK context and params)."""


class _SdkPeer:
    """The client of one request, through the SDK's request context."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx
        declared = getattr(ctx.session, "client_capabilities", None)
        self.answers = frozenset(k for k in ("sampling", "elicitation")
                                 if declared is not None and getattr(declared, k, None))
        from capd.sidecar.client._mcp import trace_headers

        meta: Any = getattr(ctx, "meta", None)  # the request's _meta, a model with extras
        dump = getattr(meta, "model_dump", None)
        self.trace = trace_headers(dump() if callable(dump) else meta)

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        await self._ctx.session.report_progress(progress, total, message)

    async def log(self, level: str, data: Any, logger: str | None) -> None:
        await self._ctx.session.send_log_message(level, data, logger,
                                                 related_request_id=self._ctx.request_id)

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        import mcp_types as types
        from mcp.shared.message import ServerMessageMetadata

        from capd.sidecar.client._mcp import BridgeError

        kinds: dict[str, tuple[Any, Any]] = {
            "sampling/createMessage": (types.CreateMessageRequest, types.CreateMessageResult),
            "elicitation/create": (types.ElicitRequest, types.ElicitResult)}
        try:
            request_type, result_type = kinds[method]
            result = await self._ctx.session.send_request(
                request_type.model_validate({"method": method, "params": params}), result_type,
                metadata=ServerMessageMetadata(related_request_id=self._ctx.request_id))
        except Exception as exc:  # the client refused, or cannot: the server is told why
            error = getattr(exc, "error", None)
            raise BridgeError(getattr(error, "message", None) or f"{type(exc).__name__}: {exc}",
                              getattr(error, "code", -32603)) from exc
        answer: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        return answer


def _bearer(header: str) -> str | None:
    """The token of an ``Authorization: Bearer ...`` header (None when there is none);
    raise :class:`TokenRefused` for another scheme."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        raise TokenRefused("use Authorization: Bearer <token>")
    return token.strip() or None


def _session_name(session_id: str) -> str:
    """A Capd-Session name for an MCP session id (1-64 letters, digits, '.', '_', '-')."""
    kept = "".join(c for c in session_id if c.isalnum() or c in "._-")
    return (kept or "mcp")[-64:]


def _origin_allowed(origin: str, allowed: list[str]) -> bool:
    for pattern in allowed:
        if origin == pattern:
            return True
        if pattern.endswith(":*") and origin.startswith(pattern[:-1]) and \
                origin[len(pattern) - 1:].isdigit():  # "http://localhost:*": a port, only
            return True
    return False


async def _answer(send: Any, status: int, detail: str,
                  headers: dict[str, str] | None = None) -> None:
    body = orjson.dumps({"status": status, "detail": detail})
    raw = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    raw += [(k.encode(), v.encode("latin-1", "replace")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def bind(settings: McpHttpConfig) -> socket.socket:
    """The listening socket of ``listen``; raise :class:`OSError` saying which address."""
    host, port = settings.host_port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(512)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"[mcp.http] listen {settings.listen}: {exc.strerror}") from exc
    sock.setblocking(False)
    return sock


def door_config(door: FrontDoor, settings: McpHttpConfig,
                max_connections: int | None = None) -> Any:
    """The loaded uvicorn configuration of ``door`` under ``settings``: its TLS files read
    now (raises :class:`OSError` or :class:`ssl.SSLError` naming what is wrong), its
    connections held to the caps and timeouts of ``settings`` (``_door_guard.py``),
    ``max_connections`` lowering the cap to what the daemon's descriptors allow."""
    import uvicorn

    from ._door_guard import DoorConnections, guarded_h11

    cap = min(settings.max_connections, max_connections or settings.max_connections)
    connections = DoorConnections(cap, min(cap, settings.max_connections_per_peer),
                                  settings.head_timeout_s)
    door.connections = connections
    config = uvicorn.Config(
        door, lifespan="off", log_level="warning", access_log=False, loop="none",
        # h11 bounds a request's head (httptools took a 64 MiB header whole, per
        # connection); the guard bounds connections and their heads' time (uvicorn's
        # limit_concurrency would answer 503 to token holders behind idle connections)
        http=guarded_h11(connections), h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        timeout_keep_alive=settings.idle_timeout_s,  # type: ignore[arg-type]
        ssl_certfile=settings.tls_cert, ssl_keyfile=settings.tls_key)
    config.load()  # reads the certificate and key: a bad one fails here, not later
    return config


SHUTDOWN_GRACE_S = 2.0
"""How long answers being written get when a door stops."""


async def serve(door: FrontDoor, config: Any, sock: socket.socket,
                settings: McpHttpConfig, stop: asyncio.Event) -> None:
    """Serve ``door`` (its loaded ``config``) on ``sock`` until ``stop`` is set, in this
    event loop: uvicorn's h11 protocol behind a listener of the door's own, so that a TLS
    handshake is bounded by ``head_timeout_s`` and handshakes under way count against
    the connection cap (uvicorn's server would neither time nor count them)."""
    from uvicorn.server import ServerState

    from ._door_guard import PendingTls, accept_tls

    state = ServerState()
    loop = asyncio.get_running_loop()
    connections = door.connections
    assert connections is not None
    make_http = functools.partial(config.http_protocol_class, config=config,
                                  server_state=state, app_state={}, _loop=loop)

    async def keep_date() -> None:  # what uvicorn's server loop did: Date on every answer
        while True:
            date = formatdate(usegmt=True).encode()
            state.default_headers = [(b"date", date), *config.encoded_headers]
            await asyncio.sleep(1.0)

    tls = config.ssl is not None
    handshakes: set[asyncio.Task[None]] = set()
    async with door.manager.run():
        # With TLS, connections are accepted here, counted first and their handshakes run
        # after (accept_tls); without, the h11 protocol counts itself when it is made.
        server = None if tls else await loop.create_server(make_http, sock=sock, backlog=512)
        acceptor = (asyncio.create_task(accept_tls(sock, connections, config.ssl, make_http,
                                                   handshakes)) if tls else None)
        dating = asyncio.create_task(keep_date())
        log.info("mcp_http_listening", listen=settings.listen, path=settings.path, tls=tls)
        try:
            await stop.wait()
        finally:
            dating.cancel()
            connections.closed = True  # a handshake finishing now is dropped
            if acceptor is not None:
                acceptor.cancel()
                sock.close()
            for pending in [c for c in connections.connections if isinstance(c, PendingTls)]:
                pending.abort()
            for task in list(handshakes):
                task.cancel()
            if server is not None:
                server.close()
            # requests being answered (a call's POST) finish before the sessions end
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SHUTDOWN_GRACE_S):
                    while _answering(state.connections):  # noqa: ASYNC110 (no event to wait on)
                        await asyncio.sleep(0.05)
    # The session manager has ended its sessions (their streams end as answers do);
    # connections finish what they are writing, then close.
    for connection in list(state.connections):
        connection.shutdown()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(SHUTDOWN_GRACE_S):
            while state.tasks:
                await asyncio.wait(set(state.tasks))
    for task in list(state.tasks):
        task.cancel()
    for connection in list(state.connections):
        connection.transport.abort()


def _answering(connections: Any) -> bool:
    """Whether a request other than a stream (a POST: a call, a listing) is being answered."""
    return any(c.cycle is not None and not c.cycle.response_complete
               and c.scope is not None and c.scope.get("method") == "POST"
               for c in list(connections))


class FrontDoors:
    """The HTTP front door across reloads: ``[mcp.http]`` added, removed or changed
    (listen, path, origins, TLS, limits) takes effect at the reload that reads it.

    :meth:`switch` binds a new address first (a failure fails that reload, and the door
    serving now keeps serving), then stops the door serving now (its sessions end) and
    starts the new one; an unchanged table changes nothing. A listening socket is kept
    while its address stays the same (each server gets a duplicate of it), so a change of
    origins or TLS never drops the port. :meth:`close` stops them when the daemon stops.
    """

    STOP_GRACE_S = 5.0

    def __init__(self, make_door: Callable[[McpHttpConfig], FrontDoor],
                 max_connections: int) -> None:
        self._make_door = make_door
        self._max_connections = max_connections
        self.settings: McpHttpConfig | None = None
        self.door: FrontDoor | None = None
        self._sock: socket.socket | None = None
        self._serving: tuple[asyncio.Task[None], asyncio.Event] | None = None

    async def switch(self, settings: McpHttpConfig | None) -> None:
        """Serve ``settings`` (None: no front door) from now on. Raises :class:`OSError`
        naming the address when a new one cannot be bound; nothing changes then."""
        serving = self._serving is not None and not self._serving[0].done()
        if settings == self.settings and (settings is None or serving):
            return  # unchanged and serving (a door whose server died is started again)
        old = self.settings
        sock = self._sock if settings is not None else None
        door, config = None, None
        if settings is not None:  # before anything stops: a failure changes nothing
            door = self._make_door(settings)
            try:
                config = door_config(door, settings, self._max_connections)
            except ssl.SSLError as exc:
                raise OSError(exc.errno or 0, f"[mcp.http] tls_cert/tls_key: {exc}") from exc
            except OSError as exc:
                raise OSError(exc.errno, f"[mcp.http] tls_cert/tls_key: {exc.strerror} "
                              f"({exc.filename})") from exc
            if old is None or settings.listen != old.listen:
                sock = bind(settings)
        await self._stop_serving()
        if self._sock is not None and self._sock is not sock:
            self._sock.close()
        self.settings, self._sock, self.door = settings, sock, door
        if settings is None or sock is None or door is None:
            if old is not None:
                log.info("mcp_http_closed", listen=old.listen)
            return
        stop = asyncio.Event()
        task = asyncio.create_task(serve(door, config, sock.dup(), settings, stop),
                                   name="mcp-http")
        task.add_done_callback(_log_door_failure)
        self._serving = (task, stop)

    async def close(self) -> None:
        """Stop the door serving (its sessions end) and let go of its address."""
        await self._stop_serving()
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def view(self) -> dict[str, Any] | None:
        """What ``capd status`` shows of the front door (None: there is none)."""
        settings = self.settings
        if settings is None:
            return None
        connections = self.door.connections if self.door is not None else None
        return {"listen": settings.listen, "path": settings.path,
                "tls": settings.tls_cert is not None,
                "allowed_origins": list(settings.allowed_origins),
                "serving": self._serving is not None and not self._serving[0].done(),
                "connections": None if connections is None else {
                    "open": len(connections.connections),
                    "max": connections.max_connections,
                    "evicted": connections.evicted, "refused": connections.refused,
                    "head_timeouts": connections.timed_out}}

    async def _stop_serving(self) -> None:
        serving, self._serving = self._serving, None
        if serving is None:
            return
        task, stop = serving
        stop.set()
        done, _ = await asyncio.wait({task}, timeout=self.STOP_GRACE_S)
        if not done:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _log_door_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("mcp_http_failed", error=repr(task.exception()))
