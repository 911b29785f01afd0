"""``capd mcp``: an MCP server on stdio that forwards to the running daemon.

Meta mode (the default) offers four tools, rendered from the operator table
rows that carry an :class:`McpTool`: ``search_capabilities``,
``get_capability``, ``list_capabilities`` and ``invoke_capability`` — so an
agent discovers capabilities lazily instead of loading hundreds of schemas.
``--expose direct --tag T`` also offers each matching live capability as a
tool of its own, and announces ``notifications/tools/list_changed`` when one
is disabled or restored.

The daemon may be down: each tool then answers with ``is_error`` and a clear
sentence, and the next call reconnects by itself. A profile limits every
tool to the capabilities (or tags) it names; ``--allow a,b,c`` does the same for
exactly the capabilities listed (what ``capd agent resolve`` hands an agent's
runtime); ``--channel`` says which conversation channel the agent speaks from.
The bridge does not enforce any of it itself: it sends them with every request
(the ``Capd-Grant`` header) and the daemon holds the bridge to them on every
surface — calls, fallbacks, alternatives, pre-flight, search, list, show,
export, agents, topologies — as a narrowing of the grant its uid already has,
never a widening. A capability may be named through one of its aliases; the
daemon resolves it and checks the capability it resolved to.
"""

from __future__ import annotations

import contextlib
import json
import re
import tomllib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import anyio
from pydantic import ValidationError

from capd.registry import ConfigError, is_valid_reference, without_mark

from .._args import Wire, to_wire
from .._errors import DaemonDown, problems_said
from .._table import COMMANDS, MAX_PAGE, OperatorCommand
from ._unixhttp import OnChunk

META_TOOLS: dict[str, OperatorCommand] = {row.mcp.name: row for row in COMMANDS if row.mcp}
# Operator rows an operator may offer agents ([mcp] operator_tools in capd.toml), by row id.
OPERATOR_TOOLS: dict[str, OperatorCommand] = {
    row.id: row for row in COMMANDS if row.optional_mcp}
_OPERATOR_ROWS = {row.optional_mcp.name: row for row in COMMANDS if row.optional_mcp}


@dataclass(frozen=True)
class Profile:
    """The capabilities (by id, alias or tag) one agent may see and call."""

    name: str
    capabilities: frozenset[str] = frozenset()
    tags: frozenset[str] = frozenset()

    def allows(self, name: str, tags: list[str] | tuple[str, ...],
               aliases: list[str] | tuple[str, ...] = ()) -> bool:
        """Whether the capability ``name`` (with ``tags`` and ``aliases``) is in the profile.

        ``name`` must be the canonical name the daemon answered with, never
        what the agent typed: an alias is admitted only as the capability it
        belongs to.
        """
        return (name in self.capabilities or not self.capabilities.isdisjoint(aliases)
                or bool(self.tags & set(tags)))


def load_profile(path: Path) -> Profile:
    """Read a profile TOML: ``name``, ``capabilities = [...]``, ``tags = [...]``."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"profile {path} not found") from exc
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"profile {path}: {exc}") from exc
    unknown = set(data) - {"name", "capabilities", "tags"}
    if unknown:
        raise ConfigError(f"profile {path}: unknown key {', '.join(sorted(unknown))}")
    caps, tags = data.get("capabilities", []), data.get("tags", [])
    if not isinstance(caps, list) or not isinstance(tags, list) or not (caps or tags):
        raise ConfigError(f"profile {path}: list capabilities = [...] and/or tags = [...]")
    return Profile(str(data.get("name", path.stem)),
                   frozenset(without_mark(str(c)) for c in caps),
                   frozenset(map(str, tags)))


ALLOW_PROFILE = "--allow"


def allow_profile(text: str) -> Profile:
    """The profile ``--allow a,b,c`` stands for: exactly these capability names.

    Raise ValueError for an empty list or an entry that is not a capability name
    (a glob or a tag is resolved by ``capd agent resolve``, never by the bridge).
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError("name at least one capability")
    bad = [n for n in names if not is_valid_reference(n)]
    if bad:
        raise ValueError(f"{', '.join(repr(b) for b in bad)}: not a capability name or alias "
                         "(globs and tags are not taken here; capd agent resolve expands them)")
    return Profile(ALLOW_PROFILE, frozenset(without_mark(n) for n in names))


def grant_header(profile: Profile | None, channel: str | None) -> str | None:
    """The ``Capd-Grant`` header that holds the daemon to ``profile`` and ``channel``."""
    if profile is None and channel is None:
        return None
    body: dict[str, Any] = {}
    if profile is not None:
        body["label"] = (ALLOW_PROFILE if profile.name == ALLOW_PROFILE
                         else f"profile {profile.name}")
        if profile.capabilities:
            body["allow"] = sorted(profile.capabilities)
        if profile.tags:
            body["tags"] = sorted(profile.tags)
    if channel is not None:
        body["channel"] = channel
    return json.dumps(body, separators=(",", ":"))


class Link(Protocol):
    """How a bridge reaches the daemon: over its socket (:class:`DaemonLink`), or in the
    daemon's own process (the MCP front door over HTTP)."""

    async def request(self, method: str, path: str, *, query: dict[str, str] | None = None,
                      body: Any = None, headers: dict[str, str] | None = None,
                      on_chunk: OnChunk | None = None) -> tuple[int, Any]:
        """(status, the JSON body) of the socket API's answer; raise :class:`DaemonDown`."""
        ...

    async def close(self) -> None:
        """Let go of what the link holds."""
        ...


def _request_of(row: OperatorCommand, tool: str, arguments: dict[str, Any]) -> Wire:
    """The request that carries a tool's arguments to its row; :class:`BadArguments`
    naming each one that does not fit (as the daemon would, but in the tool's words). An
    argument its schema does not list is left out, as a model's extra words are."""
    taken = row.schema()["properties"]
    try:
        args = row.params.model_validate({k: v for k, v in arguments.items() if k in taken})
    except ValidationError as exc:
        raise BadArguments(f"{problems_said(exc.errors(include_url=False))} (see {tool}'s "
                           "input schema)") from None
    return to_wire(row.path, row.params, args.model_dump(mode="json", exclude_unset=True))


class BadArguments(ValueError):
    """A tool's arguments do not fit its schema."""


def _terse(value: Any) -> str:
    """``value`` as the model reads it: compact JSON, without the keys that say nothing
    (null, empty lists and objects) — the structured content keeps every key."""
    def bare(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: bare(v) for k, v in node.items() if v not in (None, [], {})}
        if isinstance(node, list):
            return [bare(v) for v in node]
        return node

    return json.dumps(bare(value), separators=(",", ":"), ensure_ascii=False)


def _text(value: Any, *, is_error: bool) -> dict[str, Any]:
    """A tools/call result holding ``value`` as text (and as structured content when it
    is an object)."""
    text = value if isinstance(value, str) else _terse(value)
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": is_error}
    if isinstance(value, dict):
        result["structuredContent"] = value
    return result


BLOCK_TYPES = frozenset({"text", "image", "audio", "resource", "resource_link"})


def _block(raw: Any) -> dict[str, Any] | None:
    """An MCP content block as the server gave it (None for what is not one)."""
    return raw if isinstance(raw, dict) and raw.get("type") in BLOCK_TYPES else None


def _without_data(raw: Any) -> Any:
    """A block as the model reads it in text: base64 payloads replaced by their size."""
    if not isinstance(raw, dict):
        return raw
    out = dict(raw)
    if isinstance(out.get("data"), str):
        out["data"] = f"<{len(out['data']) * 3 // 4} bytes, in the block that follows>"
    resource = out.get("resource")
    if isinstance(resource, dict) and isinstance(resource.get("blob"), str):
        out["resource"] = {**resource, "blob": f"<{len(resource['blob']) * 3 // 4} bytes, "
                           "in the block that follows>"}
    return out


def _problem(status: int, body: Any) -> dict[str, Any]:
    detail = body.get("detail") if isinstance(body, dict) else body
    payload = body if isinstance(body, dict) else {"status": status, "detail": detail}
    return {"content": [{"type": "text", "text": f"{detail}"}], "structuredContent": payload,
            "isError": True}


class BridgeError(Exception):
    """A request the bridge answers with a JSON-RPC error (``code``, the message)."""

    def __init__(self, message: str, code: int = -32603) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


INVALID_PARAMS = -32602
METHOD_NOT_FOUND = -32601


_TRACE_FORMS = {"traceparent": re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}"),
                "tracestate": re.compile(r"[\x20-\x7e]{1,512}")}


def trace_headers(meta: Any) -> dict[str, str]:
    """The W3C trace context of an MCP request's ``_meta`` (``traceparent``, ``tracestate``)
    as headers for the daemon: only well-formed values, nothing else of the client's."""
    if not isinstance(meta, dict):
        return {}
    return {key: value for key, form in _TRACE_FORMS.items()
            if isinstance(value := meta.get(key), str) and form.fullmatch(value)}


class Peer(Protocol):
    """The MCP client a request came from, as the bridge talks back to it."""

    @property
    def answers(self) -> frozenset[str]:
        """What it declared it can answer: ``sampling``, ``elicitation``."""
        ...

    @property
    def trace(self) -> dict[str, str]:
        """The W3C trace context the client sent with this request (``_meta.traceparent``,
        ``_meta.tracestate``) as headers, so that the daemon's spans join its trace."""
        ...

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """Report progress on this request (nothing when it asked for none)."""
        ...

    async def log(self, level: str, data: Any, logger: str | None) -> None:
        """A log message about this request."""
        ...

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Ask the client (sampling, elicitation) about this request; raise
        :class:`BridgeError` with its refusal."""
        ...


class _Relay:
    """One streamed call's events, relayed to the MCP client whose call it is: progress
    to its progressToken, log lines as log messages, a server's sampling or elicitation
    request to the client (and its answer back to the daemon)."""

    def __init__(self, link: Link, peer: Peer) -> None:
        self._link, self._peer = link, peer
        self._pending = b""
        self.result: tuple[int, Any] | None = None

    async def feed(self, chunk: bytes) -> None:
        """Take a piece of the stream; act on each whole line."""
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            if line.strip():
                await self._event(json.loads(line))

    async def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "result":
            self.result = (int(event["http_status"]), event["tool_result"])
        elif kind == "progress":
            with contextlib.suppress(Exception):  # a client gone meanwhile
                await self._peer.progress(float(event["progress"]), event.get("total"),
                                          event.get("message"))
        elif kind == "log":
            with contextlib.suppress(Exception):
                await self._peer.log(event.get("level") or "info", event.get("data"),
                                     event.get("logger"))
        elif kind == "request":
            await self._answer(event)

    async def _answer(self, event: dict[str, Any]) -> None:
        """Ask this client what the server asked; send its answer (or refusal) back."""
        answer: dict[str, Any]
        try:
            result = await self._peer.ask(str(event.get("method")), event.get("params") or {})
            answer = {"result": result}
        except BridgeError as exc:  # the client refused, or cannot: the server is told why
            answer = {"error": {"code": exc.code, "message": exc.message}}
        await self._link.request("POST", str(event["answer"]), body=answer)


def _tool(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "description": description, "inputSchema": schema}


@dataclass
class Bridge:
    """What a front door offers an MCP client, in JSON: the meta tools, the direct ones,
    resources and prompts, each answered by the daemon under this bridge's grant.

    The protocol around it is another module's: ``_mcp_stdio.py`` (``capd mcp``, no SDK)
    or the daemon's HTTP front door (the SDK's session manager). Errors are
    :class:`BridgeError`; results are the MCP results as JSON objects.
    """

    link: Link
    profile: Profile | None = None
    direct_tags: frozenset[str] | None = None
    poll_s: float = 2.0
    # The meta tools listed: "brief" (search, get, invoke, terse) or "full"; None: what
    # the daemon's [mcp] tools says.
    tool_set: str | None = None
    _daemon_tool_set: str = "brief"
    _direct: dict[str, dict[str, Any]] = field(default_factory=dict)
    _operator: dict[str, OperatorCommand] = field(default_factory=dict)  # offered, by name
    # What the client was last shown of the upstreams' resources and prompts (by kind),
    # once it has listed them: watched, and list_changed sent when it changes.
    _offers_seen: dict[str, frozenset[str]] = field(default_factory=dict)

    # ------------------------------------------------------------ helpers

    async def _capsules(self) -> list[dict[str, Any]]:
        """Every capability this bridge may see (the daemon filters by its grant)."""
        caps: list[dict[str, Any]] = []
        cursor: str | None = "0"
        while cursor is not None:
            status, body = await self.link.request(
                "GET", "/capabilities", query={"limit": str(MAX_PAGE), "cursor": cursor})
            if status != 200:
                raise DaemonDown(f"capd answered {status} to GET /capabilities")
            caps += body["capabilities"]
            cursor = body["next_cursor"]
        return caps

    async def validate_profile(self) -> None:
        """Every capability the profile names must exist; raise :class:`ConfigError`."""
        if self.profile is None or not self.profile.capabilities:
            return
        known: set[str] = set()
        with contextlib.suppress(DaemonDown):
            known = {n for c in await self._capsules() for n in (c["name"], *c.get("aliases", ()))}
        unknown = sorted(self.profile.capabilities - known)
        if unknown:
            raise ConfigError(f"profile {self.profile.name}: unknown capability "
                              f"{', '.join(repr(u) for u in unknown)}")

    async def _refresh_direct(self) -> bool:
        """Recompute the directly exposed tools; True when the set changed."""
        if self.direct_tags is None:
            return False
        tools: dict[str, dict[str, Any]] = {}
        for capsule in await self._capsules():
            if capsule["state"] != "live":
                continue
            if self.direct_tags and not self.direct_tags & set(capsule["tags"]):
                continue
            known = self._direct.get(capsule["name"])
            if known is None:
                status, manifest = await self.link.request(
                    "GET", f"/capabilities/{capsule['name']}")
                if status != 200:
                    continue
                # an upstream's tool keeps what its server said (title, annotations,
                # outputSchema) beside capd's name, description and input schema
                extra = manifest.get("upstream_tool") or {}
                known = {**{k: v for k, v in extra.items()
                            if k in ("title", "annotations", "outputSchema", "icons")},
                         **_tool(capsule["name"], manifest["summary"], manifest["parameters"])}
            tools[capsule["name"]] = known
        changed = set(tools) != set(self._direct)
        self._direct = tools
        return changed

    async def _refresh_operator(self) -> None:
        """The operator tools the daemon's ``[mcp] operator_tools`` offers this bridge now
        (those its grant may use: an agent's grant never reloads)."""
        status, body = await self.link.request("GET", "/whoami")
        offers = body.get("mcp", {}) if status == 200 and isinstance(body, dict) else {}
        names = offers.get("operator_tools", [])
        self._daemon_tool_set = str(offers.get("tools", "brief"))
        self._operator = {row.optional_mcp.name: row for row_id, row in OPERATOR_TOOLS.items()
                          if row_id in names and row.optional_mcp}

    # ---------------------------------------------------------------- tools

    async def list_tools(self) -> dict[str, Any]:
        """The meta tools, plus the direct ones when exposed."""
        with contextlib.suppress(DaemonDown):  # offered again once the daemon answers
            await self._refresh_operator()
        if (self.tool_set or self._daemon_tool_set) == "full":
            tools = [_tool(name, row.mcp.description, row.schema())
                     for name, row in META_TOOLS.items() if row.mcp]
        else:  # the other meta tools still answer when called: they are only not listed
            tools = [_tool(name, row.mcp.brief, row.schema(brief=True))
                     for name, row in META_TOOLS.items() if row.mcp and row.mcp.brief]
        tools += [_tool(name, row.optional_mcp.description, row.schema())
                  for name, row in self._operator.items() if row.optional_mcp]
        if self.direct_tags is not None:
            # When the daemon is down the meta tools still answer, each with the reason.
            with contextlib.suppress(DaemonDown):
                await self._refresh_direct()
            tools += list(self._direct.values())
        return {"tools": tools}

    async def call_tool(self, name: str, arguments: dict[str, Any] | None,
                        peer: Peer | None = None) -> dict[str, Any]:
        """Route one tool call to the daemon."""
        arguments = dict(arguments or {})
        try:
            if name in META_TOOLS:
                return await self._call_meta(name, arguments, peer)
            if name in _OPERATOR_ROWS:
                await self._refresh_operator()  # the operator may have turned it off since
                if name in self._operator:
                    return await self._call_operator(name, arguments)
            if self.direct_tags is not None and name not in self._direct:
                await self._refresh_direct()  # a call may come before any tools/list
            if self.direct_tags is not None and name in self._direct:
                return await self._invoke(name, arguments, None, direct=True, peer=peer)
        except (DaemonDown, BadArguments) as exc:
            return _text(str(exc), is_error=True)
        return _text(f"unknown tool {name!r}", is_error=True)

    async def _call_meta(self, name: str, arguments: dict[str, Any],
                         peer: Peer | None) -> dict[str, Any]:
        row = META_TOOLS[name]
        wire = _request_of(row, name, arguments)
        if row.id == "call":
            return await self._invoke(str(arguments["id"]), wire.body or {}, wire.headers,
                                      peer=peer)
        headers = {**wire.headers, **(peer.trace if peer else {})}
        status, body = await self.link.request(row.method, wire.path, query=wire.query,
                                               body=wire.body, headers=headers or None)
        return _problem(status, body) if status >= 400 else _text(body, is_error=False)

    async def _call_operator(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """An operator row the daemon offers as a tool: reload, or recheck a capability
        (only one inside this bridge's profile)."""
        row = self._operator[name]
        wire = _request_of(row, name, arguments)
        status, body = await self.link.request(row.method, wire.path, query=wire.query)
        if status >= 400 and not (isinstance(body, dict) and "detail" not in body):
            return _problem(status, body)
        return _text(body, is_error=status >= 400)  # a failed reload: its own report

    async def _invoke(self, name: str, arguments: Any, headers: dict[str, str] | None,
                      *, direct: bool = False, peer: Peer | None = None) -> dict[str, Any]:
        """Call ``name``. Meta mode answers the ToolResult (as text and structured
        content) followed by the upstream's own non-text blocks (images, audio,
        resources, links) as they came; a direct tool answers the upstream's blocks and
        structured content as they came, with capd's facts under ``_meta.capd``.

        The call is streamed: its progress and log lines reach this client as they
        happen, and a server's sampling or elicitation request is put to this client
        (when it declared it can answer). A client's cancellation closes the stream,
        which cancels the call upstream."""
        path = f"/call/{quote(name, safe='')}"
        if peer is not None and peer.trace:
            headers = {**(headers or {}), **peer.trace}
        if peer is None:
            status, body = await self.link.request("POST", path, body=arguments,
                                                   headers=headers or None)
        else:
            relay = _Relay(self.link, peer)
            streamed = {**(headers or {}), "Accept": "application/x-ndjson"}
            if peer.answers:
                streamed["Capd-Answers"] = ",".join(sorted(peer.answers))
            status, body = await self.link.request("POST", path, body=arguments,
                                                   headers=streamed, on_chunk=relay.feed)
            if relay.result is not None:
                status, body = relay.result
        if not (isinstance(body, dict) and "status" in body and "capability" in body):
            return _problem(status, body)
        failed = body["status"] not in ("success", "partial") and not body.get("queued")
        blocks = body.get("content")
        if not isinstance(blocks, list) or (failed and not direct):
            return _text(body, is_error=failed)
        relayed = [b for b in map(_block, blocks) if b is not None]
        if direct:  # the server's own answer, an error's blocks too
            facts = {k: body.get(k) for k in ("status", "capability", "request_id", "queued",
                                              "warnings", "answered_by", "message",
                                              "error_type")}
            result: dict[str, Any] = {"content": relayed, "isError": failed,
                                      "_meta": {"capd": facts}}
            if isinstance(body.get("structured_content"), dict):
                result["structuredContent"] = body["structured_content"]
            return result
        readable = {**body, "content": [_without_data(b) for b in blocks]}
        return {"content": [{"type": "text", "text": _terse(readable)},
                            *(b for b in relayed if b["type"] != "text")],
                "structuredContent": body, "isError": False}

    # ------------------------------------------------- resources and prompts

    async def _offers(self, kind: str) -> list[dict[str, Any]]:
        """The daemon's list of ``kind`` (what this bridge's grant may see); resources and
        prompts are then watched for changes (:meth:`changes`)."""
        path = "/prompts" if kind == "prompts" else "/resources"
        body = await self._ask("GET", path, None)
        if not isinstance(body, dict):
            raise BridgeError(f"capd answered {body!r} to GET {path}")
        items: list[dict[str, Any]] = body.get(kind, [])
        if kind != "templates":
            self._offers_seen[kind] = frozenset(json.dumps(i, sort_keys=True) for i in items)
        return items

    async def list_resources(self) -> dict[str, Any]:
        """Every upstream's resources, as ``capd://<prefix>/<uri>``."""
        return {"resources": await self._offers("resources")}

    async def list_resource_templates(self) -> dict[str, Any]:
        """Every upstream's resource templates."""
        return {"resourceTemplates": await self._offers("templates")}

    async def read_resource(self, uri: str) -> dict[str, Any]:
        """One resource, read by the daemon from its server."""
        answer: dict[str, Any] = await self._ask("POST", "/resources/read", {"uri": uri})
        return answer

    async def list_prompts(self) -> dict[str, Any]:
        """Every upstream's prompts, as ``<prefix>.<name>``."""
        return {"prompts": await self._offers("prompts")}

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None) -> dict[str, Any]:
        """One prompt with its arguments."""
        answer: dict[str, Any] = await self._ask(
            "POST", f"/prompts/{quote(name, safe='')}", dict(arguments or {}))
        return answer

    async def _ask(self, method: str, path: str, body: Any) -> Any:
        """The daemon's 200 answer; :class:`BridgeError` for any other, or none."""
        try:
            status, answer = await self.link.request(method, path, body=body)
        except DaemonDown as exc:
            raise BridgeError(str(exc)) from exc
        if status != 200:
            detail = answer.get("detail") if isinstance(answer, dict) else answer
            raise BridgeError(f"capd answered {status}: {detail}",
                              INVALID_PARAMS if status in (400, 404) else -32603)
        return answer

    async def changes(self) -> list[str]:
        """What changed since the client was last shown it: ``tools`` (direct mode),
        ``resources`` and ``prompts`` (once listed); the list_changed to send."""
        changed = ["tools"] if await self._refresh_direct() else []
        for kind in ("resources", "prompts"):
            if (before := self._offers_seen.get(kind)) is None:
                continue
            await self._offers(kind)
            if self._offers_seen[kind] != before:
                changed.append(kind)
        return changed

    async def watch(self, notify: Callable[[str], Awaitable[None]]) -> None:
        """Send ``notifications/<kind>/list_changed`` (through ``notify``) whenever
        :meth:`changes` finds one, every ``poll_s``."""
        while True:
            await anyio.sleep(self.poll_s)
            try:
                changed = await self.changes()
            except Exception:  # the daemon down or refusing: asked again next time
                continue
            for kind in changed:
                await notify(kind)
