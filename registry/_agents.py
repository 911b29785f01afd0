"""Agents and run-time injections as declared data, and how an entry selects capabilities.

An agent (``[agents.NAME]`` in capd.toml) lists, completely and explicitly, the
capabilities it may use; run-time injections (``[[injections]]``) are declared
apart and add capabilities when the execution context matches. Each listed
*entry* is one of:

- a capability name or one of its aliases, with or without ``@``:
  ``notes.search``, ``security-auditor``, ``@security-auditor``;
- a glob over capability names: ``git_mcp.*`` (``*``, ``?`` and ``[...]``, as
  :func:`fnmatch.fnmatchcase`; aliases are not matched);
- a tag: ``tag:notes``, every capability carrying it.

:func:`select_capabilities` expands one entry against a registry and says what it
found; an entry that finds nothing is a problem to report, never something to skip.
What an agent resolves to for its runtime (MCP server configs) is the sidecar's
business.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from ._errors import UnknownCapability
from ._model import exactly_one
from ._names import is_valid_reference, without_mark
from ._registry import Registry

EntryKind = Literal["name", "glob", "tag"]

TAG_PREFIX = "tag:"
_GLOB_CHARS = frozenset("*?[")
_CONTEXT_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_FALSE = frozenset({"", "0", "false", "no"})

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def entry_kind(entry: str) -> EntryKind:
    """Whether ``entry`` is a capability name, a glob or a ``tag:``."""
    if entry.startswith(TAG_PREFIX):
        return "tag"
    if _GLOB_CHARS & set(entry):
        return "glob"
    return "name"


def check_entry(entry: str) -> str:
    """Return ``entry``; raise ValueError saying what is wrong with it."""
    kind = entry_kind(entry)
    if kind == "tag" and not entry[len(TAG_PREFIX):].strip():
        raise ValueError(f"{entry!r}: name the tag after 'tag:', e.g. tag:notes")
    if kind == "name" and not is_valid_reference(entry):
        raise ValueError(f"{entry!r} is not a capability name or alias (lower case, e.g. "
                         "notes.search, security-auditor or @security-auditor), a glob "
                         "(notes.*) or a tag (tag:notes)")
    return entry


def _check_entries(entries: tuple[str, ...]) -> tuple[str, ...]:
    for entry in entries:
        check_entry(entry)
    if len(set(entries)) != len(entries):
        raise ValueError("an entry is listed twice")
    return entries


Entries = Annotated[tuple[str, ...], AfterValidator(_check_entries)]


class AgentServer(BaseModel):
    """``[agents.NAME.servers.ID]``: an MCP server of the agent's own, handed to its runtime
    beside the capd bridge. ``{agent_id}`` and the run's context (``{thread_id}``,
    ``{workspace_dir}``, ``{agent_dir}``, any ``--context`` key) are substituted into its
    command, env and url when it is resolved; an unknown placeholder fails the resolution."""

    model_config = _FROZEN
    command: tuple[str, ...] | None = Field(None, min_length=1)
    url: str | None = None
    env: dict[str, str] = Field(default_factory=dict)

    _one = exactly_one("command", "url",
                       "a server is a command (stdio) or a url (HTTP), one of them")


class AgentSpec(BaseModel):
    """``[agents.NAME]``: the complete, explicit list of what one agent may use."""

    model_config = _FROZEN
    description: str = ""
    capabilities: Entries = Field(
        min_length=1, description="Capability names, globs (notes.*) and tags (tag:notes).")
    engine: tuple[str, ...] | None = Field(
        None, min_length=1, description="The program that runs the agent (any agent CLI, a "
        "model runner, a script), as argv: given one, the agent is also the capability "
        "agent.NAME, run with a JSON request on stdin.")
    system_prompt: str = ""
    servers: dict[str, AgentServer] = Field(
        default_factory=dict, description="MCP servers of the agent's own (a workspace "
        "file server...), with context placeholders.")
    latency_class: Literal["inner", "outer", "both"] | None = None
    timeout_s: float = Field(60.0, gt=0, le=3600)
    run_as: str | None = Field(
        None, description="The user the engine runs as when the daemon runs as root (a "
        "name or uid, e.g. capd-agent); else the daemon's own user. Either way the engine "
        "and everything it starts are held to this agent's grant on the socket.")


class InjectionSpec(BaseModel):
    """``[[injections]]``: capabilities added to any agent when the context matches ``when``.

    ``when = "key"`` matches a context holding ``key`` with a value that is not
    false, 0, no or empty; ``when = "key=value"`` matches that exact value.
    """

    model_config = _FROZEN
    when: str
    add: Entries = Field(min_length=1)
    why: str = ""

    @field_validator("when")
    @classmethod
    def _condition(cls, value: str) -> str:
        key = value.partition("=")[0]
        if not _CONTEXT_KEY.match(key):
            raise ValueError(f"when = {value!r}: use a context key (silent) or key=value "
                             "(mode=batch); a key is letters, digits, '_', '.' or '-'")
        return value

    def matches(self, context: Mapping[str, str]) -> bool:
        """Whether this injection applies in ``context``."""
        key, sep, wanted = self.when.partition("=")
        if key not in context:
            return False
        if sep:
            return context[key] == wanted
        return context[key].strip().lower() not in _FALSE


@dataclass(frozen=True)
class Selection:
    """What one entry selected: canonical names, sorted; ``problem`` when it selects nothing."""

    entry: str
    kind: EntryKind
    capabilities: tuple[str, ...]
    problem: str | None = None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready."""
        view: dict[str, object] = {"entry": self.entry, "kind": self.kind,
                                   "capabilities": list(self.capabilities)}
        if self.problem is not None:
            view["problem"] = self.problem
        return view


def select_capabilities(registry: Registry, entry: str, *, by_agent: bool = False
                        ) -> Selection:
    """Expand ``entry`` against every capability of ``registry``, live or disabled.

    Never raises: an exact name that is not declared (with close names, or why
    this host leaves it out), or a glob or tag that matches nothing, comes back
    with no capabilities and a ``problem`` sentence. For an agent's own entries
    (``by_agent``), an ``injection_only`` capability named exactly is a problem, and
    globs and tags pass it by.
    """
    kind = entry_kind(entry)
    if kind == "name":
        try:
            name = registry.resolve(entry)
            if by_agent and registry.get(name).injection_only:
                return Selection(entry, kind, (), (
                    f"capability {name!r} is injection-only: an [[injections]] entry adds "
                    "it in the context that needs it; an agent cannot list it"))
            return Selection(entry, kind, (name,))
        except UnknownCapability as exc:
            why = registry.not_on_host.get(without_mark(entry))
            problem = (f"capability {entry!r} is not offered on this host ({why})"
                       if why is not None else str(exc))
            return Selection(entry, kind, (), problem)
    snapshot = registry.snapshot()
    every = [c for c in (*snapshot.live.values(),
                         *(e.capability for e in snapshot.disabled.values()))
             if not (by_agent and c.injection_only)]
    if kind == "glob":
        found = sorted(c.name for c in every if fnmatch.fnmatchcase(c.name, entry))
        problem = f"glob {entry!r} matches no capability"
    else:
        tag = entry[len(TAG_PREFIX):]
        found = sorted(c.name for c in every if tag in c.tags)
        problem = f"tag {tag!r} is on no capability"
    return Selection(entry, kind, tuple(found), None if found else problem)
