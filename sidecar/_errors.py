"""The error tree of capd's process layer.

::

    CapdError
    └── SidecarError
        ├── InvalidParams        call parameters failed validation (HTTP 422)
        ├── InvalidTimeout       a Capd-Timeout that is malformed or over the limit (HTTP 422)
        ├── BadRequest           a malformed request: bad JSON, wrong shape (HTTP 400)
        ├── Draining             the daemon is shutting down (HTTP 503)
        ├── SearchUnavailable    the search index failed to build; the next search retries (503)
        ├── UnknownAgent         no [agents.NAME] by that name (HTTP 404)
        ├── UnknownProfile       no [profiles.NAME] by that name (HTTP 404)
        ├── ExportConflict       two capabilities would export under one tool name (HTTP 409)
        ├── UnresolvedAgent      an agent's entries (or an injection's) select nothing (HTTP 422)
        ├── UnknownToken         no bearer token by that id or name (HTTP 404)
        ├── UpstreamFailed       an MCP server refused or did not answer a resource or
        │                        prompt request (HTTP 502)
        ├── SocketInUse          another daemon answers on the socket
        ├── ListenFailed         [mcp.http] cannot listen where it says (in use, no such address)
        ├── UnsafeSocketFolder   the socket's folder is not the daemon's own
        ├── StateDirLocked       another daemon holds the state directory
        └── DaemonUnreachable    the CLI found no daemon on the socket
            └── DaemonDown       the MCP bridge lost the daemon (no answer, or not a
                                 daemon's answer); it reconnects on the next request
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from capd.registry import CapdError


class SidecarError(CapdError):
    """Root of the process layer's errors."""


class InvalidParams(SidecarError):
    """Parameters failed the capability's model; ``errors`` is pydantic's list."""

    def __init__(self, name: str, errors: list[dict[str, Any]]) -> None:
        self.name = name
        self.errors = errors
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ())) or "params"
        super().__init__(
            f"invalid parameters for {name!r}: {where}: {first.get('msg', 'invalid')}"
            + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")
        )


def validator_exit(exc: BaseException) -> dict[str, Any]:
    """The error entry of a parameter validator that raised ``SystemExit`` or
    ``KeyboardInterrupt`` (an argparse-wrapped validator given a bad value): the call's
    parameters are invalid; the daemon goes on."""
    return {"type": "validator_exited", "loc": [],
            "msg": f"the capability's parameter validator raised {type(exc).__name__}"
                   f"({exc}); check the values against its description"}


def problems_said(errors: Sequence[Mapping[str, Any]], names: Mapping[str, str] | None = None,
                  more: int = 0) -> str:
    """Pydantic's problems as a sentence: the first three, each at the value it names
    (``names``: how the caller spells a field), and how many more."""
    names = names or {}
    said = "; ".join(
        ".".join([names.get(str(e["loc"][0]), str(e["loc"][0])), *map(str, e["loc"][1:])])
        + f": {e['msg']}" if e["loc"] else f"body: {e['msg']}" for e in errors[:3])
    left = len(errors) - 3 + more
    return f"{said}; and {left} more" if left > 0 else said


class InvalidArguments(SidecarError):
    """A request's values do not fit its command's parameters (422 with the error list)."""

    def __init__(self, command: str, errors: list[dict[str, Any]], more: int = 0) -> None:
        self.errors = errors
        super().__init__(f"{problems_said(errors, more=more)} (what it takes: capd {command} "
                         "--help, or the API reference)")


class InvalidTimeout(SidecarError):
    """A per-call timeout that is not seconds in (0, the capability's ``timeout_s``]."""

    def __init__(self, name: str, requested: str, limit_s: float) -> None:
        self.name = name
        self.requested = requested
        self.limit_s = limit_s
        super().__init__(
            f"the call timeout {requested!r} for {name!r} must be seconds above 0 and at most "
            f"{limit_s:g} (the timeout_s {name} declares); send a shorter Capd-Timeout or none"
        )


class BadRequest(SidecarError):
    """The request itself is malformed."""


class Forbidden(SidecarError):
    """The caller's grant does not reach what it asked (403); the message says why."""


class Draining(SidecarError):
    """The daemon is draining for shutdown and accepts no new calls."""


class SearchUnavailable(SidecarError):
    """The search index could not be built; the next search tries again."""


class _UnknownDeclared(SidecarError, LookupError):
    """No ``kind`` by that name is declared in capd.toml; close names are suggested."""

    kind = ""      # "agent"
    plural = ""    # "agents"
    declare = ""   # how to declare one: "[agents.NAME]"

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.suggestions = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        if self.suggestions:
            hint = f" (did you mean {', '.join(repr(s) for s in self.suggestions)}?)"
        elif known:
            hint = f" ({self.plural}: {', '.join(sorted(known))})"
        else:
            hint = f" (no {self.kind} is declared; add {self.declare} to capd.toml)"
        super().__init__(f"unknown {self.kind} {name!r}{hint}")


class UnknownAgent(_UnknownDeclared):
    """No agent by that name is declared under ``[agents]`` in capd.toml."""

    kind, plural, declare = "agent", "agents", "[agents.NAME]"


class UnknownProfile(_UnknownDeclared):
    """No policy profile by that name is declared under ``[profiles]`` in capd.toml."""

    kind, plural, declare = "profile", "profiles", "[profiles.NAME]"


class ExportConflict(SidecarError):
    """Capabilities whose names map to one provider tool name; the export is refused."""

    def __init__(self, form: str, clashes: dict[str, list[str]]) -> None:
        self.clashes = clashes
        pairs = "; ".join(f"{', '.join(names)} -> {tool}" for tool, names in clashes.items())
        super().__init__(
            f"in the {form} format these capabilities would share a tool name: {pairs}. "
            "Rename one of each group (or add an alias and retire the old name), or export "
            "a --profile that leaves one out")


class UnresolvedAgent(SidecarError):
    """Entries of an agent, or of a run-time injection, select no capability (fail closed).

    ``problems`` holds one ``{"entry", "declared_in", "detail"}`` per entry that
    selects nothing; ``declared_in`` is ``agents.NAME`` or ``injections[i]``.
    """

    def __init__(self, agent: str, problems: list[dict[str, str]]) -> None:
        self.agent = agent
        self.problems = problems
        listed = "; ".join(f"{p['detail']} (in {p['declared_in']})" for p in problems)
        super().__init__(f"agent {agent!r} cannot be resolved: {listed}")


class UnknownToken(SidecarError, LookupError):
    """No bearer token by that id or name (HTTP 404)."""


class UpstreamFailed(SidecarError):
    """An upstream MCP server refused, or did not answer, a resource or prompt request."""


class SocketInUse(SidecarError):
    """A live daemon already answers on the socket path."""


class ListenFailed(SidecarError):
    """The MCP front door over HTTP cannot listen where ``[mcp.http]`` says."""


class UnsafeSocketFolder(SidecarError):
    """The socket's folder belongs to another user or others may write in it."""


class StateDirLocked(SidecarError):
    """Another daemon holds the state directory's lock (it would share the queue)."""

    def __init__(self, message: str, holder_pid: int | None) -> None:
        super().__init__(message)
        self.holder_pid = holder_pid


class DaemonUnreachable(SidecarError):
    """Nothing answers on the socket."""


class DaemonDown(DaemonUnreachable):
    """The MCP bridge lost the daemon: nothing answers, or the answer is not a daemon's."""
