"""Building a registry: import plugins, load declarations, probe every tool once, concurrently."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, Field

from ._declarations import capability_from_spec, load_declarations
from ._errors import DeclarationError
from ._model import Capability, McpProbe, OpEffect, ToolSpec
from ._names import close_hint, is_valid_name
from ._ops import OpTable, entry_point_modules, load_plugins
from ._probes import Probe, probe_all
from ._registry import Registry
from ._routes import offered_routes, resolve_routes
from ._upstream import left_out_tools, upstream_capabilities
from ._upstream_session import UpstreamPool

log = structlog.get_logger("capd.build")


class BuildConfig(BaseModel):
    """Everything a build reads. Relative paths must already be resolved."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plugins: tuple[str, ...] = ()
    plugin_paths: tuple[Path, ...] = ()
    declarations: tuple[Path, ...] = ()
    tools: Mapping[str, ToolSpec] = Field(default_factory=dict)
    variables: Mapping[str, str] = Field(default_factory=dict)
    entry_points: bool = True
    label_root: Path | None = None


async def build(
    config: BuildConfig, *, probe: Probe | None = None, fresh: bool = True,
    executor: Executor | None = None, upstreams: UpstreamPool | None = None,
) -> Registry:
    """Build a fresh :class:`Registry` from ``config``.

    Plugin modules are imported afresh (``fresh``) in a worker thread, so an
    edited op is picked up and the event loop keeps running. Every declared
    tool is probed exactly once, all at the same time; plain Python probes run
    on ``executor``. Declaration problems are collected on the registry, never
    raised. The hooks the plugin modules mark become :attr:`Registry.hooks`.

    Raises :class:`PluginError` if a plugin cannot be imported and
    :class:`ConfigError` if a declarations path does not exist.
    """
    modules = list(config.plugins)
    if config.entry_points:
        modules.extend(entry_point_modules())
    ops = await asyncio.to_thread(load_plugins, modules, paths=config.plugin_paths, fresh=fresh)
    errors: list[DeclarationError] = list(ops.errors)

    capabilities: list[Capability] = []
    for spec in ops.capabilities:
        try:
            capabilities.append(capability_from_spec(spec))
        except DeclarationError as exc:
            errors.append(exc)

    declared = await asyncio.to_thread(
        load_declarations, config.declarations, ops, config.variables, label_root=config.label_root
    )
    errors.extend(declared.errors)
    capabilities.extend(declared.capabilities)

    tools: dict[str, ToolSpec] = dict(config.tools)
    for tool_id, tool_spec in declared.tools.items():
        if tool_id in tools and tools[tool_id] != tool_spec:
            errors.append(DeclarationError(
                declared.tool_sources[tool_id],
                f"tool {tool_id!r} is already declared differently in capd.toml",
                field="tools",
            ))
            continue
        tools[tool_id] = tool_spec

    # Upstream MCP servers: their tools are capabilities. Without the daemon's pool
    # (capd check) the sessions are opened for this build only: each server is started
    # once, its handshake listing the tools and its ping being the probe below.
    own_pool = upstreams is None and any(isinstance(s, McpProbe) for s in tools.values())
    pool = UpstreamPool() if own_pool else upstreams
    try:
        return await _assemble(tools, pool, capabilities, errors, ops, probe, executor)
    finally:
        if own_pool and pool is not None:
            await pool.close()


async def _assemble(tools: dict[str, ToolSpec], pool: UpstreamPool | None,
                    capabilities: list[Capability], errors: list[DeclarationError],
                    ops: OpTable, probe: Probe | None, executor: Executor | None) -> Registry:
    """The registry of ``capabilities`` (and the upstreams' tools), probed; ``errors``
    gathers what is refused."""
    upstream, left_out_by = await _upstream_capabilities(tools, pool)
    capabilities.extend(upstream)

    accepted: dict[str, Capability] = {}
    # left out, with why
    not_on_host: dict[str, str] = {n: why for left in left_out_by.values()
                                   for n, why in left.items()}
    # Aliases are checked against every declared name and claimed in declaration order,
    # before the checks that depend on this host, so every host leaves out the same ones.
    names = {cap.name for cap in capabilities}
    claimed: dict[str, Capability] = {}
    for cap in capabilities:
        if cap.name in accepted:
            _refuse(errors, cap, "name",
                    f"duplicate name: already declared by {accepted[cap.name].source}")
            continue
        clashes = _alias_problems(cap, names, claimed)
        if clashes:
            _refuse(errors, cap, "aliases", "; ".join(clashes))
            continue
        claimed.update(dict.fromkeys(cap.aliases, cap))
        unknown = [t for t in cap.requires if t not in tools]
        if unknown:
            named = ", ".join(repr(t) + close_hint(t, tools) for t in unknown)
            _refuse(errors, cap, "requires", f"requires unknown tool {named}; declare it under "
                    "[tools.<id>] in capd.toml or in a declaration file")
            continue
        unmet = cap.host.unmet() if cap.host is not None else None
        if unmet:
            not_on_host[cap.name] = "; ".join(unmet)
            continue
        missing_ops = [e.op for e in cap.effects if isinstance(e, OpEffect) and e.op not in ops.ops]
        if missing_ops:
            _refuse(errors, cap, "effects", f"effects: verify op "
                    f"{', '.join(repr(o) for o in missing_ops)} is not registered")
            continue
        accepted[cap.name] = cap

    _settle_routes(accepted, names, claimed, errors)

    probes = await probe_all(tools, probe=probe, executor=executor, upstreams=pool)
    registry = Registry(accepted.values(), tools, probes, errors=errors, ops=ops, clock=time.time)
    registry.not_on_host = not_on_host
    for source, left in left_out_by.items():
        registry.left_out_from(source, left)
    return registry


def _refuse(errors: list[DeclarationError], cap: Capability, field: str, message: str) -> None:
    """Report ``cap`` refused for ``message``, naming its source and ``field``."""
    errors.append(DeclarationError(cap.source or "?", message, capability=cap.name, field=field))


def _alias_problems(
    cap: Capability, names: set[str], claimed: Mapping[str, Capability]
) -> list[str]:
    """Return how ``cap.aliases`` clash with other capabilities, one sentence each.

    An alias may name no capability (``names``) nor an alias another capability
    already ``claimed``. Its form (see :class:`Capability`) was checked when the
    capability was made.
    """
    problems: list[str] = []
    for alias in cap.aliases:
        if alias in names:
            problems.append(f"alias {alias!r} is the name of another capability")
        elif alias in claimed:
            owner = claimed[alias]
            problems.append(f"alias {alias!r} is already an alias of {owner.name!r} "
                            f"({owner.source or '?'})")
    return problems


def _settle_routes(
    accepted: dict[str, Capability], names: set[str], claimed: Mapping[str, Capability],
    errors: list[DeclarationError],
) -> None:
    """Check and resolve the error routes of ``accepted`` in place, reporting into ``errors``.

    A route may name any declared capability or claimed alias, wherever it is
    declared, so it is checked once every name is known, the same way on every
    host; an alias is resolved to its capability. A capability refused for
    another reason still counts as declared (its own error says what is wrong;
    a second error here would only hide it). A capability whose routes name
    something else is left out. Then each chain keeps only what this build
    offers, so the dispatcher never meets a name it cannot look up.
    """
    refused = {e.capability for e in errors if e.capability and is_valid_name(e.capability)}
    known = {name: name for name in names | refused}
    known.update((alias, owner.name) for alias, owner in claimed.items())
    for cap in [c for c in accepted.values() if c.on_error]:
        routes, problems = resolve_routes(cap.name, cap.on_error, known)
        if problems:
            _refuse(errors, cap, "on_error", "on_error: " + "; ".join(problems))
            del accepted[cap.name]
        elif routes != cap.on_error:
            accepted[cap.name] = cap.model_copy(update={"on_error": routes})
    for cap in [c for c in accepted.values() if c.on_error]:
        routes = offered_routes(cap.on_error, accepted)
        if routes != cap.on_error:
            accepted[cap.name] = cap.model_copy(update={"on_error": routes})


async def refresh_upstream(registry: Registry, tool_id: str, pool: UpstreamPool) -> Registry:
    """``registry`` with the MCP server ``tool_id``'s capabilities made again from the list
    it gives now (after its ``tools/list_changed``); nothing else is rebuilt or probed.
    Raises :class:`UpstreamError` when the server does not answer, :class:`ValueError`
    when a new name clashes with another capability's."""
    spec = registry.tool_spec(tool_id)
    if not isinstance(spec, McpProbe):
        raise TypeError(f"tool {tool_id!r} is not an MCP server")
    found = await pool.get(tool_id, spec).ensure()
    return registry.with_source(f"mcp:{tool_id}", *_server_capabilities(tool_id, spec, found,
                                                                         pool))


def _server_capabilities(tool_id: str, spec: McpProbe, found: Sequence[Any], pool: UpstreamPool
                         ) -> tuple[list[Capability], dict[str, str]]:
    """One server's capabilities from the tools it ``found``, and those left out, with why."""
    return (upstream_capabilities(tool_id, spec, found, pool.call, source=f"mcp:{tool_id}"),
            left_out_tools(tool_id, spec, found))


async def _upstream_capabilities(tools: Mapping[str, ToolSpec], pool: UpstreamPool | None
                                 ) -> tuple[list[Capability], dict[str, dict[str, str]]]:
    """The capabilities of every MCP server, all handshakes at once, and by source the
    tools left out with why (those a server runs only as tasks). A server that does not
    answer keeps the tools it listed last (disabled with it by its probe)."""
    servers = {t: s for t, s in tools.items() if isinstance(s, McpProbe)}
    if not servers or pool is None:
        return [], {}
    listed = await asyncio.gather(*(pool.tools(t, s) for t, s in servers.items()))
    out: list[Capability] = []
    left_out: dict[str, dict[str, str]] = {}
    for (tool_id, spec), (found, error) in zip(servers.items(), listed, strict=True):
        if error is not None:
            log.warning("upstream_unreachable_at_build", tool=tool_id, error=error,
                        known_tools=len(found))
        made, left_out[f"mcp:{tool_id}"] = _server_capabilities(tool_id, spec, found, pool)
        out.extend(made)
    return out, left_out

