"""MCP clients and capd, both ways: ``capd mcp-config`` prints the entry each client reads
to reach capd (the stdio bridge, or the front door over HTTP), and ``capd import`` takes the
``mcpServers`` a user already keeps (Claude Desktop's, Cursor's, Claude Code's
``.mcp.json``, VS Code's ``servers``) into capd.toml as upstream MCP tools.

What can be taken becomes a ``[tools.ID]`` table appended to the file (its own text kept
as it is), shown as a diff before anything is written; what cannot (a server already
there, capd's own bridge, headers capd cannot send, a transport it does not speak) is
listed with why.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from capd.registry import ConfigError

from .._paths import DEFAULT_CONFIG_ENV
from ._table_cli import EXIT_FAILED, EXIT_OK, UsageError, socket_path
from ._terminal import echo

if TYPE_CHECKING:  # the bridge's module loads the MCP SDK: only `capd mcp` needs it
    from ._mcp import Profile

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


def import_servers(source: Path, before: str) -> tuple[str, list[tuple[str, str]]]:
    """The text a capd.toml holding ``before`` would have with ``source``'s servers
    appended, and what was left out with why; raise ValueError when ``source`` holds no
    servers, or ``before`` is no TOML (tomllib's error is a ValueError)."""
    import tomllib  # here, not at every start of the CLI

    known = set(tomllib.loads(before).get("tools", {}))
    try:
        document = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ValueError(f"{source}: {getattr(exc, 'strerror', None) or exc}") from None
    servers = (document.get("mcpServers") or document.get("servers")
               if isinstance(document, dict) else None)
    if not isinstance(servers, dict) or not servers:
        raise ValueError(f"{source}: no mcpServers (or servers) object in it")
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
    import difflib

    return "".join(difflib.unified_diff(before.splitlines(keepends=True),
                                        after.splitlines(keepends=True),
                                        f"{config} (now)", f"{config} (imported)"))


def bridge_profile(args: argparse.Namespace) -> Profile | None:
    """What ``--profile`` or ``--allow`` restricts the bridge to (one of them at most)."""
    from ._mcp import allow_profile, load_profile

    if args.profile and args.allow:
        raise UsageError("--profile and --allow both restrict the bridge; pass one of them")
    if args.allow:
        try:
            return allow_profile(args.allow)
        except ValueError as exc:
            raise UsageError(f"--allow: {exc}") from None
    return load_profile(Path(args.profile)) if args.profile else None


CLIENTS = ("claude", "claude-code", "cursor", "vscode")
"""The MCP clients ``capd mcp-config --client`` writes an entry for, in each one's format."""


def cmd_mcp_config(args: argparse.Namespace) -> int:
    """Print the configuration entry an MCP client reads to reach capd: the stdio bridge
    it launches, or (``--http``) the daemon's front door with a bearer token."""
    name, server = ("capd", _http_entry(args)) if args.http else _bridge_entry(args)
    client = args.client or "claude"
    if client == "vscode":  # .vscode/mcp.json: "servers", each with its type
        entry: dict[str, Any] = {"servers": {name: {"type": "http" if args.http else "stdio",
                                                     **server}}}
        if args.http and not args.token:  # VS Code asks for it once and keeps it secret
            entry["inputs"] = [{"type": "promptString", "id": "capd-token", "password": True,
                                "description": "capd bearer token (capd token create)"}]
    elif client == "claude-code":  # .mcp.json
        entry = {"mcpServers": {name: {"type": "http" if args.http else "stdio", **server}}}
    else:  # Claude Desktop's claude_desktop_config.json, Cursor's mcp.json
        entry = {"mcpServers": {name: server}}
    print(json.dumps(entry, indent=2))
    return EXIT_OK


def _bridge_entry(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The bridge as a client launches it: its name and its command line."""
    command = str(Path(sys.argv[0]).resolve()) if Path(sys.argv[0]).name == "capd" else "capd"
    arguments = ["mcp", "--socket", str(socket_path(args.socket))]
    name = "capd"
    profile = bridge_profile(args)
    if args.profile and profile is not None:
        arguments += ["--profile", str(Path(args.profile).resolve())]
        name = f"capd-{profile.name}"
    elif profile is not None:
        arguments += ["--allow", ",".join(sorted(profile.capabilities))]
    if args.expose == "direct":
        arguments += ["--expose", "direct", *(x for t in args.tag or () for x in ("--tag", t))]
    arguments += [x for flag in ("channel", "tools") if getattr(args, flag)
                  for x in (f"--{flag}", getattr(args, flag))]
    return name, {"command": command, "args": arguments}


def _http_entry(args: argparse.Namespace) -> dict[str, Any]:
    """The front door as a client reaches it over HTTP, with its bearer token."""
    if not re.match(r"^https?://[^/\s]+/\S*$", args.http):
        raise UsageError(f"--http {args.http!r}: give the front door's URL, e.g. "
                         "http://127.0.0.1:8765/mcp ([mcp.http] in capd.toml)")
    what = [flag for flag in ("profile", "allow", "channel", "tools", "tag")
            if getattr(args, flag)] + (["expose"] if args.expose != "meta" else [])
    if what:  # over HTTP the token is the grant
        raise UsageError(f"--{what[0]} is the bridge's: over --http a token's profile or "
                         "allow list is its reach (capd token create --profile NAME)")
    if (args.client or "claude") == "claude":
        raise UsageError("Claude Desktop's config file starts local servers only: leave out "
                         "--http (it launches capd mcp), or add the URL as a custom connector "
                         "in its settings")
    token = args.token or ("${input:capd-token}" if args.client == "vscode" else None)
    if token is None:
        raise UsageError(f"--client {args.client or 'claude'} over --http needs --token "
                         "(capd token create --profile NAME prints one)")
    return {"url": args.http, "headers": {"Authorization": f"Bearer {token}"}}


def cmd_import(args: argparse.Namespace) -> int:
    """Append the MCP servers of a client's configuration to capd.toml as upstream tools,
    after showing the diff (and asking, on a terminal, unless --yes)."""
    import tempfile

    config = Path(args.config or os.environ.get(DEFAULT_CONFIG_ENV) or "capd.toml")
    try:
        before = config.read_text(encoding="utf-8") if config.exists() else ""
        after, skipped = import_servers(Path(args.path), before)
    except (OSError, ValueError) as exc:
        echo(f"capd: {exc}", err=True)
        return EXIT_FAILED
    for name, why in skipped:
        echo(f"capd: left out {name!r}: {why}", err=True)
    if after == before:
        echo("capd: nothing to import", err=True)
        return EXIT_FAILED
    echo(diff(config, before, after), end="")
    target = config.resolve()  # a capd.toml that is a link: the file it names
    try:  # what is written must load: checked on the new text, beside the file
        from ..server import load_config

        handle, trial_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        trial = Path(trial_name)
    except OSError as exc:
        echo(f"capd: cannot write beside {target}: {exc.strerror or exc}", err=True)
        return EXIT_FAILED
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(after)
        if target.exists():  # the same mode and owner: a secret in an env stays private
            mode = target.stat()
            os.chmod(trial, mode.st_mode & 0o7777)
            if os.geteuid() == 0:
                os.chown(trial, mode.st_uid, mode.st_gid)
        load_config(trial)
        if not args.yes and not (sys.stdin.isatty() and input(
                f"write this to {config}? [y/N] ").strip().lower() in ("y", "yes")):
            echo(f"capd: nothing written (capd import {args.path} --yes writes it)", err=True)
            return EXIT_OK
        trial.replace(target)
    except ConfigError as exc:
        echo(f"capd: {config} would not load with these, nothing written: "
             f"{str(exc).replace(str(trial), str(config))}", err=True)
        return EXIT_FAILED
    except OSError as exc:
        echo(f"capd: cannot write {target}: {exc.strerror or exc}", err=True)
        return EXIT_FAILED
    finally:
        trial.unlink(missing_ok=True)
    echo(f"capd: wrote {config}; capd reload (or capd check) takes the servers in", err=True)
    return EXIT_OK
