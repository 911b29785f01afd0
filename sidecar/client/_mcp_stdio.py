"""``capd mcp``'s protocol: MCP's JSON-RPC on stdin and stdout, spoken without the SDK.

The bridge is a relay: every answer comes from the daemon, and what it adds is the
protocol around the :class:`~._mcp.Bridge`. The SDK's server validated every message
through its models (about a millisecond of CPU a call here) and its import alone took a
second and 50 MiB; this module speaks the protocol itself, a JSON object a line:

- the handshake (``initialize``, versions 2024-11-05 to 2025-11-25: the client's when
  it is one of them, else the newest), ``ping``, ``logging/setLevel``;
- ``tools/list``, ``tools/call``, ``resources/list``, ``resources/templates/list``,
  ``resources/read``, ``prompts/list``, ``prompts/get``; anything else is
  ``-32601 Method not found``;
- each request runs as a task of its own, so a slow call holds up nothing else, and
  ``notifications/cancelled`` cancels it (no answer is sent for it, as the spec asks);
- a call's progress goes out as ``notifications/progress`` to the request's
  ``_meta.progressToken``, its log lines as ``notifications/message``, a server's
  sampling or elicitation request as a request of the bridge's own to the client (only
  when the client declared that capability), its answer relayed back;
- ``notifications/{tools,resources,prompts}/list_changed`` when what the client was
  shown changes (tools in direct mode; resources and prompts once listed).

stdin and stdout are read and written by the event loop when they are pipes or
sockets (as MCP clients launch the bridge); otherwise (a file, a terminal) by a
thread, line by line.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
from typing import Any

import orjson

from .._paths import capd_version
from ._mcp import METHOD_NOT_FOUND, Bridge, BridgeError, trace_headers

HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603
INSTRUCTIONS = ("Find capabilities with search_capabilities, read one with get_capability, "
                "call it with invoke_capability.")


class _Lines(asyncio.Protocol):
    """stdin as lines, read by the event loop (no limit on a line's length)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._buf = bytearray()
        self.pump: asyncio.Task[None] | None = None  # the thread-read fallback's task

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while (end := self._buf.find(b"\n")) >= 0:
            self.queue.put_nowait(bytes(self._buf[:end]))
            del self._buf[:end + 1]

    def eof_received(self) -> bool:
        if self._buf.strip():
            self.queue.put_nowait(bytes(self._buf))
        self._buf.clear()
        self.queue.put_nowait(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.queue.put_nowait(None)


EOF_GRACE_S = 10.0
"""How long requests in flight when stdin ends may take to be answered."""

class _StdioPeer:
    """The client of one request, for the bridge: its progress token, its capabilities."""

    def __init__(self, server: StdioServer, meta: dict[str, Any]) -> None:
        self._server, self._token = server, meta.get("progressToken")
        self.answers, self.trace = server.answers, trace_headers(meta)

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        if self._token is None:
            return
        params: dict[str, Any] = {"progressToken": self._token, "progress": progress}
        params |= {k: v for k, v in (("total", total), ("message", message)) if v is not None}
        await self._server.notify("notifications/progress", params)

    async def log(self, level: str, data: Any, logger: str | None) -> None:
        params = {"level": level, "data": data, **({"logger": logger} if logger else {})}
        await self._server.notify("notifications/message", params)

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return await self._server.ask(method, params)


class StdioServer:
    """One client on stdin/stdout, served by ``bridge``."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        self.answers: frozenset[str] = frozenset()
        self._write: Any = None
        self._requests: dict[Any, asyncio.Task[None]] = {}
        self._asked: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._ask_ids = itertools.count(1)
        self._watch: asyncio.Task[None] | None = None

    # -- the wire -------------------------------------------------------------------

    async def _send(self, message: dict[str, Any]) -> None:
        self._write(orjson.dumps(message) + b"\n")

    async def _error(self, request_id: Any, code: int, message: str) -> None:
        await self._send({"jsonrpc": "2.0", "id": request_id,
                          "error": {"code": code, "message": message}})

    def _abandon(self) -> None:
        """Fail every question still waiting for the client: nobody is left to answer it."""
        for future in self._asked.values():
            if not future.done():
                future.set_exception(BridgeError("the client has gone"))

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        """Send a notification to the client."""
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self._send(message)

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send the client a request and wait for its result; raise :class:`BridgeError`
        with its error."""
        request_id = f"capd-{next(self._ask_ids)}"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._asked[request_id] = future
        try:
            await self._send({"jsonrpc": "2.0", "id": request_id, "method": method,
                              "params": params})
            return await future
        finally:
            self._asked.pop(request_id, None)

    async def serve(self, lines: asyncio.Queue[bytes | None], write: Any) -> None:
        """Read messages until stdin ends; answer each request in a task of its own. At the
        end of stdin (a client that sent its last requests and closed it), the requests in
        flight are answered first, for :data:`EOF_GRACE_S` at most."""
        self._write = write
        try:
            while (line := await lines.get()) is not None:
                if line.strip():
                    await self._receive(line)
            self._abandon()
            if self._requests:
                await asyncio.wait(list(self._requests.values()), timeout=EOF_GRACE_S)
        finally:
            for task in [*self._requests.values(), *([self._watch] if self._watch else [])]:
                task.cancel()
            await asyncio.gather(*self._requests.values(), return_exceptions=True)
            self._abandon()

    async def _receive(self, line: bytes) -> None:
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            await self._error(None, PARSE_ERROR, f"Parse error: {exc}")
            return
        for item in message if isinstance(message, list) else [message]:
            await self._one(item)

    async def _one(self, message: Any) -> None:
        if not isinstance(message, dict):
            await self._error(None, INVALID_REQUEST, "Invalid Request: not a JSON object")
            return
        method, request_id = message.get("method"), message.get("id")
        if method is None:  # the client's answer to a request of ours
            future = self._asked.get(str(request_id))
            if future is not None and not future.done():
                error = message.get("error")
                if isinstance(error, dict):
                    future.set_exception(BridgeError(str(error.get("message", "refused")),
                                                     int(error.get("code", INTERNAL_ERROR))))
                else:
                    future.set_result(message.get("result") or {})
            return
        params = message.get("params") or {}
        if request_id is None:
            self._notification(str(method), params)
            return
        task = asyncio.ensure_future(self._request(request_id, str(method), params))
        self._requests[request_id] = task
        task.add_done_callback(lambda _t: self._requests.pop(request_id, None))

    def _notification(self, method: str, params: dict[str, Any]) -> None:
        if method == "notifications/cancelled":
            task = self._requests.get(params.get("requestId"))
            if task is not None:
                task.cancel()  # no answer goes out for it
        elif method == "notifications/initialized" and self._watch is None:
            self._watch = asyncio.ensure_future(self.bridge.watch(
                lambda kind: self.notify(f"notifications/{kind}/list_changed")))

    async def _request(self, request_id: Any, method: str, params: dict[str, Any]) -> None:
        try:
            result = await self._dispatch(request_id, method, params)
        except asyncio.CancelledError:
            return  # cancelled by the client: the spec wants no answer
        except BridgeError as exc:
            await self._error(request_id, exc.code, exc.message)
        except Exception as exc:  # a bug of the bridge's: the client still gets an answer
            await self._error(request_id, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
        else:
            await self._send({"jsonrpc": "2.0", "id": request_id, "result": result})

    # -- the methods ----------------------------------------------------------------

    async def _dispatch(self, request_id: Any, method: str,
                        params: dict[str, Any]) -> dict[str, Any]:
        bridge = self.bridge
        match method:
            case "initialize":
                return self._initialize(params)
            case "ping" | "logging/setLevel":
                return {}
            case "tools/list":
                return await bridge.list_tools()
            case "tools/call":
                meta = params.get("_meta")
                peer = _StdioPeer(self, meta if isinstance(meta, dict) else {})
                return await bridge.call_tool(str(_needs(params, "name")),
                                              params.get("arguments"), peer)
            case "resources/list":
                return await bridge.list_resources()
            case "resources/templates/list":
                return await bridge.list_resource_templates()
            case "resources/read":
                return await bridge.read_resource(str(_needs(params, "uri")))
            case "prompts/list":
                return await bridge.list_prompts()
            case "prompts/get":
                return await bridge.get_prompt(str(_needs(params, "name")),
                                               params.get("arguments"))
        raise BridgeError(f"Method not found: {method}", METHOD_NOT_FOUND)

    def _initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        asked = params.get("protocolVersion")
        version = asked if asked in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[-1]
        declared = params.get("capabilities") or {}
        self.answers = frozenset(k for k in ("sampling", "elicitation")
                                 if isinstance(declared, dict) and k in declared)
        return {
            "protocolVersion": version,
            "capabilities": {
                "tools": {"listChanged": self.bridge.direct_tags is not None},
                "resources": {"listChanged": True},
                "prompts": {"listChanged": True},
                "logging": {},
            },
            "serverInfo": {"name": "capd", "version": capd_version()},
            "instructions": INSTRUCTIONS,
        }


def _needs(params: dict[str, Any], key: str) -> Any:
    if key not in params:
        raise BridgeError(f"Invalid params: {key} is required", -32602)
    return params[key]


async def _stdin_lines() -> asyncio.Queue[bytes | None]:
    """stdin's lines: read by the loop from a pipe or socket, else by a thread."""
    loop = asyncio.get_running_loop()
    protocol = _Lines()
    try:  # a copy of the descriptor: the transport closes its own, never sys.stdin's
        await loop.connect_read_pipe(lambda: protocol, os.fdopen(os.dup(0), "rb", buffering=0))
    except (ValueError, OSError):  # a file or a terminal: a thread reads it
        async def pump() -> None:
            while line := await asyncio.to_thread(sys.stdin.buffer.readline):
                protocol.queue.put_nowait(line.rstrip(b"\n"))
            protocol.queue.put_nowait(None)

        protocol.pump = asyncio.ensure_future(pump())
    return protocol.queue


async def _stdout_writer() -> Any:
    """A function writing bytes to stdout: the loop's pipe transport, else plain writes."""
    loop = asyncio.get_running_loop()
    try:  # a copy of the descriptor, as for stdin
        transport, _protocol = await loop.connect_write_pipe(
            asyncio.Protocol, os.fdopen(os.dup(1), "wb", buffering=0))
    except (ValueError, OSError):
        def write(data: bytes) -> None:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()

        return write
    return transport.write


async def refuse(reason: str) -> None:
    """A bridge that cannot start: answer each request (``initialize`` first) with an error
    saying why, until the client goes away — so the client shows the reason, not only
    "connection closed"."""
    lines, write = await _stdin_lines(), await _stdout_writer()
    while (line := await lines.get()) is not None:
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(message, dict) and message.get("id") is not None and \
                message.get("method") is not None:
            write(orjson.dumps({"jsonrpc": "2.0", "id": message["id"], "error": {
                "code": INVALID_REQUEST, "message": reason}}) + b"\n")


async def serve(bridge: Bridge) -> None:
    """Serve MCP on stdin and stdout until the client goes away."""
    server = StdioServer(bridge)
    try:
        await server.serve(await _stdin_lines(), await _stdout_writer())
    finally:
        with contextlib.suppress(Exception):
            await bridge.link.close()
