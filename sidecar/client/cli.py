"""The ``capd`` command line.

Daemon commands are generated from the operator table (``_table.COMMANDS``, see ``_table_cli``):
each row is one subcommand whose ``--json`` output equals the HTTP body. Local
commands stand beside them: ``serve`` (run the daemon), ``check`` (build the
registry once and print it), ``mcp`` and ``mcp-config`` (the MCP bridge),
``completion`` (a shell completion script) and ``install-units`` (the packaged
service files). Every subcommand's ``--help`` ends with examples.

Exit status: 0 done, 1 failed (one ``capd: <sentence>`` on stderr), 2 usage,
130 interrupted (Ctrl-C), 141 the reader of stdout went away (``| head``).

Output: ``--json`` is printed as ``json.dumps`` gives it; everything else goes
through ``_terminal.echo``, which escapes what could steer a terminal (ESC, BEL,
bidi overrides; see ``_terminal``) and leaves a machine format (``Document``)
exact when it is redirected.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from capd.registry import CapdError, ConfigError

from .._errors import DaemonDown
from .._paths import DEFAULT_CONFIG_ENV, capd_version, default_socket_path
from ._clients import CLIENTS, bridge_profile, cmd_import, cmd_mcp_config
from ._completion import SHELLS, actions_of
from ._table_cli import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    OUTPUTS,
    UsageError,
    add_command,
    add_socket,
    add_table_commands,
    output_format,
    print_data,
    socket_path,
)
from ._terminal import Document, echo

if TYPE_CHECKING:  # the bridge's module loads the MCP SDK: only `capd mcp` needs it
    from ..server import LoadedConfig

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a program stopped by Ctrl-C
EXIT_PIPE = 141         # 128 + SIGPIPE, as a shell reports `yes | head -1`

LOCAL_COMMANDS = ("serve", "check", "mcp", "mcp-config", "import", "completion", "install-units",
                  "top")


# ----------------------------------------------------------------- local commands


def cmd_top(args: argparse.Namespace) -> int:
    """``capd top``: the live view, until q (or Ctrl-C)."""
    from ._top import run_top  # curses: only for this command

    if args.interval <= 0:
        raise UsageError(f"--interval {args.interval:g}: give a number of seconds above 0")
    return run_top(socket_path(args.socket), args.interval)


def bundled_example() -> str:
    """The bundled example's capd.toml as a path to type here: relative inside a
    checkout (``examples/capd.toml``), else where the package installed it."""
    from importlib.resources import files

    path = Path(str(files("capd") / "examples" / "capd.toml"))
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _load_config(args: argparse.Namespace) -> LoadedConfig:
    """The config ``--config`` names, else $CAPD_CONFIG, else ./capd.toml; raise
    :class:`ConfigError` when there is none (nothing to check is not a pass, and a daemon
    with no capabilities is a mistake, not a default)."""
    from ..server import load_config

    chosen = args.config or os.environ.get(DEFAULT_CONFIG_ENV)
    if not chosen and not Path("capd.toml").exists():
        raise ConfigError("no config found: pass --config PATH, set CAPD_CONFIG, or run in a "
                          f"folder holding capd.toml (the bundled example: --config "
                          f"{bundled_example()})")
    return load_config(Path(chosen or "capd.toml"))


def cmd_check(args: argparse.Namespace) -> int:
    """Build the registry once and print live and disabled capabilities."""
    from .._logging import configure_logging
    from ..server import run_daemon

    # stdout is the report (JSON when piped): the build's log lines go to stderr, warnings up
    configure_logging("warning", "console", stream=sys.stderr)
    loaded = _load_config(args)
    for variable in loaded.unknown_env:
        echo(f"capd: warning: {variable.sentence()}", err=True)
    for path in loaded.seed():  # what the daemon would find at its start
        echo(f"capd: seeded {path} (as the daemon's first start would)", err=True)
    from capd.registry import build  # the model and the build: only for check

    from .._views import check_report, render_check_table

    # under the daemon's own loop (uvloop), so that a probe's failure reads as it will there
    registry = run_daemon(build(loaded.build_config()))
    report = check_report(registry.snapshot())
    report["not_on_host"] = dict(registry.not_on_host)
    output, _asked = output_format(args)
    if output in ("json", "yaml"):
        print_data(report, output)
    else:
        echo(render_check_table(report))
    unloaded = [e["message"] for e in report["errors"] if e.get("whole_file")]
    for message in unloaded:
        echo(f"capd: {message}: the file did not load", err=True)
    if not report["live"]:
        echo("capd: nothing is live: the daemon would serve no capability", err=True)
    if unloaded or not report["live"]:
        return EXIT_FAILED  # the build failed, whatever --strict says
    if args.strict and (report["errors"] or report["warnings"]):
        return EXIT_FAILED  # --strict: a parameter without a description fails too
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon in the foreground until SIGTERM/SIGINT."""
    import structlog

    from .._logging import configure_logging
    from ..server import Daemon, run_daemon

    writer = configure_logging(args.log_level, args.log_format)
    log = structlog.get_logger("capd.cli")
    # A reload re-imports plugins; cached bytecode could hide an edit made within
    # the same second that kept the file's size, so the daemon writes none.
    sys.dont_write_bytecode = True
    loaded = _load_config(args)
    for variable in loaded.unknown_env:
        log.warning("unknown_environment_variable", variable=variable.name,
                    did_you_mean=variable.suggestion)
    for path in loaded.seed():
        log.info("seeded", path=str(path))
    daemon = Daemon(loaded, socket_path=Path(args.socket) if args.socket else None)
    try:
        code = run_daemon(daemon.run())
    except KeyboardInterrupt:
        # Ctrl-C before the daemon's own handlers are installed (start-up: probes,
        # plugin imports). The loop has cancelled the run, which closed the queue and
        # released the state lock; a probe thread still sleeping is not waited for.
        code = EXIT_INTERRUPTED
    # Everything durable is closed by now (queue, socket). Leave without joining op
    # threads that outlived the grace period: a hung op must not hold the process.
    if writer is not None:
        writer.drain()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cmd_mcp(args: argparse.Namespace) -> int:
    """Serve MCP on stdio, forwarding to the daemon."""
    # The bridge is a relay: it loads neither the SDK nor structlog (nothing of its own
    # writes a log line; stdout is the MCP channel).
    from ._mcp import Bridge, grant_header
    from ._mcp_stdio import refuse, serve
    from ._unixhttp import DaemonLink

    try:
        profile = bridge_profile(args)
    except (UsageError, ConfigError) as exc:
        # An MCP client shows only "connection closed" for a bridge that exits: say why on
        # stderr and as the answer to its initialize, then end.
        echo(f"capd mcp: {exc}", err=True)
        asyncio.run(refuse(f"capd mcp cannot start: {exc}"))
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILED
    if args.expose == "meta" and args.tag:
        raise UsageError("--tag chooses what --expose direct exposes; add --expose direct")
    if args.channel is not None and not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,63}",
                                                     args.channel):
        raise UsageError(f"--channel {args.channel!r}: a channel is 1-64 lower-case letters, "
                         "digits, '.', '_' or '-'")
    link = DaemonLink(socket_path(args.socket), grant=grant_header(profile, args.channel))
    bridge = Bridge(link, profile=profile,
                    direct_tags=frozenset(args.tag or ()) if args.expose == "direct" else None,
                    tool_set=args.tools)

    async def main() -> int:
        try:
            await bridge.validate_profile()
        except DaemonDown as exc:
            echo(f"capd mcp: {exc} The profile is checked when the daemon answers.", err=True)
        except ConfigError as exc:  # a name the daemon does not know: said to the client too
            echo(f"capd mcp: {exc}", err=True)
            await refuse(f"capd mcp cannot start: {exc}")
            return EXIT_FAILED
        await serve(bridge)
        return EXIT_OK

    return asyncio.run(main())


def cmd_completion(args: argparse.Namespace) -> int:
    """Print the completion script for ``args.shell``, generated from the parser."""
    from ._completion import completion_script

    echo(Document(completion_script(make_parser(), args.shell)), end="")
    return EXIT_OK


def cmd_install_units(args: argparse.Namespace) -> int:
    """Print the packaged service files, or write them where the service manager reads them."""
    from . import _units

    dest = Path(args.dest) if args.dest else None
    program = _units.running_capd()
    if program is None:
        raise UsageError("cannot tell which capd program this is (run the capd script, not "
                         "python -m capd, so the units can name it)")
    system = not (args.user or args.launchd)
    if args.example and dest is not None:
        raise UsageError("--example copies into /etc/capd (or ~/.config/capd), not into "
                         "--dest; leave one of them out")
    if args.notify_reload and not system:
        raise UsageError("--notify-reload is for the system units (not with --user or "
                         "--launchd)")
    why = _units.service_cannot_run(program) if system else None
    if why is not None:
        sentence = (f"the service cannot run {program}: {why}. Install capd where the service "
                    "can run it, with a Python outside /root and /home (python3 -m venv "
                    "/opt/capd && /opt/capd/bin/pip install /path/to/capd), then run "
                    "/opt/capd/bin/capd install-units")
        if not args.print and not dest:
            echo(f"capd: {sentence}", err=True)
            return EXIT_FAILED
        echo(f"capd: warning: {sentence}", err=True)  # printed or packaged: said, not refused
    old = _units.systemd_version() if args.notify_reload else None
    if old is not None and old < 253:
        echo(f"capd: warning: this systemd ({old}) predates Type=notify-reload (253): the "
             "unit would run as Type=simple with no reload; install without "
             "--notify-reload", err=True)
    units = _units.unit_set(user=args.user, launchd=args.launchd, dest=dest, program=program,
                            notify_reload=args.notify_reload)
    target = _units.example_config_target(user=not system)
    if args.print:
        echo(Document(_units.render_units(units)), end="")
        if args.example:
            echo(f"capd: --example would copy the bundled example to {target} (unless a "
                 "capd.toml is there)", err=True)
        return EXIT_OK
    try:
        written = _units.write_units(units)
    except OSError as exc:
        hint = "" if args.user or args.launchd or dest else " (run as root, or pass --user)"
        echo(f"capd: cannot write {exc.filename}: {exc.strerror or exc}{hint}", err=True)
        return EXIT_FAILED
    for path in written:
        echo(f"wrote {path}", err=True)
    if args.example:
        try:
            copied = _units.copy_example(target)
        except OSError as exc:
            echo(f"capd: cannot copy the example to {target}: {exc}", err=True)
            return EXIT_FAILED
        echo(f"copied the bundled example to {target} (edit {target / 'capd.toml'})"
             if copied else f"kept {target / 'capd.toml'}: it exists; the example was not "
             "copied", err=True)
    if dest is None:
        echo(f"next: {units.next_step}", err=True)
    return EXIT_OK


class _Parser(argparse.ArgumentParser):
    """argparse, with a "did you mean" for a misspelt command or flag (exit 2)."""

    def error(self, message: str) -> NoReturn:
        hint = _did_you_mean(self, message)
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}{hint}\n")


def _did_you_mean(parser: argparse.ArgumentParser, message: str) -> str:
    import difflib

    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice is not None:
        options = re.findall(r"'([^']*)'", choice.group(2)) or [
            c.strip() for c in choice.group(2).split(",")]
        close = difflib.get_close_matches(choice.group(1), options, n=3, cutoff=0.5)
        return f" (did you mean {' or '.join(close)}?)" if close else ""
    unknown = re.search(r"unrecognized arguments: (\S+)", message)
    if unknown is not None and re.fullmatch(r"[A-Za-z_][\w.-]*:?=.*", unknown.group(1)):
        pairs = " ".join(f"-p {shlex.quote(a)}" for a in message.split(": ", 1)[1].split()
                         if "=" in a)
        return f" (a parameter is given with -p: {pairs})"
    if unknown is not None and unknown.group(1).startswith("-"):
        flags = {f for a in actions_of(_ROOT[0] if _ROOT else parser)
                 for f in a.option_strings if f.startswith("--")}
        close = difflib.get_close_matches(unknown.group(1), sorted(flags), n=3, cutoff=0.6)
        return f" (did you mean {' or '.join(close)}?)" if close else ""
    return ""


_ROOT: list[argparse.ArgumentParser] = []


def make_parser() -> argparse.ArgumentParser:
    """The argument parser of every ``capd`` subcommand."""
    parser: argparse.ArgumentParser = _Parser(
        prog="capd", description="capd: a capability sidecar.",
        epilog="`capd COMMAND --help` shows a command's options and examples.")
    parser.add_argument("--version", action="version", version=f"capd {capd_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    config_help = "capd.toml (default: $CAPD_CONFIG or ./capd.toml)"

    serve = add_command(sub, "serve", "Run the daemon in the foreground until SIGTERM/SIGINT.", (
        "capd serve --config examples/capd.toml   # in a checkout (the wheel's: see "
        "capd serve with no config)",
        "capd serve --config /etc/capd/capd.toml --log-format json --log-level debug"))
    serve.add_argument("--config", help=config_help)
    serve.add_argument("--socket", help=f"socket path (default: {default_socket_path()})")
    serve.add_argument("--log-level", default="info",
                       choices=("debug", "info", "warning", "error"))
    serve.add_argument("--log-format", default="auto", choices=("auto", "json", "console"),
                       help="auto: console on a terminal, JSON lines otherwise")
    serve.set_defaults(handler=cmd_serve)

    check = add_command(sub, "check", "Build the registry once and print what is live.", (
        "capd check --config examples/capd.toml   # in a checkout",
        "capd check --strict --json   # exit 1 on any declaration error, for CI"))
    check.add_argument("--config", help=config_help)
    check.add_argument("--json", action="store_true", help="print JSON (as -o json)")
    check.add_argument("-o", "--output", choices=OUTPUTS,
                       help="table (the default on a terminal), json (the default when "
                       "piped) or yaml; wide is table here")
    check.add_argument(
        "--strict", action="store_true", help="exit 1 also when any declaration has an "
        "error or any capability has a parameter without a description (a file that does "
        "not load, or nothing live, always exits 1)"
    )
    check.set_defaults(handler=cmd_check)

    for name, handler, summary, examples in (
        ("mcp", cmd_mcp, "Serve MCP on stdio, forwarding to the daemon.", (
            "capd mcp   # what an MCP client launches; see capd mcp-config",
            "capd mcp --profile writer.toml --expose direct --tag notes",
            "capd mcp --allow notes.search,notes.append   # exactly these capabilities")),
        ("mcp-config", cmd_mcp_config, "Print the MCP client config entry for the bridge.", (
            "capd mcp-config", "capd mcp-config --profile writer.toml",
            "capd mcp-config --client vscode > .vscode/mcp.json",
            "capd mcp-config --client claude-code --http http://127.0.0.1:8765/mcp --token T",
            "capd mcp-config --allow notes.search   # or: capd agent resolve NAME")),
    ):
        mcp = add_command(sub, name, summary, examples)
        add_socket(mcp)
        mcp.add_argument("--profile", help="a profile TOML limiting what the agent sees")
        mcp.add_argument("--allow", metavar="NAMES",
                         help="comma-separated capability names: the agent sees exactly these "
                         "(as a profile listing them would); not with --profile")
        mcp.add_argument("--expose", choices=("meta", "direct"), default="meta",
                         help="direct: also offer matching capabilities as tools")
        mcp.add_argument("--tag", action="append", help="with --expose direct: these tags")
        mcp.add_argument("--tools", choices=("brief", "full"), default=None,
                         help="the meta tools listed: brief (search, get, invoke; terse) or "
                         "full (all of them, every argument); default: [mcp] tools")
        mcp.add_argument("--channel", help="the conversation channel the agent speaks from "
                         "(private, team...): capabilities declaring channels run only for "
                         "theirs; a caller [[peers]] binds to a channel cannot change it")
        if name == "mcp-config":
            mcp.add_argument("--client", choices=CLIENTS, help="the client's own format: "
                             "claude (Claude Desktop; the default), claude-code (.mcp.json), "
                             "cursor (mcp.json), vscode (.vscode/mcp.json)")
            mcp.add_argument("--http", metavar="URL", help="the front door's URL instead of "
                             "the bridge ([mcp.http]: http://127.0.0.1:8765/mcp)")
            mcp.add_argument("--token", help="with --http: the bearer token (capd token "
                             "create), written into the entry: keep that file private; VS "
                             "Code asks for it when left out")
        mcp.set_defaults(handler=handler)

    imported = add_command(
        sub, "import", "Add the MCP servers a client's config file holds to capd.toml.", (
            "capd import ~/.config/Claude/claude_desktop_config.json   # shows the diff, asks",
            "capd import ~/.cursor/mcp.json --config /etc/capd/capd.toml --yes"))
    imported.add_argument("path", metavar="PATH", help="a JSON file with mcpServers (Claude "
                          "Desktop, Cursor, .mcp.json) or servers (VS Code)")
    imported.add_argument("--config", help="the capd.toml to add them to (default: "
                          "$CAPD_CONFIG, else ./capd.toml)")
    imported.add_argument("--yes", action="store_true", help="write without asking")
    imported.set_defaults(handler=cmd_import)

    completion = add_command(
        sub, "completion", "Print a shell completion script for every command and option.", (
            "source <(capd completion bash)   # in ~/.bashrc",
            "capd completion zsh > ~/.zfunc/_capd   # with fpath+=(~/.zfunc)",
            "capd completion fish > ~/.config/fish/completions/capd.fish"))
    completion.add_argument("shell", choices=SHELLS)
    completion.set_defaults(handler=cmd_completion)

    units = add_command(
        sub, "install-units", "Write the packaged systemd units (or the launchd agent) where "
        "the service manager reads them, or print them.", (
            "capd install-units --print   # read them first",
            "sudo capd install-units   # /etc/systemd/system, /etc/sysusers.d",
            "capd install-units --user   # ~/.config/systemd/user",
            "capd install-units --example   # and the example in /etc/capd",
            "capd install-units --dest pkg/units   # packaging"))
    units.add_argument("--print", action="store_true", help="print the files, write nothing")
    units.add_argument("--user", action="store_true",
                       help="the per-user units, for ~/.config/systemd/user")
    units.add_argument("--launchd", action="store_true", default=sys.platform == "darwin",
                       help="the macOS LaunchAgent (the default on macOS)")
    units.add_argument("--dest", metavar="DIR", help="write every file of the set into DIR "
                       "instead (units and the sysusers.d entry, capd.conf, side by side: a "
                       "package build moves each where it goes)")
    units.add_argument("--notify-reload", action="store_true",
                       help="install the Type=notify-reload service as capd.service "
                       "(systemd >= 253)")
    units.add_argument("--example", action="store_true",
                       help="also copy the bundled example to /etc/capd (--user: "
                       "~/.config/capd), unless a capd.toml is there")
    units.set_defaults(handler=cmd_install_units)

    top = add_command(sub, "top", "A live view of the daemon: capabilities, upstream servers, "
                      "calls, the queue, recent refusals; q quits.", (
                          "capd top   # q quits",
                          "capd top --interval 5 --socket /run/capd/capd.sock"))
    add_socket(top)
    top.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                     help="seconds between refreshes (default: 1)")
    top.set_defaults(handler=cmd_top)

    add_table_commands(sub)
    _ROOT[:] = [parser]
    return parser


def _run(argv: Sequence[str] | None) -> int:
    parser = make_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        sys.stdout.flush()  # --help into a closed pipe fails here, where main sees it
        raise
    try:
        code: int = args.handler(args)
    except (UsageError, CapdError) as exc:
        echo(f"capd: {exc}", err=True)
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return code


def _complete(args: Sequence[str]) -> int:
    """``capd __complete KIND [--socket PATH]``: names for the shell's completion, one a
    line; nothing (and exit 0) when the daemon is down. Not a command for people."""
    from ._completion import NAME_KINDS, complete_names

    if not args or args[0] not in NAME_KINDS:
        return EXIT_USAGE
    socket = args[2] if len(args) > 2 and args[1] == "--socket" else None
    for name in complete_names(args[0], socket_path(socket)):
        print(name)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``capd``; return the exit status (0 ok, 1 failed, 2 usage, 130 and 141 stopped)."""
    arguments = sys.argv[1:] if argv is None else list(argv)
    if arguments[:1] == ["__complete"]:  # the completion script's, kept out of the parser
        return _complete(arguments[1:])
    try:
        code = _run(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader left (`capd list | head -1`). Stop quietly, as a program killed by
        # SIGPIPE does, and point stdout at /dev/null so that the interpreter's own last
        # flush has nowhere to fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE
    return code


if __name__ == "__main__":
    sys.exit(main())
