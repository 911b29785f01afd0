"""Human renderings of operator command bodies, for the CLI without ``--json``.

Every value a renderer puts in a row of its own goes through :func:`_cell`
(``one_line``): escaped so that it cannot steer the terminal, with its own line
breaks and tabs escaped too, so that it stays in its row. The CLI writes what a
renderer returns through ``echo``, which escapes the whole text once more; a
pretty-JSON rendering is a ``Document``, exact when redirected (``_terminal``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ._terminal import Document, echo
from ._terminal import one_line as _cell  # a value for one row: nothing raw in it


def table(header: Sequence[str], rows: Sequence[Sequence[Any]],
          right: frozenset[int] = frozenset()) -> str:
    """Aligned columns: ``header``, then each row, every value a :func:`_cell`; the columns
    numbered in ``right`` aligned right, the last never padded."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(header)]
    lines = []
    for row in [list(header), *cells]:
        parts = [(value.rjust(widths[i]) if i in right else value.ljust(widths[i]))
                 if i < len(row) - 1 or i in right else value
                 for i, value in enumerate(row)]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _columns(header: Sequence[str], rows: Sequence[Sequence[Any]], wide: bool,
             extra: frozenset[int], right: frozenset[int] = frozenset()) -> str:
    """:func:`table` of every column when ``wide``, else of those not numbered in ``extra``."""
    keep = [i for i in range(len(header)) if wide or i not in extra]
    return table([header[i] for i in keep], [[row[i] for i in keep] for row in rows],
                 frozenset(keep.index(i) for i in right if i in keep))


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


_TIME_KEYS = frozenset({"at", "since", "expires", "last_probed"})


def _is_time(key: str) -> bool:
    """Whether a value under ``key`` is a time (seconds since the epoch)."""
    return key.endswith("_at") or key in _TIME_KEYS


def _text(key: str, value: Any) -> str:
    """A scalar for reading: a time (a key ending in ``_at`` or ``since``) as local time."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and _is_time(key) and value > 1e9:
        import time

        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
    if isinstance(value, float):
        return f"{value:g}"
    return _cell(value)


def render_fields(body: Any) -> str:
    """Any JSON body for reading (``describe``-style): ``key: value`` lines, nested objects
    indented, lists of scalars joined, lists of flat objects as aligned tables."""
    lines: list[str] = []
    _fields(body, 0, lines)
    return "\n".join(lines) or "(nothing)"


def _fields(value: Any, depth: int, lines: list[str], key: str = "") -> None:
    pad = "  " * depth
    label = f"{pad}{_cell(key)}:" if key else ""
    inline = f"{label} " if key else pad  # before a value on the key's own line
    if _scalar(value):
        lines.append(inline + _text(key, value))
    elif isinstance(value, dict):
        if not value:
            lines.append(f"{inline}(none)")
            return
        if key:
            lines.append(label)
        for name, item in value.items():
            if _is_time(key) and _scalar(item):  # {tool: time} under a time's key
                lines.append(f"{'  ' * (depth + 1)}{_cell(name)}: {_text(key, item)}")
                continue
            _fields(item, depth + 1 if key else depth, lines, str(name))
    elif isinstance(value, list):
        if all(_scalar(v) for v in value):
            lines.append(inline + (", ".join(_text(key, v) for v in value) or "(none)"))
        elif all(isinstance(v, dict) and all(_scalar(x) for x in v.values()) for v in value):
            header = list(dict.fromkeys(k for v in value for k in v))
            if key:
                lines.append(label)
            rows = [[_text(k, v.get(k)) for k in header] for v in value]
            lines += [f"{pad}  {line}" for line in
                      table([h.upper() for h in header], rows).splitlines()]
        else:
            if key:
                lines.append(label)
            for item in value:
                start = len(lines)
                _fields(item, depth + 1, lines)
                if len(lines) > start:
                    first = lines[start]
                    lines[start] = f"{pad}- {first.lstrip()}"
    else:
        lines.append(f"{label} {_cell(value)}")


def render_json(body: Any) -> Document:
    """Pretty JSON: the default rendering (``json.dumps`` escapes every control but DEL)."""
    return Document(json.dumps(body, indent=2, sort_keys=False))


def render_health(body: Any) -> str:
    """One status line, then one line per check that is not passing."""
    lines = [f"{_cell(body['status'])}: {_cell(body['output'])} (capd {_cell(body['version'])})"]
    for key, items in body.get("checks", {}).items():
        for item in items:
            if item.get("status") != "pass":
                lines.append(f"  {_cell(item['status']):<5} {_cell(key)}: "
                             f"{_cell(item.get('output', ''))}")
    return "\n".join(lines)


def render_list(body: Any, *, wide: bool = False) -> str:
    """A table of capsules (``wide``: their latency class, tags and aliases too), and how
    to see the next page when there is one."""
    table = _columns(("STATE", "CAPABILITY", "LATENCY", "TAGS", "ALIASES", "SUMMARY"), [
        (c["state"], c["name"], c.get("latency_class") or "-",
         ",".join(c.get("tags", [])) or "-", ",".join(c.get("aliases", [])) or "-",
         c["summary"]) for c in body["capabilities"]], wide, frozenset({2, 3, 4}))
    more = body.get("next_cursor")
    return table if not more else (f"{table}\n... more: capd list --cursor {_cell(more)} "
                                   "(or --limit up to 1000)")


def render_call(body: Any) -> str:
    """The result on success; the state, error type and message otherwise."""
    if body["status"] == "success":
        return render_json(body["result"])
    text = (f"{_cell(body['status'])}: {_cell(body.get('error_type') or '')}: "
            f"{_cell(body.get('message') or '')}")
    if body.get("queued") and _cell(body["queued"]) not in text:
        text += f"\nqueued as job {_cell(body['queued'])}"
    if body.get("alternatives"):
        text += f"\nalternatives: {', '.join(_cell(a) for a in body['alternatives'])}"
    return text


def render_jobs(body: Any, *, wide: bool = False) -> str:
    """A table of retry jobs (``wide``: their policy, when accepted and when due too)."""
    jobs = body["jobs"]
    if not jobs:
        return "no job"
    return _columns(("ID", "STATE", "TRIES", "POLICY", "CAPABILITY", "CREATED", "NEXT RUN",
                     "DETAIL"), [
        (j["id"], j["state"], f"{j['attempts']}/{j['max_attempts']}", j.get("policy", "-"),
         j["capability"], _text("created_at", j.get("created_at")),
         _text("next_run_at", j.get("next_run_at")), _job_note(j))
        for j in jobs], wide, frozenset({3, 5, 6}), right=frozenset({2}))


def _job_note(job: Any) -> str:
    """What a job waits for, else its last error while it is unfinished (a done job's
    last error is history, not news)."""
    if job.get("waiting_for"):
        return str(job["waiting_for"])
    if job["state"] in ("done", "cancelled"):
        return ""
    return str(job.get("last_error") or "")


def render_search(body: Any, *, wide: bool = False) -> str:
    """A table of hits, best first: relevance in [0, 1] (or ``exact``), state, name, summary
    (``wide``: the raw fused score, latency class and tags too)."""
    hits = body["results"]
    if not hits:
        return "no capability matches"
    rows: list[tuple[Any, ...]] = []
    for hit in hits:
        exact = hit.get("exact") or hit.get("score") is None
        relevance = "exact" if exact else f"{hit.get('relevance', 0.0):.2f}"
        summary = _cell(hit["summary"])
        if hit.get("disabled"):
            summary += f" (missing: {', '.join(_cell(t) for t in hit['disabled']['missing'])})"
            hints = hit["disabled"].get("install_hints") or {}
            summary += "".join(f" (install {_cell(tool)}: {_cell(hint)})"
                               for tool, hint in hints.items())
        rows.append((relevance, "-" if exact or not wide else f"{hit['score']:.4f}",
                     hit["state"], hit["name"], hit.get("latency_class") or "-",
                     ",".join(hit.get("tags", [])) or "-", summary))
    return _columns(("RELEVANCE", "SCORE", "STATE", "CAPABILITY", "LATENCY", "TAGS", "SUMMARY"),
                    rows, wide, frozenset({1, 4, 5}), right=frozenset({0, 1}))


def render_agents(body: Any) -> str:
    """A table of agents and their entries, then the run-time injections."""
    agents = body["agents"]
    if not agents:
        return "no agent is declared; add [agents.NAME] to capd.toml"
    lines = table(("AGENT", "CAPABILITIES"),
                  [(a["agent"], ", ".join(a["capabilities"])) for a in agents]).splitlines()
    for injection in body.get("injections", []):
        why = f"  ({_cell(injection['why'])})" if injection.get("why") else ""
        added = ", ".join(_cell(name) for name in injection["add"])
        lines.append(f"injection: when {_cell(injection['when'])} add {added}{why}")
    return "\n".join(lines)


def render_agent(body: Any) -> str:
    """One agent: each entry and what it selects (or why it selects nothing)."""
    lines = [f"{_cell(body['agent'])}: {_cell(body['description'])}" if body.get("description")
             else _cell(body["agent"])]
    for item in body["expansion"]:
        found = (", ".join(_cell(c) for c in item["capabilities"])
                 or f"NOTHING: {_cell(item.get('problem', ''))}")
        lines.append(f"  {_cell(item['entry'])} ({_cell(item['kind'])}) -> {found}")
    return "\n".join(lines)


def render_topologies(body: Any) -> str:
    """A table of topologies: id, roles, instances, title; then what could not be read."""
    tops = body["topologies"]
    lines = table(("TOPOLOGY", "INSTANCES", "TITLE"),
                  [(t["id"], t["instances"], t["title"]) for t in tops],
                  right=frozenset({1})).splitlines()
    lines += [f"error: {_cell(e['message'])}" for e in body.get("errors", [])]
    return "\n".join(lines)


def render_validation(body: Any) -> str:
    """``ok ID`` or ``invalid ID`` with one indented line per problem."""
    lines = []
    for top in body["topologies"]:
        lines.append(f"{'ok' if top['ok'] else 'invalid'} {_cell(top['id'])}")
        lines += [f"  {_cell(problem)}" for problem in top["problems"]]
    lines += [f"error: {_cell(e['message'])}" for e in body.get("errors", [])]
    return "\n".join(lines) or "no topology is declared"


def render_export(body: Any) -> Document:
    """The tool definitions alone, as the provider's API takes them (``tools=[...]``);
    what could not be rendered is named on stderr, so a redirected file stays clean."""
    for item in body.get("skipped", []):
        echo(f"capd: skipped {_cell(item['name'])}: {_cell(item['reason'])}", err=True)
    return render_json(body["tools"])


CLI_WORDS = {"Capd-Timeout": "--timeout", "Capd-Run-Disabled": "--run-disabled",
             "Idempotency-Key": "idempotency key"}
"""The API's header names as the CLI's own words, in the sentences it prints."""


def cli_words(text: str) -> str:
    """``text`` with the API's header names said as the CLI's options."""
    for api, cli in CLI_WORDS.items():
        text = text.replace(api, cli)
    return text


def describe_failure(command: str, body: Any) -> str:
    """One sentence for an answer that is not 2xx, for ``capd: <sentence>`` on stderr.

    A problem body gives its ``detail``; a ToolResult names the capability, the
    message, its state and error type; a body with an ``error`` (a failed reload)
    says that ``command`` failed and why. The sentence keeps the message's own
    line breaks (a reload's declaration errors read better as lines; stderr has no
    rows to break); ``echo`` escapes everything else in it.
    """
    if not isinstance(body, dict):
        return f"{command} failed: {body}"
    if body.get("detail"):
        return cli_words(str(body["detail"]))
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


def render_offers(body: Any) -> str:
    """Resources, templates or prompts: name and uri, then the description."""
    lines: list[str] = []
    for kind, key in (("resources", "uri"), ("templates", "uriTemplate"), ("prompts", "name")):
        for item in body.get(kind, []):
            where = _cell(item.get(key, ""))
            name = _cell(item.get("name", ""))
            label = where if key == "name" else f"{name}  {where}"
            args = ", ".join(_cell(a.get("name", "")) + ("" if a.get("required") else "?")
                             for a in item.get("arguments", []))
            lines.append(label + (f"({args})" if kind == "prompts" else "")
                         + (f"\n    {_cell(item['description'])}" if item.get("description")
                            else ""))
    return "\n".join(lines) or "(none)"


def render_contents(body: Any) -> str:
    """A resource's text contents as they are; binary ones are saved or described after."""
    parts = [_cell(c["text"]) for c in body.get("contents", []) if isinstance(c.get("text"), str)]
    return "\n".join(parts)


def render_prompt(body: Any) -> str:
    """A prompt's messages, a role and its text each."""
    lines = [f"({_cell(body['description'])})"] if body.get("description") else []
    for message in body.get("messages", []):
        content = message.get("content", {})
        text = content.get("text") if isinstance(content, dict) else None
        shown = _cell(text) if isinstance(text, str) else f"[{_cell(content.get('type'))} block]"
        lines.append(f"{_cell(message.get('role'))}: {shown}")
    return "\n".join(lines)


def render_token(body: Any) -> str:
    """A new token: the token itself (shown once) and what it reaches."""
    reach = f"profile {_cell(body['profile'])}" if body.get("profile") else ""
    if body.get("allow"):
        reach += (", " if reach else "") + "allow " + ", ".join(_cell(a) for a in body["allow"])
    return (f"{_cell(body['token'])}\n"
            f"token {_cell(body['name'])} (id {_cell(body['id'])}): {reach}; "
            "shown this once, capd keeps only its hash")


def render_tokens(body: Any) -> str:
    """A table of tokens."""
    return table(("NAME", "ID", "STATE", "REACH"), [
        (t["name"], t["id"], t["state"],
         (t.get("profile") or "") + ("" if not t.get("allow") else f" allow:{len(t['allow'])}"))
        for t in body["tokens"]])


RENDERERS: dict[str, Callable[[Any], str]] = {
    "fields": render_fields, "token": render_token, "tokens": render_tokens,
    "offers": render_offers, "contents": render_contents, "prompt": render_prompt,
    "json": render_json, "export": render_export, "agent": render_agent,
    "agents": render_agents, "call": render_call, "health": render_health,
    "jobs": render_jobs, "list": render_list, "search": render_search,
    "topologies": render_topologies, "validation": render_validation}
"""How the CLI prints an answer, by the name an operator-table row gives (``json``: a
body read as it is, printed as fields on a terminal)."""

WIDE: dict[str, Callable[[Any], str]] = {
    name: partial(render, wide=True)
    for name, render in (("list", render_list), ("jobs", render_jobs), ("search", render_search))
}
"""``-o wide``: the renderers with more columns; the others print as ``-o table``."""
