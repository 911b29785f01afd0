"""Human renderings of operator command bodies, for the CLI without ``--json``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any


def render_json(body: Any) -> str:
    """Pretty JSON: the default rendering."""
    return json.dumps(body, indent=2, sort_keys=False)


def render_health(body: Any) -> str:
    """One status line, then one line per check that is not passing."""
    lines = [f"{body['status']}: {body['output']} (capd {body['version']})"]
    for key, items in body.get("checks", {}).items():
        for item in items:
            if item.get("status") != "pass":
                lines.append(f"  {item['status']:<5} {key}: {item.get('output', '')}")
    return "\n".join(lines)


def render_list(body: Any) -> str:
    """A table of capsules."""
    caps = body["capabilities"]
    width = max((len(c["name"]) for c in caps), default=10)
    lines = [f"{'STATE':<9} {'CAPABILITY':<{width}} SUMMARY"]
    lines += [f"{c['state']:<9} {c['name']:<{width}} {c['summary']}" for c in caps]
    return "\n".join(lines)


def render_call(body: Any) -> str:
    """The result on success; the state, error type and message otherwise."""
    if body["status"] == "success":
        return render_json(body["result"])
    text = f"{body['status']}: {body.get('error_type') or ''}: {body.get('message') or ''}"
    if body.get("queued") and body["queued"] not in text:
        text += f"\nqueued as job {body['queued']}"
    if body.get("alternatives"):
        text += f"\nalternatives: {', '.join(body['alternatives'])}"
    return text


def render_jobs(body: Any) -> str:
    """A table of retry jobs."""
    lines = [f"{'ID':<32}  {'STATE':<14} {'TRIES':>5}  CAPABILITY  LAST ERROR"]
    for job in body["jobs"]:
        lines.append(f"{job['id']:<32}  {job['state']:<14} "
                     f"{job['attempts']:>2}/{job['max_attempts']:<2}  {job['capability']}  "
                     f"{job.get('last_error') or ''}")
    return "\n".join(lines)


def render_search(body: Any) -> str:
    """A table of hits, best first: score (or ``exact``), state, name, summary."""
    hits = body["results"]
    if not hits:
        return "no capability matches"
    width = max(len(h["name"]) for h in hits)
    lines = [f"{'SCORE':>6}  {'STATE':<9} {'CAPABILITY':<{width}} SUMMARY"]
    for hit in hits:
        score = "exact" if hit.get("exact") or hit.get("score") is None else f"{hit['score']:.2f}"
        summary = hit["summary"]
        if hit.get("disabled"):
            summary += f" (missing: {', '.join(hit['disabled']['missing'])})"
            hints = hit["disabled"].get("install_hints") or {}
            summary += "".join(f" (install {tool}: {hint})" for tool, hint in hints.items())
        lines.append(f"{score:>6}  {hit['state']:<9} {hit['name']:<{width}} {summary}")
    return "\n".join(lines)


def render_agents(body: Any) -> str:
    """A table of agents and their entries, then the run-time injections."""
    agents = body["agents"]
    if not agents:
        return "no agent is declared; add [agents.NAME] to capd.toml"
    width = max([len("AGENT"), *(len(a["agent"]) for a in agents)])
    lines = [f"{'AGENT':<{width}}  CAPABILITIES"]
    lines += [f"{a['agent']:<{width}}  {', '.join(a['capabilities'])}" for a in agents]
    for injection in body.get("injections", []):
        why = f"  ({injection['why']})" if injection.get("why") else ""
        lines.append(f"injection: when {injection['when']} add {', '.join(injection['add'])}{why}")
    return "\n".join(lines)


def render_agent(body: Any) -> str:
    """One agent: each entry and what it selects (or why it selects nothing)."""
    lines = [f"{body['agent']}: {body['description']}" if body.get("description")
             else body["agent"]]
    for item in body["expansion"]:
        found = ", ".join(item["capabilities"]) or f"NOTHING: {item.get('problem', '')}"
        lines.append(f"  {item['entry']} ({item['kind']}) -> {found}")
    return "\n".join(lines)


def render_topologies(body: Any) -> str:
    """A table of topologies: id, roles, instances, title; then what could not be read."""
    tops = body["topologies"]
    width = max([len("TOPOLOGY"), *(len(t["id"]) for t in tops)])
    lines = [f"{'TOPOLOGY':<{width}}  INSTANCES  TITLE"]
    lines += [f"{t['id']:<{width}}  {t['instances']:>9}  {t['title']}" for t in tops]
    lines += [f"error: {e['message']}" for e in body.get("errors", [])]
    return "\n".join(lines)


def render_validation(body: Any) -> str:
    """``ok ID`` or ``invalid ID`` with one indented line per problem."""
    lines = []
    for top in body["topologies"]:
        lines.append(f"{'ok' if top['ok'] else 'invalid'} {top['id']}")
        lines += [f"  {problem}" for problem in top["problems"]]
    lines += [f"error: {e['message']}" for e in body.get("errors", [])]
    return "\n".join(lines) or "no topology is declared"


def render_export(body: Any) -> str:
    """The tool definitions alone, as the provider's API takes them (``tools=[...]``);
    what could not be rendered is named on stderr, so a redirected file stays clean."""
    for item in body.get("skipped", []):
        print(f"capd: skipped {item['name']}: {item['reason']}", file=sys.stderr)
    return render_json(body["tools"])


def describe_failure(command: str, body: Any) -> str:
    """One sentence for an answer that is not 2xx, for ``capd: <sentence>`` on stderr.

    A problem body gives its ``detail``; a ToolResult names the capability, the
    message, its state and error type; a body with an ``error`` (a failed reload)
    says that ``command`` failed and why.
    """
    if not isinstance(body, dict):
        return f"{command} failed: {body}"
    if body.get("detail"):
        return str(body["detail"])
    if "capability" in body and "status" in body:
        kind = ", ".join(str(x) for x in (body["status"], body.get("error_type")) if x)
        text = f"{body['capability']} failed: {body.get('message') or 'no message'} ({kind})"
        if body.get("retry_after_s") is not None:
            text += f"; retry after {body['retry_after_s']:g} s"
        if body.get("alternatives"):
            text += f"; alternatives: {', '.join(body['alternatives'])}"
        return text
    if body.get("error"):
        return f"{command} failed: {body['error']}"
    return f"{command} failed: {json.dumps(body)}"


RENDERERS: dict[str, Callable[[Any], str]] = {
    "json": render_json,
    "export": render_export,
    "agent": render_agent,
    "agents": render_agents,
    "call": render_call,
    "health": render_health,
    "jobs": render_jobs,
    "list": render_list,
    "search": render_search,
    "topologies": render_topologies,
    "validation": render_validation,
}
"""How the CLI prints an answer, by the name an operator-table row gives."""
