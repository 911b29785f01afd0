"""Sessions to upstream MCP servers: one client session per server, held by a task.

A tool of kind ``mcp`` is an MCP server, reached over stdio (``command``) or
streamable HTTP (``url``) with the official SDK client. The :class:`UpstreamPool`
holds one session per server (a task owns it: the SDK's transports must be
entered and left in one task), opens it with the handshake (initialize +
tools/list within ``timeout_s``), pings it as its probe, reconnects on the next
probe after it is lost (the back-off is the re-probe cooldown and interval), and
calls tools under ``call_timeout_s``.

Stalls. A ping has a deadline of its own (``ping_timeout_s``, 5 s). A call
that gets no answer within ``call_timeout_s`` has the server pinged at once: a
server that answers is slow, and the call fails as transient (the SDK has
asked the server to cancel it); one that does not answer is stalled (a blocked
loop, SIGSTOP), and its session is torn down — a stdio server's process group is
killed by the SDK's escalation, SIGKILL last — so the call is ``tool_unavailable``,
the server is down, and the next probe starts it again: it heals with no reload.

Bounded answers. A stdio server runs behind ``_relay.py`` (a script, same stdin,
stderr and process group): a message over ``max_result_bytes`` (16 MiB) is dropped
there, in pieces, and replaced by an error answering the same request, so the call is
``error_permanent`` / ``result_too_large`` with the size, the daemon never decodes or
holds the answer, and the session stays usable. A streamable-HTTP server's answer is
bounded alike: a JSON answer by capd's HTTP client (its body is not read past the limit),
an SSE one by the SDK's event limit set to the same size.

A server's ``notifications/tools/list_changed`` calls ``on_tools_changed`` (the
daemon refreshes that server's tools, and the new list becomes its capabilities).

Calls as they happen. A call's progress notifications go to the stream of the
caller that made it (:mod:`._events`), and a caller that goes away cancels the
call (the SDK sends the server ``notifications/cancelled``, as it does past
``call_timeout_s``). A server's sampling and elicitation requests and its log
messages go to the caller of the call they belong to, and to no other. Over
streamable HTTP they come on that call's own response stream, and capd reads which
(``_relations.CallsInFlight``): a request whose call has ended, or that came on no
call's stream, is refused. Over stdio they name no call: capd relays them to the
caller of the one call in flight, and only when no other call to that server
overlapped it (else it cannot know whose it is); it refuses a request (with why) when
there is no such call or its caller cannot answer — it never sends one to another
client. A log line it cannot place goes to capd's own log.

Resources and prompts. A server that offers them has its lists read at the
handshake (and again after its ``list_changed``); :class:`UpstreamPool` serves them
under the server's prefix: a prompt ``<prefix>.<name>``, a resource
``capd://<prefix>/<the server's uri>`` (templates alike).

A lost session makes a call raise :class:`ToolUnavailable`, so a mutating call is
queued and the server marked down until a probe passes. The server's tools become
capabilities in :mod:`._upstream`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from ._events import KIND_OF_METHOD, CannotAsk, current_events
from ._model import McpProbe
from ._outcomes import PermanentToolError, ToolUnavailable, TransientToolError
from ._relations import CALL_META, CallsInFlight, Relations
from ._upstream import UnknownOffer, name_prefix, offer_as_json, split_resource_uri

if TYPE_CHECKING:  # the SDK's types are imported when an upstream is used
    import mcp_types as types

log = structlog.get_logger("capd.upstream")


class UpstreamError(Exception):
    """The server could not be reached or did not complete the handshake."""


RELAY = Path(__file__).with_name("_relay.py")
"""Run as a script in front of every stdio server (see its docstring)."""
_RESULT_OF = {"sampling/createMessage": "CreateMessageResult",
              "elicitation/create": "ElicitResult"}
"""The result type (in ``mcp_types``) of each request a server may make of a caller."""
DROP_WAIT_S = 15.0
"""How long a teardown waits for the SDK to stop a server (stdin closed, 2 s, SIGTERM to
its process group, 2 s, SIGKILL) before it cancels the session's task."""


class Upstream:
    """One MCP server and the session capd holds to it."""

    def __init__(self, tool_id: str, spec: McpProbe,
                 on_tools_changed: Callable[[str], object]) -> None:
        self.tool_id = tool_id
        self.spec = spec
        self.tools: list[types.Tool] = []  # the last list the server gave
        self._on_tools_changed = on_tools_changed
        self._session: Any = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock = asyncio.Lock()
        self._stale = False  # the server said its list changed: list again before use
        self._teardowns: set[asyncio.Task[None]] = set()  # stalled sessions being closed
        self._holding: asyncio.Task[None] | None = None  # the task waiting on its stop
        self._calls = CallsInFlight(tool_id, Relations() if spec.url is not None else None)
        # What the server offers beside tools (read at the handshake, again once stale).
        self.offers: dict[str, list[Any]] = {"resources": [], "templates": [], "prompts": []}
        self.server: dict[str, Any] | None = None  # what the handshake said it is
        self.since: float | None = None  # when it connected, or was lost (epoch)
        self.last_error: str | None = None
        self._offers_stale = False
        # The last handshake failed: the capabilities were made without this server's list,
        # so the next one that succeeds says the list changed (they are made again).
        self._handshake_failed = False

    def view(self) -> dict[str, Any]:
        """What an operator reads of this server: connected or not and since when, what it
        said it is, its tools, calls in flight and its last error."""
        return {"kind": "stdio" if self.spec.command is not None else "http",
                "connected": self.connected, "since": self.since, "server": self.server,
                "tools": len(self.tools), "in_flight": len(self._calls),
                "last_error": self.last_error}

    @property
    def connected(self) -> bool:
        """Whether a session is open."""
        return self._session is not None and self._task is not None and not self._task.done()

    async def ensure(self) -> list[types.Tool]:
        """Open the session if it is not open (the handshake); return the server's tools."""
        async with self._lock:
            if self.connected:
                if self._stale:
                    self._stale = False
                    self.tools = await _list_all(self._session)
                return self.tools
            await self._drop()
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[list[types.Tool]] = loop.create_future()
            self._stop = asyncio.Event()
            self._task = loop.create_task(self._hold(ready, self._stop),
                                          name=f"capd-upstream-{self.tool_id}")
            # the handshake's outcome is read here, or dropped here: never left unread
            ready.add_done_callback(lambda f: f.cancelled() or f.exception())
            try:
                async with asyncio.timeout(self.spec.timeout_s):
                    self.tools = await asyncio.shield(ready)
            except TimeoutError:
                self._handshake_failed = True
                await self._drop()
                raise UpstreamError(
                    f"no MCP handshake within {self.spec.timeout_s:g}s") from None
            except BaseException:
                self._handshake_failed = True
                await self._drop()
                raise
            if self._handshake_failed:
                self._handshake_failed = False
                log.info("upstream_late", tool=self.tool_id, tools=len(self.tools))
                self._on_tools_changed(self.tool_id)
            return self.tools

    async def probe(self) -> None:
        """The probe: the handshake when there is no session, else a ping under its own
        deadline; a session that misses it is torn down (and started again next time)."""
        if not self.connected:
            await self.ensure()
            return
        problem = await self._ping()
        if problem is not None:
            await self._drop()
            raise UpstreamError(problem)

    async def _ping(self) -> str | None:
        """None when the server answers a ping in time, else what went wrong."""
        session = self._session
        if session is None:
            return "the session was lost"
        try:
            async with asyncio.timeout(self.spec.ping_timeout_s):
                await session.send_ping()
        except TimeoutError:
            return (f"it did not answer a ping within {self.spec.ping_timeout_s:g}s (stalled); "
                    "its session is torn down and the server started again")
        except Exception as exc:
            return f"the session was lost ({type(exc).__name__}: {exc})"
        return None

    async def call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Call one of the server's tools; raise :class:`ToolUnavailable` when it is gone."""
        session = self._session_or_unavailable()
        events = current_events()
        progress = None
        if events is not None:
            async def progress(done: float, total: float | None, message: str | None) -> None:
                events.progress(done, total, message)
        token = self._calls.start(events)
        try:
            result: types.CallToolResult = await session.call_tool(
                name, arguments, read_timeout_seconds=self.spec.call_timeout_s,
                progress_callback=progress,
                meta={CALL_META: token} if self._calls.relations is not None else None)
        except Exception as exc:
            if _timed_out(exc):
                raise await self._after_timeout(name) from exc
            too_large = _too_large(exc)
            if too_large is not None:
                raise ResultTooLarge(f"MCP server {self.tool_id} answered {name} with "
                                     f"{too_large}; raise max_result_bytes for this tool, "
                                     "or ask for less") from exc
            if isinstance(exc, OSError | EOFError) or not self.connected or _looks_closed(exc):
                await self._drop()
                raise ToolUnavailable(f"MCP server {self.tool_id} went away "
                                      f"({type(exc).__name__}: {exc})",
                                      tool=self.tool_id) from exc
            raise
        finally:
            self._calls.end(token)
        return result

    async def _ask(self, method: str, context: Any, params: Any) -> Any:
        """A server-to-client request (the SDK's sampling or elicitation callback, with
        ``method`` bound), relayed to the caller of the call that made it."""
        import mcp_types as types

        result_type = getattr(types, _RESULT_OF[method])
        try:
            events = self._calls.caller_of_request(KIND_OF_METHOD[method],
                                                   getattr(context, "request_id", None))
            raw = await events.ask(method, params.model_dump(mode="json", by_alias=True,
                                                             exclude_none=True))
            return result_type.model_validate(raw)
        except CannotAsk as exc:
            log.info("upstream_request_refused", tool=self.tool_id, method=method,
                     reason=str(exc))
            return types.ErrorData(code=types.INVALID_REQUEST, message=str(exc))
        except ValueError as exc:
            return types.ErrorData(code=types.INVALID_PARAMS,
                                   message=f"the client's answer to {method} is not valid: {exc}")

    async def _logging(self, params: Any) -> None:
        """A log line goes to the caller of the call it belongs to, else to capd's log."""
        events = self._calls.caller_of_log(params)
        if events is not None:
            events.log(str(params.level), params.logger, params.data)
            return
        log.info("upstream_log", tool=self.tool_id, level=str(params.level),
                 logger=params.logger, data=params.data)

    async def offered(self, kind: str) -> list[Any]:
        """The server's resources, resource templates or prompts (``kind``), read again
        when it said they changed; what it offered last when it cannot be asked now."""
        session = self._session if self.connected else None
        if session is not None and self._offers_stale:
            self._offers_stale = False
            with contextlib.suppress(Exception):
                self.offers = await _list_offers(session)
        return list(self.offers[kind])

    def _session_or_unavailable(self) -> Any:
        session = self._session if self.connected else None
        if session is None:
            raise ToolUnavailable(f"MCP server {self.tool_id} is not connected; capd "
                                  "reconnects at the next probe", tool=self.tool_id)
        return session

    async def read_resource(self, uri: str) -> Any:
        """``resources/read`` of the server's ``uri``."""
        session = self._session_or_unavailable()
        async with asyncio.timeout(self.spec.call_timeout_s):
            return await session.read_resource(uri)

    async def get_prompt(self, name: str, arguments: dict[str, str]) -> Any:
        """``prompts/get`` of the server's prompt ``name``."""
        session = self._session_or_unavailable()
        async with asyncio.timeout(self.spec.call_timeout_s):
            return await session.get_prompt(name, arguments)

    async def _after_timeout(self, name: str) -> Exception:
        """What a call that got no answer in time raises: a transient timeout when the
        server still answers a ping (slow), :class:`ToolUnavailable` when it does not
        (stalled: the session is torn down in the background, the server marked down)."""
        waited = f"{self.spec.call_timeout_s:g}s"
        problem = await self._ping()
        if problem is None:
            return TransientToolError(
                f"MCP server {self.tool_id} did not answer {name} within {waited} "
                "(call_timeout_s); it was asked to cancel the call")
        log.warning("upstream_stalled", tool=self.tool_id, tool_name=name, problem=problem)
        self._tear_down()
        return ToolUnavailable(f"MCP server {self.tool_id} did not answer {name} within "
                               f"{waited}, and {problem}", tool=self.tool_id)

    def _tear_down(self) -> None:
        """Close the session in a task of this upstream's own (the caller does not wait
        out the SDK's kill escalation); the session is gone for callers at once."""
        task = asyncio.get_running_loop().create_task(
            self._drop(), name=f"capd-upstream-teardown-{self.tool_id}")
        self._session = None
        self._teardowns.add(task)
        task.add_done_callback(self._teardown_done)

    def _teardown_done(self, task: asyncio.Task[None]) -> None:
        self._teardowns.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("upstream_teardown_failed", tool=self.tool_id,
                        error=repr(task.exception()))

    async def close(self) -> None:
        """Leave the session (a stdio server's process ends with it), and wait for the
        teardowns of stalled ones."""
        async with self._lock:
            await self._drop()
        if self._teardowns:
            await asyncio.gather(*self._teardowns, return_exceptions=True)

    async def _drop(self) -> None:
        task, stop = self._task, self._stop
        self._session = None
        self._task = self._stop = None
        if task is None:
            return
        if stop is not None:
            stop.set()
        if task is not self._holding:  # still in its handshake: nothing waits on stop
            task.cancel()
        try:
            async with asyncio.timeout(DROP_WAIT_S):
                await asyncio.wait([task])
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def _hold(self, ready: asyncio.Future[list[types.Tool]], stop: asyncio.Event) -> None:
        """Open the transport and the session, publish them, and hold them until ``stop``."""
        from mcp import ClientSession  # the SDK is imported only when an upstream is used
        from mcp.client.streamable_http import streamable_http_client

        from ._bounded_http import bounded_http_client
        from ._stdio import stdio_transport

        spec = self.spec
        try:
            async with contextlib.AsyncExitStack() as stack:
                if spec.command is not None:
                    # The server runs behind the relay (same stdin, stderr and process
                    # group): an answer over max_result_bytes never reaches this loop.
                    argv = [sys.executable, "-I", str(RELAY), "--max-bytes",
                            str(spec.max_result_bytes), "--", *spec.command]
                    streams = await stack.enter_async_context(
                        stdio_transport(argv, dict(spec.env) or None, sys.stderr))
                else:
                    assert spec.url is not None
                    client = await stack.enter_async_context(
                        bounded_http_client(spec.max_result_bytes, self._calls.relations))
                    streams = await stack.enter_async_context(streamable_http_client(
                        spec.url, http_client=client,
                        max_sse_event_size=spec.max_result_bytes))
                read, write = streams[0], streams[1]
                session = await stack.enter_async_context(
                    ClientSession(read, write, message_handler=self._message,
                                  sampling_callback=partial(self._ask,
                                                            "sampling/createMessage"),
                                  elicitation_callback=partial(self._ask,
                                                               "elicitation/create"),
                                  logging_callback=self._logging))
                hello = await session.initialize()
                tools = await _list_all(session)
                self.offers = await _list_offers(session)
                self._session = session
                info = getattr(hello, "server_info", None)
                self.server = ({"name": info.name, "version": info.version}
                               if info is not None else None)
                self.since, self.last_error = time.time(), None
                if not ready.done():
                    ready.set_result(tools)
                log.info("upstream_connected", tool=self.tool_id, tools=len(tools))
                self._holding = asyncio.current_task()
                await stop.wait()
        except BaseException as exc:  # every failure is the handshake's (or the session's)
            why = f"{type(exc).__name__}: {exc}"
            if not ready.done():
                ready.set_exception(UpstreamError(why))
            if isinstance(exc, asyncio.CancelledError):
                raise
            log.warning("upstream_lost", tool=self.tool_id, error=why)
            self.last_error = why
        finally:
            if self._session is not None:
                self.since = time.time()  # since when it is not connected
            self._session = None

    async def _message(self, message: Any) -> None:
        import mcp_types as types

        if isinstance(message, types.ToolListChangedNotification):
            log.info("upstream_tools_changed", tool=self.tool_id)
            self._stale = True
            self._on_tools_changed(self.tool_id)
        elif isinstance(message, types.ResourceListChangedNotification | \
                        types.PromptListChangedNotification):
            self._offers_stale = True


class ResultTooLarge(PermanentToolError):
    """The server's answer was over ``max_result_bytes``: dropped before it was read."""

    error_type = "result_too_large"


_SSE_TOO_LARGE = re.compile(r"Server-sent event exceeded the (\d+) byte limit")


def _too_large(exc: Exception) -> str | None:
    """What was said of an answer over ``max_result_bytes``: by the relay of a stdio
    server (``the answer is N bytes; ...``), or by the bounded HTTP client (a JSON answer)
    or the SDK's event limit (an SSE answer) of a streamable-HTTP one."""
    message = str(getattr(getattr(exc, "error", None), "message", ""))
    if "result_too_large: " in message:
        return message.partition("result_too_large: ")[2]
    sse = _SSE_TOO_LARGE.search(message)
    if sse is not None:
        return f"an event over {sse.group(1)} bytes (max_result_bytes)"
    return None


def _timed_out(exc: Exception) -> bool:
    """The SDK's "the request timed out" (its read timeout, ``call_timeout_s``)."""
    import mcp_types as types

    error = getattr(exc, "error", None)
    return getattr(error, "code", None) == types.REQUEST_TIMEOUT


def _looks_closed(exc: Exception) -> bool:
    """anyio's errors for a stream whose other end is gone, or the SDK's "connection closed"."""
    if type(exc).__name__ in ("ClosedResourceError", "BrokenResourceError", "EndOfStream"):
        return True
    import mcp_types as types

    error = getattr(exc, "error", None)
    return getattr(error, "code", None) == types.CONNECTION_CLOSED


async def _list_all(session: Any) -> list[types.Tool]:
    tools: list[types.Tool] = []
    await _page_into(tools, session.list_tools, "tools")
    return tools


async def _page_into(items: list[Any], method: Any, field_name: str,
                     max_pages: int | None = None) -> None:
    """Extend ``items`` with every page ``method`` lists (at most ``max_pages``)."""
    import mcp_types as types

    cursor: str | None = None
    pages = 0
    while max_pages is None or pages < max_pages:
        page = await method(
            params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        items.extend(getattr(page, field_name))
        cursor, pages = page.next_cursor, pages + 1
        if not cursor:
            return


async def _list_offers(session: Any) -> dict[str, list[Any]]:
    """The resources, resource templates and prompts a server offers (none of a kind
    it does not declare; a listing that fails is an empty one, logged)."""
    offers: dict[str, list[Any]] = {"resources": [], "templates": [], "prompts": []}
    capabilities = session.server_capabilities
    listings = []
    if capabilities is not None and capabilities.resources is not None:
        listings += [("resources", session.list_resources, "resources"),
                     ("templates", session.list_resource_templates, "resource_templates")]
    if capabilities is not None and capabilities.prompts is not None:
        listings.append(("prompts", session.list_prompts, "prompts"))
    for kind, method, field_name in listings:
        try:  # a server paging forever is not followed forever
            await _page_into(offers[kind], method, field_name, max_pages=1000)
        except Exception as exc:
            log.warning("upstream_listing_failed", kind=kind, error=repr(exc))
    return offers


class UpstreamPool:
    """The daemon's sessions to its MCP servers, by tool id (kept across reloads)."""

    def __init__(self, on_tools_changed: Callable[[str], object] = lambda _t: None) -> None:
        self._upstreams: dict[str, Upstream] = {}
        self._on_tools_changed = on_tools_changed

    async def call(self, tool_id: str, name: str, arguments: dict[str, Any]
                   ) -> types.CallToolResult:
        """Call ``name`` on the server ``tool_id``."""
        upstream = self._upstreams.get(tool_id)
        if upstream is None:
            raise ToolUnavailable(f"MCP server {tool_id} is not configured any more",
                                  tool=tool_id)
        return await upstream.call(name, arguments)

    def get(self, tool_id: str, spec: McpProbe) -> Upstream:
        """The upstream for ``tool_id``; a changed spec replaces the old one (closed later)."""
        current = self._upstreams.get(tool_id)
        if current is not None and current.spec == spec:
            return current
        upstream = Upstream(tool_id, spec, self._on_tools_changed)
        self._upstreams[tool_id] = upstream
        if current is not None:
            asyncio.get_running_loop().create_task(current.close())
        return upstream

    async def tools(self, tool_id: str, spec: McpProbe) -> tuple[list[types.Tool], str | None]:
        """The server's tools (a handshake if needed) and the error when it did not answer
        (then the tools it listed last, if it ever did: they stay, disabled with it)."""
        upstream = self.get(tool_id, spec)
        try:
            return await upstream.ensure(), None
        except Exception as exc:
            return list(upstream.tools), str(exc)

    def views(self) -> dict[str, dict[str, Any]]:
        """Every upstream server's :meth:`Upstream.view`, by tool id."""
        return {tool_id: u.view() for tool_id, u in sorted(self._upstreams.items())}

    def prefixes(self) -> dict[str, Upstream]:
        """Every upstream by the prefix its names carry."""
        return {name_prefix(tool_id, u.spec): u for tool_id, u in self._upstreams.items()}

    async def offered(self, kind: str) -> list[tuple[str, Upstream, dict[str, Any]]]:
        """What every server offers of ``kind`` (``resources``, ``templates``,
        ``prompts``), named under its prefix: (prefix, upstream, the item as JSON)."""
        out: list[tuple[str, Upstream, dict[str, Any]]] = []
        for prefix, upstream in sorted(self.prefixes().items()):
            for item in await upstream.offered(kind):
                out.append((prefix, upstream, offer_as_json(prefix, kind, item)))
        return out

    def resource_server(self, uri: str) -> tuple[Upstream, str]:
        """The upstream a ``capd://<prefix>/<uri>`` names and the server's own uri; raise
        :class:`UnknownOffer` for any other."""
        prefix, own = split_resource_uri(uri)
        upstream = self.prefixes().get(prefix)
        if upstream is None:
            raise UnknownOffer(f"no MCP server has the prefix {prefix!r} (from {uri!r}); "
                               "list resources with GET /resources")
        return upstream, own

    def prompt_server(self, name: str) -> tuple[Upstream, str]:
        """The upstream of prompt ``<prefix>.<name>`` and the server's own name."""
        prefix, dot, own = name.partition(".")
        upstream = self.prefixes().get(prefix) if dot else None
        if upstream is None:
            raise UnknownOffer(f"unknown prompt {name!r}: a prompt is named "
                               "<server prefix>.<its name>; list them with GET /prompts")
        return upstream, own

    async def close(self) -> None:
        """Close every session."""
        await asyncio.gather(*(u.close() for u in self._upstreams.values()),
                             return_exceptions=True)
        self._upstreams.clear()
