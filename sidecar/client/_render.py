"""Human renderings of operator command bodies, for the CLI without ``--json``."""

from __future__ import annotations

import json
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
    """One line per hit: state, name, summary."""
    lines = []
    for hit in body["results"]:
        lines.append(f"{hit['state']:<9} {hit['name']:<32} {hit['summary']}")
    return "\n".join(lines) or "no capability matches"


RENDERERS: dict[str, Callable[[Any], str]] = {
    "json": render_json,
    "call": render_call,
    "health": render_health,
    "jobs": render_jobs,
    "list": render_list,
    "search": render_search,
}
"""How the CLI prints an answer, by the name an operator-table row gives."""
