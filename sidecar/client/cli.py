"""The ``capd`` command line.

Daemon commands are generated from the operator table (``_table.COMMANDS``):
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
import base64
import json
import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import quote, urlencode

from pydantic import ValidationError

from capd.registry import CapdError, ConfigError

from .._args import Param, Params, params_of, to_wire
from .._errors import DaemonDown
from .._paths import DEFAULT_CONFIG_ENV, capd_version, default_socket_path, find_socket
from .._table import COMMANDS, OperatorCommand
from ._client import request
from ._completion import SHELLS
from ._render import RENDERERS, WIDE, describe_failure
from ._terminal import Document, echo

if TYPE_CHECKING:  # the bridge's module loads the MCP SDK: only `capd mcp` needs it
    from ._mcp import Profile

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_QUEUED = 75  # EX_TEMPFAIL: a write was queued, not done (yet)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a program stopped by Ctrl-C
EXIT_PIPE = 141         # 128 + SIGPIPE, as a shell reports `yes | head -1`

# Rows whose failing answer is itself the report (`capd health` while a check fails):
# printed on stdout like a success, with exit 1.
STATUS_REPORTS = frozenset({"health", "livez", "readyz", "topology-validate"})

PATH_PARAM_NAMES = {"name": "capabilities", "tool": "tools", "id": "jobs"}
"""The path parameters whose values complete from the daemon (``_completion.NAME_KINDS``)."""

LOCAL_COMMANDS = ("serve", "check", "mcp", "mcp-config", "completion", "install-units", "top")

LOCAL_EXAMPLES: dict[str, tuple[str, ...]] = {
    "serve": ("capd serve --config examples/capd.toml   # in a checkout (the wheel's: see "
              "capd serve with no config)",
              "capd serve --config /etc/capd/capd.toml --log-format json --log-level debug"),
    "check": ("capd check --config examples/capd.toml   # in a checkout",
              "capd check --strict --json   # exit 1 on any declaration error, for CI"),
    "mcp": ("capd mcp   # what an MCP client launches; see capd mcp-config",
            "capd mcp --profile writer.toml --expose direct --tag notes",
            "capd mcp --allow notes.search,notes.append   # exactly these capabilities"),
    "mcp-config": ("capd mcp-config", "capd mcp-config --profile writer.toml",
                   "capd mcp-config --allow notes.search   # or: capd agent resolve NAME"),
    "completion": ("source <(capd completion bash)   # in ~/.bashrc",
                   "capd completion zsh > ~/.zfunc/_capd   # with fpath+=(~/.zfunc)",
                   "capd completion fish > ~/.config/fish/completions/capd.fish"),
    "install-units": ("capd install-units --print   # read them first",
                      "sudo capd install-units   # /etc/systemd/system, /etc/sysusers.d",
                      "capd install-units --user   # ~/.config/systemd/user",
                      "capd install-units --example   # and the example in /etc/capd",
                      "capd install-units --dest pkg/units   # packaging"),
    "top": ("capd top   # q quits", "capd top --interval 5 --socket /run/capd/capd.sock"),
}
"""Examples for the local commands' --help; the table's rows carry their own."""


OUTPUTS = ("table", "wide", "json", "yaml")
"""What ``-o`` takes (kubectl's words)."""


class UsageError(Exception):
    """The command line is wrong: exit 2."""


def _config_path(value: str | None) -> Path | None:
    chosen = value or os.environ.get(DEFAULT_CONFIG_ENV)
    if chosen:
        return Path(chosen)
    default = Path("capd.toml")
    return default if default.exists() else None


def _socket_path(value: str | None) -> Path:
    """--socket, else $CAPD_SOCKET, else the first documented place a daemon of this
    user's listens (``find_socket``)."""
    chosen = value or os.environ.get("CAPD_SOCKET")
    return Path(chosen) if chosen else find_socket()


def _epilog(examples: Sequence[str]) -> str:
    return "Examples:\n" + "\n".join(f"  {line}" for line in examples)


def _add_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, summary: str,
    examples: Sequence[str],
) -> argparse.ArgumentParser:
    """A subcommand whose --help shows ``summary`` and ends with ``examples`` as written."""
    return sub.add_parser(name, help=summary, description=summary, epilog=_epilog(examples),
                          formatter_class=argparse.RawDescriptionHelpFormatter)


# ----------------------------------------------------------------- local commands


def cmd_top(args: argparse.Namespace) -> int:
    """``capd top``: the live view, until q (or Ctrl-C)."""
    from ._top import run_top  # curses: only for this command

    if args.interval <= 0:
        raise UsageError(f"--interval {args.interval:g}: give a number of seconds above 0")
    return run_top(_socket_path(args.socket), args.interval)


def bundled_example() -> str:
    """The bundled example's capd.toml as a path to type here: relative inside a
    checkout (``examples/capd.toml``), else where the package installed it."""
    from importlib.resources import files

    path = Path(str(files("capd") / "examples" / "capd.toml"))
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _no_config() -> str:
    return ("no config found: pass --config PATH, set CAPD_CONFIG, or run in a folder holding "
            f"capd.toml (the bundled example: --config {bundled_example()})")


def cmd_check(args: argparse.Namespace) -> int:
    """Build the registry once and print live and disabled capabilities."""
    from .._logging import configure_logging
    from ..server import load_config, run_daemon

    # stdout is the report (JSON when piped): the build's log lines go to stderr, warnings up
    configure_logging("warning", "console", stream=sys.stderr)

    config_path = _config_path(args.config)
    if config_path is None:  # nothing to check is not a pass
        raise ConfigError(_no_config())
    loaded = load_config(config_path)
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
    from ..server import Daemon, load_config, run_daemon

    writer = configure_logging(args.log_level, args.log_format)
    log = structlog.get_logger("capd.cli")
    # A reload re-imports plugins; cached bytecode could hide an edit made within
    # the same second that kept the file's size, so the daemon writes none.
    sys.dont_write_bytecode = True
    config_path = _config_path(args.config)
    if config_path is None:  # a daemon with no capabilities is a mistake, not a default
        raise ConfigError(_no_config())
    loaded = load_config(config_path)
    for variable in loaded.unknown_env:
        log.warning("unknown_environment_variable", variable=variable.name,
                    did_you_mean=variable.suggestion)
    for path in loaded.seed():
        log.info("seeded", path=str(path))
    socket_path = Path(args.socket) if args.socket else None
    daemon = Daemon(loaded, socket_path=socket_path)
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
    from ._mcp import Bridge, DaemonLink, grant_header
    from ._mcp_stdio import refuse, serve

    try:
        profile = _bridge_profile(args)
    except (UsageError, ConfigError) as exc:
        # An MCP client shows only "connection closed" for a bridge that exits: say why on
        # stderr and as the answer to its initialize, then end.
        echo(f"capd mcp: {exc}", err=True)
        asyncio.run(refuse(f"capd mcp cannot start: {exc}"))
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILED
    if args.expose == "meta" and args.tag:
        raise UsageError("--tag chooses what --expose direct exposes; add --expose direct")
    channel = getattr(args, "channel", None)
    if channel is not None and not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,63}", channel):
        raise UsageError(f"--channel {channel!r}: a channel is 1-64 lower-case letters, "
                         "digits, '.', '_' or '-'")
    link = DaemonLink(_socket_path(args.socket), grant=grant_header(profile, channel))
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


def _bridge_profile(args: argparse.Namespace) -> Profile | None:
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


def cmd_mcp_config(args: argparse.Namespace) -> int:
    """Print the JSON an MCP client's configuration needs to launch the bridge."""
    command = str(Path(sys.argv[0]).resolve()) if Path(sys.argv[0]).name == "capd" else "capd"
    arguments = ["mcp", "--socket", str(_socket_path(args.socket))]
    name = "capd"
    profile = _bridge_profile(args)
    if args.profile and profile is not None:
        arguments += ["--profile", str(Path(args.profile).resolve())]
        name = f"capd-{profile.name}"
    elif profile is not None:
        arguments += ["--allow", ",".join(sorted(profile.capabilities))]
    if args.expose == "direct":
        arguments += ["--expose", "direct", *(x for t in args.tag or () for x in ("--tag", t))]
    if getattr(args, "channel", None):
        arguments += ["--channel", args.channel]
    if getattr(args, "tools", None):
        arguments += ["--tools", args.tools]
    print(json.dumps({"mcpServers": {name: {"command": command, "args": arguments}}},
                     indent=2))
    return EXIT_OK


def cmd_completion(args: argparse.Namespace) -> int:
    """Print the completion script for ``args.shell``, generated from the parser."""
    from ._completion import completion_script

    echo(Document(completion_script(make_parser(), args.shell)), end="")
    return EXIT_OK


def cmd_install_units(args: argparse.Namespace) -> int:
    """Print the packaged service files, or write them where the service manager reads them."""
    from ._units import (
        copy_example,
        example_config_target,
        render_units,
        running_capd,
        service_cannot_run,
        systemd_version,
        unit_set,
        write_units,
    )

    dest = Path(args.dest) if args.dest else None
    program = running_capd()
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
    why = service_cannot_run(program) if system else None
    if why is not None:
        sentence = (f"the service cannot run {program}: {why}. Install capd where the service "
                    "can run it, with a Python outside /root and /home (python3 -m venv "
                    "/opt/capd && /opt/capd/bin/pip install /path/to/capd), then run "
                    "/opt/capd/bin/capd install-units")
        if not args.print and not dest:
            echo(f"capd: {sentence}", err=True)
            return EXIT_FAILED
        echo(f"capd: warning: {sentence}", err=True)  # printed or packaged: said, not refused
    if args.notify_reload:
        old = systemd_version()
        if old is not None and old < 253:
            echo(f"capd: warning: this systemd ({old}) predates Type=notify-reload (253): the "
                 "unit would run as Type=simple with no reload; install without "
                 "--notify-reload", err=True)
    units = unit_set(user=args.user, launchd=args.launchd, dest=dest, program=program,
                     notify_reload=args.notify_reload)
    if args.print:
        echo(Document(render_units(units)), end="")
        if args.example:
            echo(f"capd: --example would copy the bundled example to "
                 f"{example_config_target(user=not system)} (unless a capd.toml is there)",
                 err=True)
        return EXIT_OK
    try:
        written = write_units(units)
    except OSError as exc:
        hint = "" if args.user or args.launchd or dest else " (run as root, or pass --user)"
        echo(f"capd: cannot write {exc.filename}: {exc.strerror or exc}{hint}", err=True)
        return EXIT_FAILED
    for path in written:
        echo(f"wrote {path}", err=True)
    if args.example:
        target = example_config_target(user=not system)
        try:
            copied = copy_example(target)
        except OSError as exc:
            echo(f"capd: cannot copy the example to {target}: {exc}", err=True)
            return EXIT_FAILED
        echo(f"copied the bundled example to {target} (edit {target / 'capd.toml'})"
             if copied else f"kept {target / 'capd.toml'}: it exists; the example was not "
             "copied", err=True)
    if dest is None:
        echo(f"next: {units.next_step}", err=True)
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
    from_json = set(params)
    for item in args.param or ():
        if ":=" in item:
            key, _, raw = item.partition(":=")
            try:
                value: Any = json.loads(raw)
            except ValueError as exc:
                raise UsageError(f"-p {item}: the value after := is not JSON: {exc}") from None
        elif "=" in item:
            key, _, value = item.partition("=")
        else:
            raise UsageError(f"-p {item}: use key=value (a string) or key:=json")
        if key in from_json:
            raise UsageError(f"-p {item}: {key!r} is set by --params too; give each "
                             "parameter once")
        params[key] = value
    return params


def _arguments(row: OperatorCommand, args: argparse.Namespace) -> Params:
    """``row``'s parameters from the command line, checked as the daemon checks them (a
    value that does not fit is a usage error, exit 2)."""
    values: dict[str, Any] = {}
    for param in params_of(row.params):
        value = getattr(args, param.name, None)
        if param.arg.rest and param.kind is str:
            value = " ".join(value or ()) or None
        elif param.many and value is not None:  # each occurrence may list several
            value = [part for item in value for part in item.split(",") if part] \
                if not param.arg.rest else value
        if value is not None and value is not False:
            values[param.name] = value
    if row.takes_params:
        given = _parse_params(args)
        whole = next((p.name for p in params_of(row.params) if p.arg.key == "*"), None)
        values.update({whole: given} if whole else given)
    try:
        return row.params.model_validate(values)
    except ValidationError as exc:
        spelt = {p.name: _spelling(p) for p in params_of(row.params)}
        said = "; ".join(f"{spelt.get(str(e['loc'][0]), e['loc'][0]) if e['loc'] else ''}"
                         f"{''.join(f'[{p}]' for p in e['loc'][1:])}: {e['msg']}"
                         for e in exc.errors(include_url=False))
        parser: argparse.ArgumentParser = args.parser
        parser.error(said)


def _spelling(param: Param) -> str:
    """How the command line spells ``param``: its first flag, its metavar, or --params."""
    if param.arg.flags:
        return param.arg.flags[0]
    return "--params" if param.arg.at == "body" and param.arg.key == "*" else _metavar(param)


def _metavar(param: Param) -> str:
    return (param.key if param.arg.at == "path" else param.name).upper()


def run_table_command(row: OperatorCommand, args: argparse.Namespace) -> int:
    """Send ``row``'s request built from ``args`` and print the answer."""
    wire = to_wire(row.path, row.params,
                   _arguments(row, args).model_dump(mode="json", exclude_unset=True))
    path = wire.path + ("?" + urlencode(wire.query) if wire.query else "")
    response = request(_socket_path(args.socket), row.method, path, body=wire.body,
                       headers=wire.headers or None)
    ok = 200 <= response.status < 300
    problem = response.content_type.startswith("application/problem+json")
    output, asked = output_format(args)
    failed = problem or not (ok or row.id in STATUS_REPORTS)
    if isinstance(response.body, str):  # a text body (metrics, TOML): a format, as it came
        echo(Document(response.body), end="" if response.body.endswith("\n") else "\n")
    elif output in ("json", "yaml"):
        print_data(response.body, output)
        if failed and not asked:  # JSON because piped: the reason still reaches a person
            echo(f"capd: {describe_failure(' '.join(row.cli), response.body)}", err=True)
    elif failed:
        echo(f"capd: {describe_failure(' '.join(row.cli), response.body)}", err=True)
    elif not row.json_mode:
        echo(str(response.body.get("status") if isinstance(response.body, dict)
                 else response.body))
    else:
        # An answer in a format asked for (a provider's tool schema, an MCP client's config)
        # is a document to paste: JSON, never fields.
        render = ("json" if row.render == "json" and getattr(args, "format", None)
                  else "fields" if row.render == "json" else row.render)
        wide = WIDE.get(row.render) if output == "wide" else None
        echo((wide or RENDERERS[render])(response.body))
        if row.id == "call" and isinstance(response.body, dict):
            _save_blocks(response.body, getattr(args, "output_dir", None))
        elif row.id == "resource-read" and isinstance(response.body, dict):
            blobs = [{"type": "resource", "resource": c}
                     for c in response.body.get("contents", []) if isinstance(c, dict)]
            _save_blocks({"content": blobs, "request_id": "resource"},
                         getattr(args, "output_dir", None))
    if row.id == "call" and isinstance(response.body, dict) and response.body.get("queued"):
        return _queued(args, str(response.body["queued"]))
    return EXIT_OK if ok else EXIT_FAILED


def output_format(args: argparse.Namespace) -> tuple[str, bool]:
    """How to print an answer, and whether it was asked for: ``-o``, else ``--json``, else
    ``$CAPD_OUTPUT``, else a table on a terminal and JSON when stdout is piped or
    redirected."""
    if getattr(args, "output", None):
        return str(args.output), True
    if getattr(args, "json", False):
        return "json", True
    chosen = os.environ.get("CAPD_OUTPUT")
    if chosen:
        if chosen not in OUTPUTS:
            raise UsageError(f"CAPD_OUTPUT={chosen!r}: give one of {', '.join(OUTPUTS)}")
        return chosen, True
    return ("table" if sys.stdout.isatty() else "json"), False


def print_data(body: Any, output: str) -> None:
    """``body`` as JSON (indented) or YAML on stdout."""
    if output == "yaml":
        import yaml  # only for -o yaml

        print(yaml.safe_dump(body, sort_keys=False, allow_unicode=True), end="")
    else:
        print(json.dumps(body, indent=2))


def _queued(args: argparse.Namespace, job: str) -> int:
    """A call whose write was queued: 75 with the job id, or, with ``--wait``, the job's end."""
    import time

    wait = getattr(args, "wait_s", None)
    if wait is None:
        echo(f"capd: queued as job {job}; capd queue show {job} follows it (exit 75)", err=True)
        return EXIT_QUEUED
    try:
        deadline = time.monotonic() + float(wait)
    except ValueError:
        raise UsageError(f"--wait {wait!r}: give a number of seconds") from None
    socket_path = _socket_path(args.socket)
    while True:
        answer = request(socket_path, "GET", f"/queue/{quote(job, safe='')}")
        if answer.status != 200 or not isinstance(answer.body, dict):
            echo(f"capd: queued as job {job}; it cannot be followed from here "
                 f"({describe_failure('queue show', answer.body)})", err=True)
            return EXIT_QUEUED
        state = answer.body.get("state")
        if state == "done":
            echo(f"capd: job {job} is done", err=True)
            return EXIT_OK
        if state in ("dead", "needs_operator", "cancelled", "partial"):
            echo(f"capd: job {job} ended {state}: {answer.body.get('last_error') or ''}",
                 err=True)
            return EXIT_FAILED
        if time.monotonic() >= deadline:
            echo(f"capd: job {job} is still {state} after {wait} s", err=True)
            return EXIT_QUEUED
        time.sleep(0.25)


_SUFFIXES = {"image/png": ".png", "image/jpeg": ".jpg", "image/gif": ".gif",
             "image/webp": ".webp", "image/svg+xml": ".svg", "audio/wav": ".wav",
             "audio/x-wav": ".wav", "audio/mpeg": ".mp3", "audio/ogg": ".ogg",
             "application/pdf": ".pdf", "application/json": ".json", "text/plain": ".txt"}


def _save_blocks(body: dict[str, Any], output_dir: str | None) -> None:
    """The binary blocks an upstream answered (images, audio, resource blobs): written
    into ``output_dir`` and named, or, without one, said to be there; never base64 on a
    terminal. Raises :class:`UsageError` when the folder cannot be written."""
    blocks = body.get("content")
    if not isinstance(blocks, list):
        return
    for index, block in enumerate(blocks, 1):
        if not isinstance(block, dict):
            continue
        nested = block.get("resource")
        resource: dict[str, Any] = nested if isinstance(nested, dict) else {}
        data, mime = block.get("data"), block.get("mimeType")
        if not isinstance(data, str):
            data, mime = resource.get("blob"), resource.get("mimeType")
        if not isinstance(data, str):
            continue
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError:
            echo(f"capd: block {index} ({block.get('type')}) is not valid base64; not saved",
                 err=True)
            continue
        kind = f"{block.get('type')} {mime or 'application/octet-stream'}, {len(raw)} bytes"
        if output_dir is None:
            echo(f"[block {index}: {kind}; capd call --output-dir DIR saves it]")
            continue
        folder = Path(output_dir)
        name = f"{body.get('request_id', 'call')}-{index}{_SUFFIXES.get(str(mime), '.bin')}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(raw)
        except OSError as exc:
            raise UsageError(f"--output-dir {output_dir}: {exc.strerror or exc}") from None
        echo(f"[block {index}: {kind}: wrote {folder / name}]")


def _add_table_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    groups: dict[tuple[str, ...], argparse._SubParsersAction[argparse.ArgumentParser]] = {(): sub}
    for row in COMMANDS:
        parent = groups[()]
        for depth in range(1, len(row.cli)):
            prefix = row.cli[:depth]
            if prefix not in groups:
                members = [r for r in COMMANDS if r.cli[:depth] == prefix]
                group_parser = _add_command(
                    groups[prefix[:-1]], prefix[-1],
                    f"{prefix[-1].capitalize()} commands: "
                    + ", ".join(r.cli[depth] for r in members) + ".",
                    [r.examples[0] for r in members if r.examples])
                groups[prefix] = group_parser.add_subparsers(
                    dest=f"cmd_{depth}", metavar="COMMAND"
                )
                groups[prefix].required = True
            parent = groups[prefix]
        parser = _add_command(parent, row.cli[-1], row.summary, row.examples)
        for param in params_of(row.params):
            if not (row.takes_params and param.arg.at == "body"):  # those: --params, -p
                _add_param(parser, param)
        if row.takes_params:
            parser.add_argument("--params", metavar="JSON", help="parameters as one JSON object")
            parser.add_argument("-p", dest="param", action="append", metavar="KEY=VALUE",
                                help="one parameter: key=value (string) or key:=json; repeatable")
        parser.add_argument("--json", action="store_true", help="print the HTTP body as JSON "
                            "(as -o json)")
        parser.add_argument("-o", "--output", choices=OUTPUTS,
                            help="how to print the answer: table (for reading; the default on "
                            "a terminal), wide (a table with more columns), json (the default "
                            "when piped) or yaml")
        parser.add_argument("--socket", help="daemon socket (default: $CAPD_SOCKET or "
                            f"{default_socket_path()})")
        parser.set_defaults(handler=lambda a, row=row: run_table_command(row, a), row=row.id,
                            parser=parser)


def _add_param(parser: argparse.ArgumentParser, param: Param) -> None:
    """``param`` as an argument of its command's parser."""
    info, arg = param.info, param.arg
    if not arg.flags:
        nargs = "*" if arg.rest else None if info.is_required() else "?"
        action = parser.add_argument(param.name, metavar=_metavar(param), nargs=nargs,
                                     help=info.description)
    elif param.kind is bool and info.default is False:
        action = parser.add_argument(*arg.flags, dest=param.name, action="store_true",
                                     help=info.description)
    else:
        choices = ("true", "false") if param.kind is bool else param.choices
        action = parser.add_argument(*arg.flags, dest=param.name, help=info.description,
                                     action="append" if param.many else "store",
                                     metavar=param.name.upper() if param.many else None,
                                     choices=choices, required=info.is_required())
    # what completes from the daemon: capabilities, tools, jobs, profiles
    names = "profiles" if param.name == "profile" else PATH_PARAM_NAMES.get(param.key) \
        if arg.at == "path" else None
    action.capd_names = names  # type: ignore[attr-defined]


class _Parser(argparse.ArgumentParser):
    """argparse, with a "did you mean" for a misspelt command or flag (exit 2)."""

    def error(self, message: str) -> NoReturn:
        hint = _did_you_mean(self, message)
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}{hint}\n")


def _every_flag(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of ``parser`` and of its subcommands."""
    flags = {f for f in parser._option_string_actions if f.startswith("--")}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                flags |= _every_flag(child)
    return flags


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
        close = difflib.get_close_matches(unknown.group(1), sorted(_every_flag(_root(parser))),
                                          n=3, cutoff=0.6)
        return f" (did you mean {' or '.join(close)}?)" if close else ""
    return ""


_ROOT: list[argparse.ArgumentParser] = []


def _root(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    return _ROOT[0] if _ROOT else parser


def make_parser() -> argparse.ArgumentParser:
    """The argument parser of every ``capd`` subcommand."""
    parser: argparse.ArgumentParser = _Parser(
        prog="capd", description="capd: a capability sidecar.",
        epilog="`capd COMMAND --help` shows a command's options and examples.")
    parser.add_argument("--version", action="version", version=f"capd {capd_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    serve = _add_command(sub, "serve", "Run the daemon in the foreground until SIGTERM/SIGINT.",
                         LOCAL_EXAMPLES["serve"])
    serve.add_argument("--config", help="capd.toml (default: $CAPD_CONFIG or ./capd.toml)")
    serve.add_argument("--socket", help=f"socket path (default: {default_socket_path()})")
    serve.add_argument("--log-level", default="info",
                       choices=("debug", "info", "warning", "error"))
    serve.add_argument("--log-format", default="auto", choices=("auto", "json", "console"),
                       help="auto: console on a terminal, JSON lines otherwise")
    serve.set_defaults(handler=cmd_serve)

    check = _add_command(sub, "check", "Build the registry once and print what is live.",
                         LOCAL_EXAMPLES["check"])
    check.add_argument("--config", help="capd.toml (default: $CAPD_CONFIG or ./capd.toml)")
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

    for name, handler, summary in (
        ("mcp", cmd_mcp, "Serve MCP on stdio, forwarding to the daemon."),
        ("mcp-config", cmd_mcp_config, "Print the MCP client config entry for the bridge."),
    ):
        mcp = _add_command(sub, name, summary, LOCAL_EXAMPLES[name])
        mcp.add_argument("--socket", help="daemon socket (default: $CAPD_SOCKET or "
                         f"{default_socket_path()})")
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
        mcp.set_defaults(handler=handler)

    completion = _add_command(
        sub, "completion", "Print a shell completion script for every command and option.",
        LOCAL_EXAMPLES["completion"])
    completion.add_argument("shell", choices=SHELLS)
    completion.set_defaults(handler=cmd_completion)

    units = _add_command(
        sub, "install-units", "Write the packaged systemd units (or the launchd agent) where "
        "the service manager reads them, or print them.", LOCAL_EXAMPLES["install-units"])
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

    top = _add_command(sub, "top", "A live view of the daemon: capabilities, upstream servers, "
                       "calls, the queue, recent refusals; q quits.", LOCAL_EXAMPLES["top"])
    top.add_argument("--socket", help="daemon socket (default: $CAPD_SOCKET or "
                     f"{default_socket_path()})")
    top.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                     help="seconds between refreshes (default: 1)")
    top.set_defaults(handler=cmd_top)

    _add_table_commands(sub)
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
    except UsageError as exc:
        echo(f"capd: {exc}", err=True)
        return EXIT_USAGE
    except CapdError as exc:
        echo(f"capd: {exc}", err=True)
        return EXIT_FAILED
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
    for name in complete_names(args[0], _socket_path(socket)):
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
