"""``capd completion SHELL``: a completion script generated from the argument parser.

shtab writes the script from the parser itself, so every subcommand and option
(the operator table's rows included) completes without a list kept by hand.
Options whose value is a path complete file or folder names. Capability names,
tool ids, job ids and profile names complete from the daemon: the script runs
``capd __complete KIND``, which answers from a cache of a few seconds
(``$XDG_CACHE_HOME/capd``), asks the daemon with a short timeout otherwise, and
prints nothing (or what it last knew) when the daemon is down: a completion never
waits and never prints an error into the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

SHELLS = ("bash", "zsh", "fish")

# Options by dest whose value is a path, completed as such by the shell.
_FILE_OPTIONS = frozenset({"config", "profile", "socket"})
_FOLDER_OPTIONS = frozenset({"dest"})


def actions_of(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """Every argument of ``parser`` and of its subcommands, depth first."""
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from actions_of(sub)


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """Return the completion script of ``parser`` for ``shell`` (one of :data:`SHELLS`)."""
    import shtab  # only this command needs it

    for action in actions_of(parser):
        kind = getattr(action, "capd_names", None)
        if kind in NAME_KINDS:
            action.complete = shtab.cmd(  # type: ignore[attr-defined]  # shtab reads it
                f"capd __complete {kind} 2>/dev/null")
        elif action.dest in _FILE_OPTIONS:
            action.complete = shtab.FILE  # type: ignore[attr-defined]  # shtab reads it
        elif action.dest in _FOLDER_OPTIONS:
            action.complete = shtab.DIRECTORY  # type: ignore[attr-defined]  # shtab reads it
    script: str = shtab.complete(parser, shell)
    return script


# ----------------------------------------------------------------- names from the daemon

CACHE_TTL_S = 10.0
"""How long names read from the daemon are reused before it is asked again."""

ASK_TIMEOUT_S = 0.5
"""The longest a completion waits for the daemon."""


class RowFailed(Exception):
    """A row answered something other than 2xx."""


def getter(socket_path: Path, timeout_s: float) -> Callable[[str], Any]:
    """GET a row's body from the daemon at ``socket_path``; the getter raises
    :class:`DaemonUnreachable` when nothing answers, :class:`RowFailed` when the answer
    is not 2xx (``capd top`` and the names a completion reads)."""
    from ._client import request
    from ._render import describe_failure

    def get(path: str) -> Any:
        reply = request(socket_path, "GET", path, timeout_s=timeout_s)
        if not 200 <= reply.status < 300:
            raise RowFailed(f"GET {path} answered {reply.status}: "
                            f"{describe_failure(path, reply.body)}")
        return reply.body

    return get


def _capabilities(get: Callable[[str], Any]) -> list[str]:
    body = get("/capabilities?" + urlencode({"limit": 1000}))
    return [c["name"] for c in body.get("capabilities", [])]


def _tools(get: Callable[[str], Any]) -> list[str]:
    return sorted((get("/status").get("registry") or {}).get("tools") or {})


def _jobs(get: Callable[[str], Any]) -> list[str]:
    return [j["id"] for j in get("/queue?" + urlencode({"limit": 200})).get("jobs", [])]


def _profiles(get: Callable[[str], Any]) -> list[str]:
    return list((get("/status").get("policy") or {}).get("profiles") or [])


NAME_KINDS: dict[str, Callable[[Callable[[str], Any]], list[str]]] = {
    "capabilities": _capabilities, "tools": _tools, "jobs": _jobs, "profiles": _profiles}
"""What ``capd __complete KIND`` lists, and how it reads each from the daemon."""


def cache_folder() -> Path:
    """``$XDG_CACHE_HOME/capd`` (``~/.cache/capd``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "capd"


def complete_names(kind: str, socket_path: Path, *, folder: Path | None = None,
                   ttl_s: float = CACHE_TTL_S) -> list[str]:
    """The names of ``kind`` the daemon at ``socket_path`` knows: from the cache while it
    is fresh, else from the daemon (then cached); what was last cached, or nothing, when
    the daemon is down or answers something else. Never raises for the daemon."""
    read = NAME_KINDS[kind]
    folder = folder or cache_folder()
    key = hashlib.sha256(str(socket_path).encode()).hexdigest()[:16]
    cache = folder / f"{kind}-{key}.json"
    try:
        fresh = time.time() - cache.stat().st_mtime < ttl_s
    except OSError:
        fresh = False
    if fresh:
        cached = _read_cache(cache)
        if cached is not None:
            return cached

    try:
        names = [str(n) for n in read(getter(socket_path, ASK_TIMEOUT_S))]
    except Exception:  # down, refused, slow, another shape: what was known, or nothing
        return _read_cache(cache) or []
    _write_cache(cache, names)
    return names


def _read_cache(cache: Path) -> list[str] | None:
    try:
        names = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return [str(n) for n in names] if isinstance(names, list) else None


def _write_cache(cache: Path, names: list[str]) -> None:
    from ._units import write_atomically

    # a cache that cannot be written only means asking the daemon next time
    with contextlib.suppress(OSError):
        write_atomically(cache, json.dumps(names), folder_mode=0o700)
