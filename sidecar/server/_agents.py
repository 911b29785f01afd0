"""Resolving an agent to the MCP servers its runtime needs. Pure: registry and config in, data out.

An agent's declared entries (names, globs, ``tag:``) are expanded against the
registry (:func:`capd.registry.select_capabilities`), then every run-time
injection whose ``when`` matches the execution context adds its own. The answer
names the servers to launch:

- ``capd-NAME``: the capd bridge (``capd mcp --allow a,b,c``), restricted to
  exactly the resolved capabilities. That is the only server: an upstream MCP
  tool declared ``direct = true`` is never handed out raw (its command would
  reach every tool of that server, the ones the operator excluded and the ones
  the agent never declared). When a resolved capability needs one, the bridge
  is launched with ``--expose direct``, so each such capability is a tool of its
  own, still behind capd's grant, policy and retry queue; ``direct`` says which
  upstreams are served that way.

Fail closed: an entry that selects nothing — an exact name that is not declared,
a glob or a tag that matches no capability — makes the whole resolution fail
with :class:`UnresolvedAgent` naming every such entry; nothing is skipped. Every
injection's entries are checked at every resolution, matched or not, so a typo in
one is found by the first resolve rather than in the context that needs it.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capd.registry import (
    AgentServer,
    AgentSpec,
    InjectionSpec,
    McpProbe,
    Registry,
    Selection,
    TemplateError,
    render,
    select_capabilities,
)

from .._errors import UnknownAgent, UnresolvedAgent

BRIDGE_PREFIX = "capd-"


@dataclass(frozen=True)
class BridgeLaunch:
    """How an agent's runtime starts the capd bridge: the program, and the daemon's socket."""

    command: str
    socket_path: Path


def capd_command(argv0: str | None = None) -> str:
    """The program an MCP client should run for ``capd``.

    The absolute path of the running ``capd`` script when this process is one
    (as ``capd mcp-config`` decides), else ``capd`` from the PATH.
    """
    path = Path(argv0 if argv0 is not None else sys.argv[0])
    return str(path.resolve()) if path.name == "capd" else "capd"


def parse_context(text: str | None) -> dict[str, str]:
    """``key=value,key2=value2`` as a mapping; a bare ``key`` means ``key=true``.

    Raise ValueError naming an item with no key. A value holds no ``,`` (it
    separates items); it may hold ``=``.
    """
    context: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not key:
            raise ValueError(f"context item {item!r} has no key; use key=value")
        context[key] = value.strip() if sep else "true"
    return context


@dataclass(frozen=True)
class Injected:
    """One ``[[injections]]`` entry that matched the context, and what it added."""

    index: int
    when: str
    why: str
    selections: tuple[Selection, ...]

    @property
    def capabilities(self) -> tuple[str, ...]:
        """Every capability this injection selects."""
        return tuple(dict.fromkeys(n for s in self.selections for n in s.capabilities))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"injection": self.index, "when": self.when, "why": self.why,
                "add": [s.entry for s in self.selections],
                "expansion": [s.as_dict() for s in self.selections],
                "capabilities": list(self.capabilities)}


@dataclass(frozen=True)
class AgentResolution:
    """What one agent gets in one context, and the servers its runtime launches."""

    agent: str
    description: str
    context: Mapping[str, str]
    expansion: tuple[Selection, ...]
    injected: tuple[Injected, ...]
    capabilities: tuple[str, ...]
    disabled: Mapping[str, tuple[str, ...]]
    direct: Mapping[str, tuple[str, ...]]
    servers: Mapping[str, dict[str, Any]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """Everything: the declared entries and their expansion, what was injected and
        why, the capabilities (with the disabled ones and their missing tools), the
        direct upstreams (with the capabilities needing each) and the servers."""
        return {
            "agent": self.agent,
            "description": self.description,
            "context": dict(self.context),
            "declared": [s.entry for s in self.expansion],
            "expansion": [s.as_dict() for s in self.expansion],
            "injected": [i.as_dict() for i in self.injected],
            "capabilities": list(self.capabilities),
            "disabled": {name: list(missing) for name, missing in self.disabled.items()},
            "direct": {tool: list(caps) for tool, caps in self.direct.items()},
            "servers": {name: dict(server) for name, server in self.servers.items()},
        }


def find_agent(name: str, agents: Mapping[str, AgentSpec]) -> AgentSpec:
    """The agent ``name``; raise :class:`UnknownAgent` with close names."""
    spec = agents.get(name)
    if spec is None:
        raise UnknownAgent(name, list(agents))
    return spec


def resolve_agent(
    name: str,
    *,
    agents: Mapping[str, AgentSpec],
    injections: Sequence[InjectionSpec],
    registry: Registry,
    context: Mapping[str, str],
    bridge: BridgeLaunch,
) -> AgentResolution:
    """Resolve agent ``name`` in ``context`` against ``registry``.

    Raises :class:`UnknownAgent` when ``agents`` has no ``name``, and
    :class:`UnresolvedAgent` naming every entry — the agent's, or any
    injection's, matched or not — that selects no capability.
    """
    spec = find_agent(name, agents)
    expansion = tuple(select_capabilities(registry, entry, by_agent=True)
                      for entry in spec.capabilities)
    problems = [{"entry": s.entry, "declared_in": f"agents.{name}", "detail": s.problem}
                for s in expansion if s.problem is not None]
    injected: list[Injected] = []
    for index, injection in enumerate(injections):
        selections = tuple(select_capabilities(registry, entry) for entry in injection.add)
        problems += [{"entry": s.entry, "declared_in": f"injections[{index}]",
                      "detail": s.problem} for s in selections if s.problem is not None]
        if injection.matches(context):
            injected.append(Injected(index, injection.when, injection.why, selections))
    own_servers: dict[str, dict[str, Any]] = {}
    values = {**context, "agent_id": name}  # the context cannot rename the agent
    for server_id, server in spec.servers.items():
        try:
            own_servers[server_id] = _rendered(server, values)
        except TemplateError as exc:
            problems.append({"entry": f"servers.{server_id}", "declared_in": f"agents.{name}",
                             "detail": f"{exc}; give it with --context KEY=VALUE (known: "
                                       f"{', '.join(sorted(values))})"})
    if problems:
        raise UnresolvedAgent(name, problems)
    names = sorted({n for s in expansion for n in s.capabilities}
                   | {n for i in injected for n in i.capabilities})
    disabled: dict[str, tuple[str, ...]] = {}
    direct: dict[str, list[str]] = {}
    for cap_name in names:
        entry = registry.disabled_entry(cap_name)
        if entry is not None:
            disabled[cap_name] = entry.missing
        for tool in registry.get(cap_name).requires:
            if registry.has_tool(tool) and direct_server(registry.tool_spec(tool)) is not None:
                direct.setdefault(tool, []).append(cap_name)
    servers = {f"{BRIDGE_PREFIX}{name}": bridge_server(bridge, names, expose_direct=bool(direct)),
               **own_servers}
    return AgentResolution(
        agent=name, description=spec.description, context=dict(context), expansion=expansion,
        injected=tuple(injected), capabilities=tuple(names), disabled=disabled,
        direct={tool: tuple(caps) for tool, caps in sorted(direct.items())}, servers=servers)


def _rendered(server: AgentServer, values: Mapping[str, str]) -> dict[str, Any]:
    """An agent's own server with the context substituted (raises :class:`TemplateError`
    naming a placeholder the context does not give)."""
    if server.command is not None:
        command = [render(part, values) for part in server.command]
        out: dict[str, Any] = {"command": command[0], "args": command[1:]}
    else:
        assert server.url is not None
        out = {"type": "http", "url": render(server.url, values)}
    if server.env:
        out["env"] = {key: render(value, values) for key, value in server.env.items()}
    return out


def bridge_server(bridge: BridgeLaunch, capabilities: Sequence[str], *,
                  expose_direct: bool = False) -> dict[str, Any]:
    """The capd bridge, as an MCP client launches it, offering exactly ``capabilities``
    (each also as a tool of its own with ``expose_direct``)."""
    args = ["mcp", "--socket", str(bridge.socket_path), "--allow", ",".join(capabilities)]
    if expose_direct:
        args += ["--expose", "direct"]
    return {"command": bridge.command, "args": args}


def direct_server(spec: object) -> dict[str, Any] | None:
    """The server config that would reach a ``direct = true`` upstream itself; None for
    any other tool. Resolution only uses it to tell such upstreams apart: it never
    hands the config to an agent (see the module docstring).

    A stdio server is ``command`` (the program) and ``args``, with ``env`` when the
    tool declares one; an HTTP server is ``type = "http"`` and its ``url``.
    """
    if not isinstance(spec, McpProbe) or not spec.direct:
        return None
    if spec.command:
        server: dict[str, Any] = {"command": spec.command[0], "args": list(spec.command[1:])}
        if spec.env:
            server["env"] = dict(spec.env)
        return server
    return {"type": "http", "url": spec.url}


# ------------------------------------------------------------------------ formats


def claude_config(resolution: AgentResolution) -> dict[str, Any]:
    """``{"mcpServers": {...}}``, the shape ``capd mcp-config`` prints."""
    return {"mcpServers": {name: dict(server) for name, server in resolution.servers.items()}}


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _toml_string(key)


def _toml_string(value: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, except DEL, which JSON leaves raw."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(value: Any) -> str:
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}"
                                for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def codex_config(resolution: AgentResolution) -> str:
    """TOML for Codex's config.toml: one ``[mcp_servers.NAME]`` table per server,
    with ``command``, ``args`` and ``env`` (or ``url`` for an HTTP server)."""
    blocks = []
    for name, server in resolution.servers.items():
        lines = [f"[mcp_servers.{_toml_key(name)}]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in server.items()
                  if key != "type"]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
