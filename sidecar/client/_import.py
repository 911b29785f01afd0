"""``capd import``: the ``mcpServers`` a user already keeps (Claude Desktop's, Cursor's,
Claude Code's ``.mcp.json``, VS Code's ``servers``) as upstream MCP tools of capd.toml.

What can be taken becomes a ``[tools.ID]`` table appended to the file (its own text kept
as it is), shown as a diff before anything is written; what cannot (a server already
there, capd's own bridge, headers capd cannot send, a transport it does not speak) is
listed with why.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

_ID = re.compile(r"[^a-z0-9_]+")


def _tool_id(name: str) -> str:
    """A server's name as a tool id (and capability prefix): lower case, letters, digits
    and ``_``, starting with a letter."""
    tool = _ID.sub("_", name.lower()).strip("_")
    return tool if tool[:1].isalpha() else f"mcp_{tool}"


def _toml(value: Any) -> str:
    """``value`` as TOML: a JSON string or list of strings is one, every control or
    non-ASCII character escaped (nothing the source holds can end a line or a table)."""
    return json.dumps(value)


def _table(tool: str, server: dict[str, Any]) -> str:
    lines = [f"[tools.{tool}]", 'kind = "mcp"']
    if "url" in server:
        lines.append(f"url = {_toml(server['url'])}")
    else:
        lines.append(f"command = {_toml([server['command'], *server.get('args', [])])}")
    env = server.get("env") or {}
    if env:
        lines.append("env = { " + ", ".join(f"{_toml(k)} = {_toml(str(v))}"
                                            for k, v in env.items()) + " }")
    return "\n".join(lines) + "\n"


def _why_not(name: str, server: Any, known: set[str], taken: dict[str, str]) -> str | None:
    """Why ``server`` cannot be imported (None: it can)."""
    if not isinstance(server, dict):
        return "not an object"
    if _tool_id(name) in known:
        return f"[tools.{_tool_id(name)}] is in capd.toml already"
    if _tool_id(name) in taken:
        return (f"its id {_tool_id(name)} is {taken[_tool_id(name)]!r}'s too; rename one "
                "in the file and import again")
    command, url = server.get("command"), server.get("url")
    if (command is None) == (url is None):
        return "needs exactly one of command (stdio) or url (streamable HTTP)"
    if server.get("type") not in (None, "stdio", "http", "streamable-http"):
        return f"transport {server.get('type')!r}: capd speaks stdio and streamable HTTP"
    if url is not None and (server.get("headers") or not re.match(r"^https?://", str(url))):
        return ("sends headers (a token): capd sends none to an upstream yet"
                if server.get("headers") else f"url {url!r} is not http(s)")
    args = server.get("args", [])
    if not isinstance(command or "", str) or not isinstance(args, list) \
            or not all(isinstance(a, str) for a in args):
        return "command must be a string and args a list of strings"
    if command is not None and Path(command).name == "capd" and args[:1] == ["mcp"]:
        return "capd's own bridge (importing it would loop)"
    return None


def import_servers(source: Path, config: Path, known: set[str]
                   ) -> tuple[str, list[tuple[str, str]]]:
    """The text ``config`` would have with ``source``'s servers appended, and what was
    left out with why; raise ValueError when ``source`` holds no servers."""
    try:
        document = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ValueError(f"{source}: {getattr(exc, 'strerror', None) or exc}") from None
    servers = (document.get("mcpServers") or document.get("servers")
               if isinstance(document, dict) else None)
    if not isinstance(servers, dict) or not servers:
        raise ValueError(f"{source}: no mcpServers (or servers) object in it")
    before = config.read_text(encoding="utf-8") if config.exists() else ""
    tables: list[str] = []
    skipped: list[tuple[str, str]] = []
    taken: dict[str, str] = {}
    for name, server in servers.items():
        why = _why_not(name, server, known, taken)
        if why is None:
            tool = _tool_id(name)
            taken[tool] = name
            tables.append(f"# imported from {_toml(source.name)}: {_toml(name)}\n"
                          f"{_table(tool, server)}")
        else:
            skipped.append((name, why))
    after = before + ("\n" if before and not before.endswith("\n\n") else "") + "\n".join(tables)
    return (after if tables else before), skipped


def diff(config: Path, before: str, after: str) -> str:
    """``before`` → ``after`` as a unified diff of ``config``."""
    return "".join(difflib.unified_diff(before.splitlines(keepends=True),
                                        after.splitlines(keepends=True),
                                        f"{config} (now)", f"{config} (imported)"))
