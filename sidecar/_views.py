"""JSON views of registry objects, shared by the CLI and the HTTP API."""

from __future__ import annotations

import re
from typing import Any

from capd.registry import (
    Capability,
    DisabledEntry,
    ProbeResult,
    RegistrySnapshot,
    parameters_schema,
    undescribed_parameters,
)

from ._table import PROVIDER_FORMATS


def probe_view(result: ProbeResult | None) -> dict[str, Any] | None:
    """A probe result as JSON, or None when the tool was never probed."""
    return None if result is None else result.model_dump(mode="json")


def capsule(cap: Capability, *, live: bool) -> dict[str, Any]:
    """The small discovery view of a capability."""
    return {
        "name": cap.name,
        "aliases": list(cap.aliases),
        "summary": cap.summary,
        "tags": list(cap.tags),
        "latency_class": cap.latency_class,
        "state": "live" if live else "disabled",
        **({"provides": list(cap.provides)} if cap.provides else {}),
        **({"channels": list(cap.channels)} if cap.channels else {}),
    }


def disabled_view(entry: DisabledEntry, snapshot: RegistrySnapshot) -> dict[str, Any]:
    """Why a capability is disabled: its missing tools, their errors and last probe times,
    and how to install each missing tool that declares an ``install_hint``."""
    return {
        "missing": list(entry.missing),
        "errors": dict(entry.errors),
        "since": entry.since,
        "last_probed": {
            tool: (snapshot.probes[tool].checked_at if tool in snapshot.probes else None)
            for tool in entry.missing
        },
        "install_hints": install_hints(entry.missing, snapshot),
    }


def install_hints(tools: tuple[str, ...] | list[str],
                  snapshot: RegistrySnapshot) -> dict[str, str]:
    """The ``install_hint`` of each of ``tools`` that declares one."""
    return {tool: spec.install_hint for tool in tools
            if (spec := snapshot.tools.get(tool)) is not None and spec.install_hint}


def disabled_reason(view: dict[str, Any]) -> str:
    """One line: each missing tool's error, and its install hint when it has one."""
    hints: dict[str, str] = view.get("install_hints", {})
    parts = []
    for tool in view["missing"]:
        part = f"missing {tool}"
        if tool in view["errors"]:
            part += f": {view['errors'][tool]}"
        if tool in hints:
            part += f" (install: {hints[tool]})"
        parts.append(part)
    return "; ".join(parts)


def manifest(cap: Capability, snapshot: RegistrySnapshot) -> dict[str, Any]:
    """The full view of a capability, with its parameters' JSON Schema."""
    entry = snapshot.disabled.get(cap.name)
    body: dict[str, Any] = {
        **capsule(cap, live=entry is None),
        "description": cap.description,
        "parameters": parameters_schema(cap.parameters),
        "requires": list(cap.requires),
        "mutates_state": cap.mutates_state,
        "retry_policy": cap.retry_policy,
        "partial_replay": cap.partial_replay,
        "replay_while_disabled": cap.replay_while_disabled,
        "effects": [e.model_dump(mode="json") for e in cap.effects],
        "consent_operations": list(cap.consent_operations),
        "timeout_s": cap.timeout_s,
        "owner": cap.owner,
        "version": cap.version,
        "permissions": list(cap.permissions),
        "safety": cap.safety,
        "context_budget_tokens": cap.context_budget_tokens,
        "op_id": cap.op_id,
        "source": cap.source,
    }
    if cap.upstream_tool is not None:  # what the MCP server said of it beyond the schema
        body["upstream_tool"] = dict(cap.upstream_tool)
    if cap.agent is not None:  # an agent that runs (agent.NAME)
        body["agent"] = dict(cap.agent)
    if entry is not None:
        body["disabled"] = disabled_view(entry, snapshot)
    return body


_PROVIDER_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def provider_name(name: str) -> str:
    """A capability name as OpenAI and Anthropic accept it: each ``.`` becomes ``__``.

    Raises ValueError when the result is not ``^[a-zA-Z0-9_-]{1,64}$`` (a name too long).
    """
    mapped = name.replace(".", "__")
    if not _PROVIDER_NAME.match(mapped):
        raise ValueError(f"{name!r} maps to {mapped!r}, which is not a valid provider tool "
                         "name (^[a-zA-Z0-9_-]{1,64}$)")
    return mapped


def strict_compatible(schema: Any) -> bool:
    """Whether OpenAI's strict mode accepts ``schema``: every object (a node typed "object"
    or holding "properties") has ``additionalProperties: false`` and requires every one of
    its properties."""
    if isinstance(schema, list):
        return all(strict_compatible(item) for item in schema)
    if not isinstance(schema, dict):
        return True
    if schema.get("type") == "object" or "properties" in schema:
        properties = schema.get("properties", {})
        if schema.get("additionalProperties") is not False:
            return False
        if not isinstance(properties, dict) or set(schema.get("required", ())) != set(properties):
            return False
    return all(strict_compatible(value) for value in schema.values())


def tool_description(cap: Capability) -> str:
    """The summary, then the description when there is one."""
    return f"{cap.summary}\n\n{cap.description}" if cap.description else cap.summary


def provider_tool(cap: Capability, form: str) -> dict[str, Any]:
    """The capability's tool definition as ``form``'s tool-calling API expects it.

    ``openai``: a Chat Completions function tool; ``anthropic``: a Messages API tool;
    ``mcp``: an MCP ``Tool`` with annotations. Raises ValueError for an unknown format.
    """
    schema = parameters_schema(cap.parameters)
    description = tool_description(cap)
    if form == "openai":
        return {"type": "function", "function": {
            "name": provider_name(cap.name), "description": description,
            "parameters": schema, "strict": strict_compatible(schema)}}
    if form == "anthropic":
        return {"name": provider_name(cap.name), "description": description,
                "input_schema": schema}
    if form == "mcp":
        annotations: dict[str, Any] = {"readOnlyHint": not cap.mutates_state}
        if cap.mutates_state or cap.safety == "destructive":
            annotations["destructiveHint"] = cap.safety == "destructive"
        return {"name": cap.name, "description": description, "inputSchema": schema,
                "annotations": annotations}
    raise ValueError(f"format must be {', '.join(PROVIDER_FORMATS)}, not {form!r}")


def check_report(snapshot: RegistrySnapshot) -> dict[str, Any]:
    """What ``capd check --json`` prints: live, disabled, tools and declaration errors."""
    return {
        "live": [
            {"name": c.name, "requires": list(c.requires)}
            for c in sorted(snapshot.live.values(), key=lambda c: c.name)
        ],
        "disabled": [
            {"name": name, "requires": list(e.capability.requires), **disabled_view(e, snapshot)}
            for name, e in sorted(snapshot.disabled.items())
        ],
        "tools": {tool: probe_view(r) for tool, r in sorted(snapshot.probes.items())},
        "errors": [e.as_dict() for e in snapshot.errors],
        "warnings": [
            {"capability": c.name, "field": field,
             "message": f"{c.name}: parameter {field!r} has no description (a tool's every "
                        "parameter needs one: the model reads it to fill the value)"}
            for c in sorted((*snapshot.live.values(),
                             *(e.capability for e in snapshot.disabled.values())),
                            key=lambda c: c.name)
            for field in undescribed_parameters(parameters_schema(c.parameters))],
        "counts": snapshot.counts,
    }


def render_check_table(report: dict[str, Any]) -> str:
    """The human table ``capd check`` prints."""
    rows = [("live", item["name"], ", ".join(item["requires"]) or "-")
            for item in report["live"]]
    rows += [("disabled", item["name"], disabled_reason(item)) for item in report["disabled"]]
    width = max((len(r[1]) for r in rows), default=10)
    counts = report["counts"]
    return "\n".join([
        f"{'STATE':<9} {'CAPABILITY':<{width}} DETAIL",
        *(f"{state:<9} {name:<{width}} {detail}" for state, name, detail in rows),
        "",
        f"{counts['live']} live, {counts['disabled']} disabled, "
        f"{counts['errors']} declaration error(s)",
        *(f"error: {err['message']}" for err in report["errors"]),
        *(f"warning: {warning['message']}" for warning in report.get("warnings", [])),
        *(f"not offered on this host: {name}: {why}"
          for name, why in report.get("not_on_host", {}).items())])
