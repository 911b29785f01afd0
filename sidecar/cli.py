"""The ``capd`` command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from registry import CapdError, build

from ._config import DEFAULT_CONFIG_ENV, load_config
from ._views import check_report, render_check_table

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def _config_path(value: str | None) -> Path | None:
    chosen = value or os.environ.get(DEFAULT_CONFIG_ENV)
    if chosen:
        return Path(chosen)
    default = Path("capd.toml")
    return default if default.exists() else None


def cmd_check(args: argparse.Namespace) -> int:
    """Build the registry once and print live and disabled capabilities."""
    loaded = load_config(_config_path(args.config))
    registry = asyncio.run(build(loaded.build_config()))
    report = check_report(registry.snapshot())
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_check_table(report))
    if args.strict and report["errors"]:
        return EXIT_FAILED
    return EXIT_OK


def make_parser() -> argparse.ArgumentParser:
    """The argument parser of every ``capd`` subcommand."""
    parser = argparse.ArgumentParser(prog="capd", description="capd: a capability sidecar.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    check = sub.add_parser("check", help="build the registry once and print what is live")
    check.add_argument("--config", help="capd.toml (default: $CAPD_CONFIG or ./capd.toml)")
    check.add_argument("--json", action="store_true", help="print JSON")
    check.add_argument(
        "--strict", action="store_true", help="exit 1 when any declaration has an error"
    )
    check.set_defaults(handler=cmd_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``capd``; return the exit status (0 ok, 1 failed, 2 usage)."""
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except CapdError as exc:
        print(f"capd: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
