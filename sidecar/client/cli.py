"""The ``capd`` command line.

Daemon commands are generated from the operator table (``_table.COMMANDS``):
each row is one subcommand whose ``--json`` output equals the HTTP body. Two
local commands stand beside them: ``serve`` (run the daemon) and ``check``
(build the registry once and print it).

Exit status: 0 done, 1 failed (the reason on stderr), 2 usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from capd.registry import CapdError, ConfigError, build

from .._paths import DEFAULT_CONFIG_ENV, default_socket_path
from .._table import COMMANDS, OperatorCommand
from .._views import check_report, render_check_table
from ._client import request
from ._render import RENDERERS

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

LOCAL_COMMANDS = ("serve", "check", "mcp", "mcp-config")


class UsageError(Exception):
    """The command line is wrong: exit 2."""


def _config_path(value: str | None) -> Path | None:
    chosen = value or os.environ.get(DEFAULT_CONFIG_ENV)
    if chosen:
        return Path(chosen)
    default = Path("capd.toml")
    return default if default.exists() else None


def _socket_path(value: str | None) -> Path:
    chosen = value or os.environ.get("CAPD_SOCKET")
    return Path(chosen) if chosen else default_socket_path()


# ----------------------------------------------------------------- local commands


def cmd_check(args: argparse.Namespace) -> int:
    """Build the registry once and print live and disabled capabilities."""
    from ..server import load_config

    loaded = load_config(_config_path(args.config))
    registry = asyncio.run(build(loaded.build_config()))
    report = check_report(registry.snapshot())
    report["not_on_host"] = dict(registry.not_on_host)
    print(json.dumps(report, indent=2) if args.json else render_check_table(report))
    if args.strict and report["errors"]:
        return EXIT_FAILED
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon in the foreground until SIGTERM/SIGINT."""
    from .._logging import configure_logging
    from ..server import Daemon, load_config, run_daemon

    writer = configure_logging(args.log_level, args.log_format)
    # A reload re-imports plugins; cached bytecode could hide an edit made within
    # the same second that kept the file's size, so the daemon writes none.
    sys.dont_write_bytecode = True
    config_path = _config_path(args.config)
    if config_path is None:  # a daemon with no capabilities is a mistake, not a default
        raise ConfigError(
            "no config found: pass --config PATH, set CAPD_CONFIG, or run in a folder holding "
            "capd.toml (the bundled example: --config examples/capd.toml)")
    loaded = load_config(config_path)
    socket_path = Path(args.socket) if args.socket else None
    daemon = Daemon(loaded, socket_path=socket_path)
    code = run_daemon(daemon.run())
    # Everything durable is closed by now (queue, socket). Leave without joining op
    # threads that outlived the grace period: a hung op must not hold the process.
    if writer is not None:
        writer.drain()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cmd_mcp(args: argparse.Namespace) -> int:
    """Serve MCP on stdio, forwarding to the daemon."""
    import anyio

    from .._logging import configure_logging
    from .._errors import DaemonDown
    from ._mcp import Bridge, DaemonLink, load_profile, serve

    configure_logging("warning", "json", stream=sys.stderr)  # stdout is the MCP channel
    profile = load_profile(Path(args.profile)) if args.profile else None
    if args.expose == "meta" and args.tag:
        raise UsageError("--tag chooses what --expose direct exposes; add --expose direct")
    bridge = Bridge(DaemonLink(_socket_path(args.socket)), profile=profile,
                    direct_tags=frozenset(args.tag or ()) if args.expose == "direct" else None)

    async def main() -> None:
        try:
            await bridge.validate_profile()
        except DaemonDown as exc:
            print(f"capd mcp: {exc} The profile is checked when the daemon answers.",
                  file=sys.stderr)
        await serve(bridge)

    anyio.run(main)
    return EXIT_OK


def cmd_mcp_config(args: argparse.Namespace) -> int:
    """Print the JSON an MCP client's configuration needs to launch the bridge."""
    from ._mcp import load_profile

    command = str(Path(sys.argv[0]).resolve()) if Path(sys.argv[0]).name == "capd" else "capd"
    arguments = ["mcp", "--socket", str(_socket_path(args.socket))]
    name = "capd"
    if args.profile:
        profile = load_profile(Path(args.profile))
        arguments += ["--profile", str(Path(args.profile).resolve())]
        name = f"capd-{profile.name}"
    if args.expose == "direct":
        arguments += ["--expose", "direct", *(x for t in args.tag or () for x in ("--tag", t))]
    print(json.dumps({"mcpServers": {name: {"command": command, "args": arguments}}},
                     indent=2))
    return EXIT_OK


# ----------------------------------------------------------- table-driven commands


def _parse_params(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if args.params is not None:
        try:
            loaded = json.loads(args.params)
        except ValueError as exc:
            raise UsageError(f"--params is not valid JSON: {exc}") from None
        if not isinstance(loaded, dict):
            raise UsageError("--params must be a JSON object")
        params.update(loaded)
    for item in args.param or ():
        if ":=" in item:
            key, _, raw = item.partition(":=")
            try:
                params[key] = json.loads(raw)
            except ValueError as exc:
                raise UsageError(f"-p {item}: the value after := is not JSON: {exc}") from None
        elif "=" in item:
            key, _, value = item.partition("=")
            params[key] = value
        else:
            raise UsageError(f"-p {item}: use key=value (a string) or key:=json")
    return params


def run_table_command(row: OperatorCommand, args: argparse.Namespace) -> int:
    """Send ``row``'s request built from ``args`` and print the answer."""
    path = row.path
    for name in row.path_params:
        path = path.replace("{" + name + "}", quote(getattr(args, name), safe=""))
    query = {}
    body: dict[str, Any] | None = None
    for option in row.options:
        value = getattr(args, option.flags[0] if option.positional else option.dest)
        if value in (None, False):
            continue
        if option.target == "query":
            query[option.dest] = "true" if value is True else str(value)
        else:
            body = {**(body or {}), option.dest: value}
    if row.takes_params:
        body = _parse_params(args)
    if query:
        path += "?" + urlencode(query)
    response = request(_socket_path(args.socket), row.method, path, body=body)
    ok = 200 <= response.status < 300
    problem = response.content_type.startswith("application/problem+json")
    if isinstance(response.body, str):  # a text body (metrics) is printed as it came
        print(response.body, end="" if response.body.endswith("\n") else "\n")
    elif args.json:
        print(json.dumps(response.body, indent=2))
    elif problem and isinstance(response.body, dict):
        print(f"capd: {response.body.get('detail', response.body)}", file=sys.stderr)
    elif not row.json_mode:
        print(response.body.get("status") if isinstance(response.body, dict) else response.body)
    else:
        print(RENDERERS[row.render](response.body))
    return EXIT_OK if ok else EXIT_FAILED


def _add_table_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    groups: dict[tuple[str, ...], argparse._SubParsersAction[argparse.ArgumentParser]] = {(): sub}
    for row in COMMANDS:
        parent = groups[()]
        for depth in range(1, len(row.cli)):
            prefix = row.cli[:depth]
            if prefix not in groups:
                group_parser = groups[prefix[:-1]].add_parser(
                    prefix[-1], help=f"{prefix[-1]} commands"
                )
                groups[prefix] = group_parser.add_subparsers(
                    dest=f"cmd_{depth}", metavar="COMMAND"
                )
                groups[prefix].required = True
            parent = groups[prefix]
        parser = parent.add_parser(row.cli[-1], help=row.summary, description=row.summary)
        for name in row.path_params:
            parser.add_argument(name, metavar=name.upper())
        for option in row.options:
            if option.positional:
                parser.add_argument(option.flags[0], metavar=option.flags[0].upper(),
                                    help=option.help)
                continue
            if option.is_flag:
                parser.add_argument(*option.flags, dest=option.dest, action="store_true",
                                    help=option.help)
            else:
                parser.add_argument(*option.flags, dest=option.dest, help=option.help,
                                    choices=option.choices)
        if row.takes_params:
            parser.add_argument("--params", help="parameters as one JSON object")
            parser.add_argument("-p", dest="param", action="append", metavar="KEY=VALUE",
                                help="one parameter: key=value (string) or key:=json; repeatable")
        parser.add_argument("--json", action="store_true", help="print the HTTP body as JSON")
        parser.add_argument("--socket", help="daemon socket (default: $CAPD_SOCKET or "
                            f"{default_socket_path()})")
        parser.set_defaults(handler=lambda a, row=row: run_table_command(row, a), row=row.id)


def make_parser() -> argparse.ArgumentParser:
    """The argument parser of every ``capd`` subcommand."""
    parser = argparse.ArgumentParser(prog="capd", description="capd: a capability sidecar.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    serve = sub.add_parser("serve", help="run the daemon in the foreground")
    serve.add_argument("--config", help="capd.toml (default: $CAPD_CONFIG or ./capd.toml)")
    serve.add_argument("--socket", help=f"socket path (default: {default_socket_path()})")
    serve.add_argument("--log-level", default="info",
                       choices=("debug", "info", "warning", "error"))
    serve.add_argument("--log-format", default="auto", choices=("auto", "json", "console"),
                       help="auto: console on a terminal, JSON lines otherwise")
    serve.set_defaults(handler=cmd_serve)

    check = sub.add_parser("check", help="build the registry once and print what is live")
    check.add_argument("--config", help="capd.toml (default: $CAPD_CONFIG or ./capd.toml)")
    check.add_argument("--json", action="store_true", help="print JSON")
    check.add_argument(
        "--strict", action="store_true", help="exit 1 when any declaration has an error"
    )
    check.set_defaults(handler=cmd_check)

    for name, handler, summary in (
        ("mcp", cmd_mcp, "serve MCP on stdio, forwarding to the daemon"),
        ("mcp-config", cmd_mcp_config, "print the MCP client config entry for the bridge"),
    ):
        mcp = sub.add_parser(name, help=summary, description=summary)
        mcp.add_argument("--socket", help="daemon socket (default: $CAPD_SOCKET or "
                         f"{default_socket_path()})")
        mcp.add_argument("--profile", help="a profile TOML limiting what the agent sees")
        mcp.add_argument("--expose", choices=("meta", "direct"), default="meta",
                         help="direct: also offer matching capabilities as tools")
        mcp.add_argument("--tag", action="append", help="with --expose direct: these tags")
        mcp.set_defaults(handler=handler)

    _add_table_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``capd``; return the exit status (0 ok, 1 failed, 2 usage)."""
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except UsageError as exc:
        print(f"capd: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CapdError as exc:
        print(f"capd: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
