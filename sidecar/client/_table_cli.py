"""The daemon's subcommands, one per operator-table row (``_table.COMMANDS``).

Each row's flags come from its typed parameter model (``_args``); its answer is
printed as ``-o`` (or ``--json``) asks, else through the row's renderer. What every
subcommand shares with the local ones (exit codes, ``-o``, ``--socket``) is here too.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from pydantic import ValidationError

from .._args import Param, Params, params_of, to_wire
from .._errors import problems_said
from .._paths import default_socket_path, find_socket
from .._table import COMMANDS, OperatorCommand
from ._client import request
from ._render import RENDERERS, WIDE, describe_failure
from ._terminal import Document, echo

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_QUEUED = 75  # EX_TEMPFAIL: a write was queued, not done (yet)

# Rows whose failing answer is itself the report (`capd health` while a check fails):
# printed on stdout like a success, with exit 1.
STATUS_REPORTS = frozenset({"health", "livez", "readyz", "topology-validate"})

PATH_PARAM_NAMES = {"name": "capabilities", "tool": "tools", "id": "jobs"}
"""The path parameters whose values complete from the daemon (``_completion.NAME_KINDS``)."""

OUTPUTS = ("table", "wide", "json", "yaml")
"""What ``-o`` takes (kubectl's words)."""


class UsageError(Exception):
    """The command line is wrong: exit 2."""


def socket_path(value: str | None) -> Path:
    """--socket, else $CAPD_SOCKET, else the first documented place a daemon of this
    user's listens (``find_socket``)."""
    chosen = value or os.environ.get("CAPD_SOCKET")
    return Path(chosen) if chosen else find_socket()


def add_socket(parser: argparse.ArgumentParser) -> None:
    """The ``--socket`` option of a command that talks to the daemon."""
    parser.add_argument("--socket", help="daemon socket (default: $CAPD_SOCKET or "
                        f"{default_socket_path()})")


def add_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, summary: str,
    examples: Sequence[str],
) -> argparse.ArgumentParser:
    """A subcommand whose --help shows ``summary`` and ends with ``examples`` as written."""
    return sub.add_parser(name, help=summary, description=summary,
                          epilog="Examples:\n" + "\n".join(f"  {line}" for line in examples),
                          formatter_class=argparse.RawDescriptionHelpFormatter)


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


# ------------------------------------------------------------------------ the request


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
        elif param.many and value is not None and not param.arg.rest:
            # each occurrence may list several
            value = [part for item in value for part in item.split(",") if part]
        if value is not None and value is not False:
            values[param.name] = value
    if row.takes_params:
        given = _parse_params(args)
        whole = next((p.name for p in params_of(row.params) if p.arg.key == "*"), None)
        values.update({whole: given} if whole else given)
    try:
        return row.params.model_validate(values)
    except ValidationError as exc:
        spelt = {p.name: "--params" if row.takes_params and p.arg.at == "body" else _spelling(p)
                 for p in params_of(row.params)}
        parser: argparse.ArgumentParser = args.parser
        parser.error(problems_said(exc.errors(include_url=False), spelt))


def _spelling(param: Param) -> str:
    """How the command line spells ``param``: its first flag, its metavar, or --params."""
    if param.arg.flags:
        return param.arg.flags[0]
    return "--params" if param.arg.at == "body" and param.arg.key == "*" else _metavar(param)


def _metavar(param: Param) -> str:
    return (param.key if param.arg.at == "path" else param.name).upper()


# ------------------------------------------------------------------------- the answer


def run_table_command(row: OperatorCommand, args: argparse.Namespace) -> int:
    """Send ``row``'s request built from ``args`` and print the answer."""
    wire = to_wire(row.path, row.params,
                   _arguments(row, args).model_dump(mode="json", exclude_unset=True))
    path = wire.path + ("?" + urlencode(wire.query) if wire.query else "")
    response = request(socket_path(args.socket), row.method, path, body=wire.body,
                       headers=wire.headers or None)
    body = response.body
    ok = 200 <= response.status < 300
    output, asked = output_format(args)
    failed = (response.content_type.startswith("application/problem+json")
              or not (ok or row.id in STATUS_REPORTS))
    text = isinstance(body, str)
    data = not text and output in ("json", "yaml")
    if text:  # a text body (metrics, TOML): a format, as it came
        echo(Document(body), end="" if body.endswith("\n") else "\n")
    elif data:
        print_data(body, output)
    elif not (failed or row.json_mode):
        echo(str(body.get("status") if isinstance(body, dict) else body))
    elif not failed:
        # An answer in a format asked for (a provider's tool schema, an MCP client's config)
        # is a document to paste: JSON, never fields.
        render = ("json" if row.render == "json" and getattr(args, "format", None)
                  else "fields" if row.render == "json" else row.render)
        wide = WIDE.get(row.render) if output == "wide" else None
        echo((wide or RENDERERS[render])(body))
        if row.id in ("call", "resource-read") and isinstance(body, dict):
            _save_blocks(body, row.id, getattr(args, "output_dir", None))
    if failed and not text and not (data and asked):  # JSON because piped: said to a person
        echo(f"capd: {describe_failure(' '.join(row.cli), body)}", err=True)
    if row.id == "call" and isinstance(body, dict) and body.get("queued"):
        return _queued(args, str(body["queued"]))
    return EXIT_OK if ok else EXIT_FAILED


def _queued(args: argparse.Namespace, job: str) -> int:
    """A call whose write was queued: 75 with the job id, or, with ``--wait``, the job's end."""
    wait = getattr(args, "wait_s", None)
    if wait is None:
        echo(f"capd: queued as job {job}; capd queue show {job} follows it (exit 75)", err=True)
        return EXIT_QUEUED
    try:
        deadline = time.monotonic() + float(wait)
    except ValueError:
        raise UsageError(f"--wait {wait!r}: give a number of seconds") from None
    daemon = socket_path(args.socket)
    while True:
        answer = request(daemon, "GET", f"/queue/{quote(job, safe='')}")
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


def _save_blocks(body: dict[str, Any], row_id: str, output_dir: str | None) -> None:
    """The binary blocks an upstream answered (a call's images, audio, resource blobs; a
    resource's blob contents): written into ``output_dir`` and named, or, without one,
    said to be there; never base64 on a terminal. Raises :class:`UsageError` when the
    folder cannot be written."""
    if row_id == "resource-read":
        body = {"content": [{"type": "resource", "resource": c} for c in
                            body.get("contents", []) if isinstance(c, dict)],
                "request_id": "resource"}
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


# ------------------------------------------------------------------------- the parser


def add_table_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """A subcommand (in its groups: ``queue list``) for every row of the table."""
    groups: dict[tuple[str, ...], argparse._SubParsersAction[argparse.ArgumentParser]] = {(): sub}
    for row in COMMANDS:
        for depth in range(1, len(row.cli)):
            prefix = row.cli[:depth]
            if prefix not in groups:
                members = [r for r in COMMANDS if r.cli[:depth] == prefix]
                group_parser = add_command(
                    groups[prefix[:-1]], prefix[-1],
                    f"{prefix[-1].capitalize()} commands: "
                    + ", ".join(r.cli[depth] for r in members) + ".",
                    [r.examples[0] for r in members if r.examples])
                groups[prefix] = group_parser.add_subparsers(dest=f"cmd_{depth}",
                                                             metavar="COMMAND")
                groups[prefix].required = True
        parser = add_command(groups[row.cli[:-1]], row.cli[-1], row.summary, row.examples)
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
        add_socket(parser)
        parser.set_defaults(handler=lambda a, row=row: run_table_command(row, a), row=row.id,
                            parser=parser)


def _add_param(parser: argparse.ArgumentParser, param: Param) -> None:
    """``param`` as an argument of its command's parser (its help says its default, and
    that a list takes several values)."""
    info, arg = param.info, param.arg
    shown = info.default not in (None, False, (), "") and not info.is_required()
    help = (f"{info.description or ''}{f' (default {info.default})' if shown else ''}"
            f"{' (repeat it, or separate with commas)' if param.many and arg.flags else ''}")
    if not arg.flags:
        nargs = "*" if arg.rest else None if info.is_required() else "?"
        action = parser.add_argument(param.name, metavar=_metavar(param), nargs=nargs,
                                     help=help)
    elif param.kind is bool and info.default is False:
        action = parser.add_argument(*arg.flags, dest=param.name, action="store_true",
                                     help=help)
    else:
        choices = ("true", "false") if param.kind is bool else param.choices
        action = parser.add_argument(*arg.flags, dest=param.name, help=help,
                                     action="append" if param.many else "store",
                                     metavar=param.name.upper() if param.many else None,
                                     choices=choices, required=info.is_required())
    # what completes from the daemon: capabilities, tools, jobs, profiles
    names = "profiles" if param.name == "profile" else PATH_PARAM_NAMES.get(param.key) \
        if arg.at == "path" else None
    action.capd_names = names  # type: ignore[attr-defined]
