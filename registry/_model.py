"""The data model: capabilities, tool specs, effect specs and probe results.

Every model here is a frozen pydantic model so that it can cross a boundary
(config, declaration, API body) without being mutated on the way.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from functools import partial
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ._host import HostCaps, HostRequirements
from ._kinds import SAFETY_LEVELS as SAFETY_LEVELS
from ._kinds import LatencyClass as LatencyClass
from ._kinds import Safety as Safety
from ._names import NAME_PATTERN, alias_problem
from ._names import is_valid_name as is_valid_name  # capd.registry imports it from here
from ._routes import ANY_ERROR, ErrorRoute, check_routes
from ._template import TemplateError, check_known
from ._threads import OpThreads, ThreadHandle

RetryPolicy = Literal["manual", "replay", "verify_first"]
PartialReplay = Literal["safe", "unsafe"]

TOOL_ID_PATTERN = r"^[A-Za-z][A-Za-z0-9_.-]*$"
# An exception class by dotted name: ``builtins.ConnectionError``, ``httpx.ConnectError``.
ERROR_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$"

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def exactly_one(first: str, second: str, message: str, *, program: str | None = None) -> Any:
    """An after-validator of a model: exactly one of the fields ``first`` and ``second``
    is set (else ValueError ``message``), and the argv field ``program``, if named and
    set, is not empty."""

    def check(self: Any) -> Any:
        if (getattr(self, first) is None) == (getattr(self, second) is None):
            raise ValueError(message)
        if program is not None and getattr(self, program) == ():
            raise ValueError(f"'{program}' must name a program")
        return self

    return model_validator(mode="after")(check)


# --------------------------------------------------------------------------- tools


class _ProbeSpec(BaseModel):
    model_config = _FROZEN
    timeout_s: float = Field(5.0, gt=0, le=300, description="Give up on the probe after this long.")
    description: str = ""
    install_hint: str | None = Field(
        None, min_length=1, max_length=400,
        description="How to get the tool, e.g. 'apt install git'; shown where it is missing.")


class CommandProbe(_ProbeSpec):
    """The tool is a CLI: ``which`` finds it on PATH, or ``argv`` runs and exits 0."""

    kind: Literal["command"] = "command"
    which: str | None = None
    argv: tuple[str, ...] | None = None

    _one_of = exactly_one("which", "argv", "a command probe needs exactly one of 'which' or "
                          "'argv'", program="argv")


class HttpProbe(_ProbeSpec):
    """The tool is an HTTP service: ``method url`` answers ``expect_status``."""

    kind: Literal["http"] = "http"
    url: str = Field(pattern=r"^https?://")
    method: Literal["GET", "HEAD", "POST", "OPTIONS"] = "GET"
    expect_status: int = Field(200, ge=100, le=599)


class TcpProbe(_ProbeSpec):
    """The tool listens on a TCP port: a connection to ``host:port`` succeeds."""

    kind: Literal["tcp"] = "tcp"
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)


class UnixProbe(_ProbeSpec):
    """The tool listens on a Unix socket: a connection to ``path`` succeeds."""

    kind: Literal["unix"] = "unix"
    path: str


class PathProbe(_ProbeSpec):
    """The tool is a file or folder: ``path`` exists (and is writable, if asked)."""

    kind: Literal["path"] = "path"
    path: str
    must_be: Literal["any", "file", "dir"] = "any"
    writable: bool = False


class PythonProbe(_ProbeSpec):
    """The tool is checked by a Python callable ``module:attr`` (async or not).

    It passes when it returns anything but ``False`` without raising.
    """

    kind: Literal["python"] = "python"
    target: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class McpProbe(_ProbeSpec):
    """The tool is an MCP server (stdio ``command`` or streamable-HTTP ``url``).

    The probe is the MCP handshake (initialize + tools/list, then a ping while
    the daemon holds the session); every tool the server lists becomes a
    capability named ``<prefix>.<tool>`` (see ``_upstream.py``).
    """

    kind: Literal["mcp"] = "mcp"
    command: tuple[str, ...] | None = None
    url: str | None = Field(None, pattern=r"^https?://")
    env: dict[str, str] = Field(default_factory=dict)
    prefix: str | None = Field(None, pattern=r"^[a-z][a-z0-9_]*$",
                               description="Capability names are <prefix>.<tool> (default: "
                               "the tool id).")
    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    call_timeout_s: float = Field(30.0, gt=0, le=3600)
    max_result_bytes: int = Field(
        16 << 20, ge=1024, le=1 << 30, description="A stdio server's message larger than "
        "this is dropped before the daemon reads it, and the call answers "
        "error_permanent / result_too_large with the size (the session stays usable).")
    ping_timeout_s: float = Field(
        5.0, gt=0, le=60, description="A ping (the probe of a held session, and the check "
        "after a call timed out) missing this deadline means the server is stalled: it is "
        "stopped and started again.")
    retry_policy: RetryPolicy = Field(
        "manual", description="For the upstream's mutating tools.")
    direct: bool = Field(False, description="An agent's runtime reaches this server itself.")
    tags: tuple[str, ...] = ()

    _one_transport = exactly_one("command", "url", "an mcp tool needs exactly one of "
                                 "'command' (stdio) or 'url' (streamable HTTP)",
                                 program="command")


ToolSpec = Annotated[
    CommandProbe | HttpProbe | TcpProbe | UnixProbe | PathProbe | PythonProbe | McpProbe,
    Field(discriminator="kind"),
]


class ProbeResult(BaseModel):
    """What one probe of one tool found. ``checked_at`` is UTC epoch seconds."""

    model_config = _FROZEN
    tool: str
    ok: bool
    latency_s: float
    error: str | None = None
    checked_at: float


# ------------------------------------------------------------------------- effects


class _EffectSpec(BaseModel):
    model_config = _FROZEN
    description: str = ""
    timeout_s: float = Field(5.0, gt=0, le=300)

    _templated: ClassVar[tuple[str, ...]] = ()  # the fields that take ``{param}``

    def template_fields(self) -> dict[str, str]:
        """Return the string fields that take ``{param}`` placeholders (``argv[0]``, ...)."""
        fields: dict[str, str] = {}
        for name in self._templated:
            value = getattr(self, name)
            if isinstance(value, str):
                fields[name] = value
            elif isinstance(value, tuple):
                fields.update({f"{name}[{i}]": a for i, a in enumerate(value)})
        return fields


class FileContainsEffect(_EffectSpec):
    """The file at ``path`` contains the literal ``line`` or matches ``regex``."""

    kind: Literal["file_contains"] = "file_contains"
    path: str
    line: str | None = None
    regex: str | None = None
    _templated = ("path", "line", "regex")

    _one_of = exactly_one("line", "regex",
                          "a file_contains effect needs exactly one of 'line' or 'regex'")


class FileExistsEffect(_EffectSpec):
    """A file or folder exists at ``path``."""

    kind: Literal["file_exists"] = "file_exists"
    path: str
    _templated = ("path",)


class HttpEffect(_EffectSpec):
    """``method url`` answers ``expect_status`` (and, if set, a JSON field equals a value)."""

    kind: Literal["http"] = "http"
    url: str = Field(pattern=r"^https?://")
    method: Literal["GET", "HEAD"] = "GET"
    expect_status: int = Field(200, ge=100, le=599)
    json_field: str | None = None
    json_equals: str | int | float | bool | None = None
    _templated = ("url", "json_equals")


class CommandEffect(_EffectSpec):
    """``argv`` exits 0 when the effect is present and 1 when it is absent."""

    kind: Literal["command"] = "command"
    argv: tuple[str, ...] = Field(min_length=1)
    _templated = ("argv",)


class OpEffect(_EffectSpec):
    """A verify op (registered with ``@op``) decides: it returns True/False, or None for unknown."""

    kind: Literal["op"] = "op"
    op: str


EffectSpec = Annotated[
    FileContainsEffect | FileExistsEffect | HttpEffect | CommandEffect | OpEffect,
    Field(discriminator="kind"),
]


# ---------------------------------------------------------------------- capability

SUMMARY_MAX_TOKENS = 200
DESCRIPTION_MAX_TOKENS = 800


def estimate_tokens(text: str) -> int:
    """Tokens in ``text`` by the documented estimate: ceil(characters / 4).

    The one rule behind the summary and description budgets and search's capsule sizes.
    """
    return -(-len(text) // 4)


_HOT = "capd_hot_path"  # (func is async, parameter names or None): see model_post_init


INNER_TIMEOUT_S = 5.0
"""The most an ``inner`` capability may take (its timeout is the strict tier's)."""


class Capability(BaseModel):
    """One callable unit an agent may invoke.

    ``func`` is called as ``func(params, **options)`` where ``params`` is an
    instance of ``parameters``; it may be async or plain (plain ones run in a
    worker thread).

    ``aliases`` are other names it answers to, as seed packs write them
    (``security-auditor``, ``code_review``, ``v2.tool``, ``notes.add``): each is
    1 to 64 characters of lower-case letters, digits, ``.``, ``_`` and ``-``,
    starting with a letter or a digit (``_names.ALIAS_PATTERN``; so never a path
    dot-segment, never an option, never ``@``), listed once, and not the
    capability's own name. Whether it clashes with another capability's name
    or alias is the build's check. Wherever a name is looked up, ``@alias``
    (and ``@name``) is the same as ``alias`` (``_names.without_mark``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    name: str = Field(pattern=NAME_PATTERN, description="Dot-namespaced id, e.g. notes.append.")
    summary: str = Field(min_length=1)
    description: str = ""
    parameters: type[BaseModel]
    func: Callable[..., Any]
    requires: tuple[str, ...] = ()
    mutates_state: bool = False
    retry_policy: RetryPolicy = "manual"
    partial_replay: PartialReplay = "unsafe"
    replay_while_disabled: bool = Field(
        True, description="Whether the retry sweep runs a queued job's callable while the "
        "capability is still disabled after its recheck (its tool raises a transient error "
        "and the job waits, no attempt spent); false: the job waits for the tools first.")
    effects: tuple[EffectSpec, ...] = ()
    consent_operations: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    channels: tuple[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")], ...] = Field(
        (), description="The conversation channels it may run for (private, team...): a "
        "caller speaking from another channel, or from none, is refused (wrong_channel). "
        "Empty: every channel.")
    # inner: answers within INNER_TIMEOUT_S (a strict timeout); outer: up to a minute or
    # more. Undeclared, it follows timeout_s.
    latency_class: LatencyClass = "inner"
    timeout_s: float = Field(30.0, gt=0, le=3600)
    op_id: str | None = None
    upstream_tool: Mapping[str, Any] | None = Field(
        None, description="For an upstream MCP server's tool: what the server said of it "
        "beyond the schema (title, annotations, outputSchema, _meta), relayed by capd mcp.")
    options: Mapping[str, Any] = Field(default_factory=dict)
    host_caps: HostCaps | None = Field(
        None, description="What the caller's host must offer (os, gui, tokens, scm): a "
        "search or list that says what its host has leaves it out when that falls short.")
    provides: tuple[str, ...] = Field(
        (), description="What it makes possible, in a word or two each (the capsule's "
        "capabilities list): matched by search.")
    injection_only: bool = Field(
        False, description="Added to an agent only by a run-time injection, in the context "
        "that needs it: an agent listing it by name is an error, and its globs and tags "
        "pass it by.")
    agent: Mapping[str, Any] | None = Field(
        None, description="For an agent that runs (agent.NAME): its engine, system prompt "
        "and the capabilities it may use, shown in the manifest.")
    transient_errors: tuple[Annotated[str, Field(pattern=ERROR_NAME_PATTERN)], ...] = Field(
        (), description="Exception classes (dotted names) that mean 'try again later'.")
    permanent_errors: tuple[Annotated[str, Field(pattern=ERROR_NAME_PATTERN)], ...] = Field(
        (), description="Exception classes (dotted names) that mean 'this call cannot work'.")
    host: HostRequirements | None = None
    on_error: tuple[ErrorRoute, ...] = Field(
        (), description="Per error type, the capabilities to try instead (see fallbacks_for).")
    auto_fallback: bool = Field(
        False, description="Try the on_error chain without asking; only when not mutating state.")
    owner: str | None = Field(None, min_length=1, description="Who answers for it.")
    version: str | None = Field(None, min_length=1)
    permissions: tuple[str, ...] = Field(
        (), description="Free-form: what it needs or touches, e.g. 'fs:read ~/notes'.")
    safety: Safety = Field(
        "read_only", description="read_only, writes, destructive or external_side_effects; "
        "by default read_only when not mutating state, writes otherwise.")
    context_budget_tokens: int | None = Field(
        None, gt=0, description="About how many tokens its answer takes of an agent's context.")
    source: str = ""

    @model_validator(mode="before")
    @classmethod
    def _default_safety(cls, data: Any) -> Any:
        # A declared safety wins; otherwise it follows mutates_state (decided once, here).
        if isinstance(data, dict) and data.get("safety") is None:
            data = {**data, "safety": "writes" if data.get("mutates_state") else "read_only"}
        # An undeclared latency class follows the time budget: inner within 5 s.
        if isinstance(data, dict) and data.get("latency_class") is None:
            timeout = data.get("timeout_s", 30.0)
            inner = isinstance(timeout, int | float) and timeout <= INNER_TIMEOUT_S
            data = {**data, "latency_class": "inner" if inner else "outer"}
        return data

    @field_validator("requires")
    @classmethod
    def _tool_ids(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for tool in value:
            if not re.match(TOOL_ID_PATTERN, tool):
                raise ValueError(f"tool id {tool!r} must match {TOOL_ID_PATTERN}")
        if len(set(value)) != len(value):
            raise ValueError("a tool is listed twice")
        return value

    @field_validator("aliases")
    @classmethod
    def _well_formed_aliases(cls, value: tuple[str, ...], info: ValidationInfo
                             ) -> tuple[str, ...]:
        problems: list[str] = []
        seen: set[str] = set()
        for alias in value:
            problem = alias_problem(alias)
            if alias in seen:
                problems.append(f"alias {alias!r} is listed twice")
            elif problem is not None:
                problems.append(problem)
            elif alias == info.data.get("name"):
                problems.append(f"alias {alias!r} repeats the capability's own name")
            seen.add(alias)
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @field_validator("on_error")
    @classmethod
    def _routes_lead_elsewhere(
        cls, value: tuple[ErrorRoute, ...], info: ValidationInfo
    ) -> tuple[ErrorRoute, ...]:
        # name and aliases are declared above, so they are validated first (absent if invalid).
        own = [info.data["name"]] if "name" in info.data else []
        check_routes(value, [*own, *info.data.get("aliases", ())])
        return value

    @field_validator("auto_fallback")
    @classmethod
    def _fallback_is_safe(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("mutates_state"):
            raise ValueError("auto_fallback = true is only for a capability that does not mutate "
                             "state (a write must never be retried elsewhere unasked); set "
                             "auto_fallback = false")
        return value

    @field_validator("summary", "description")
    @classmethod
    def _fits_its_budget(cls, value: str, info: ValidationInfo) -> str:
        budget, where, advice = (
            (SUMMARY_MAX_TOKENS, "a capsule", "move detail to 'description'")
            if info.field_name == "summary" else
            (DESCRIPTION_MAX_TOKENS, "a manifest", "shorten it, or link to the rest"))
        tokens = estimate_tokens(value)
        if tokens > budget:
            raise ValueError(f"{info.field_name} is about {tokens} tokens (1 per 4 characters); "
                             f"{where} allows {budget}: {advice}")
        return value

    @model_validator(mode="after")
    def _policy_is_coherent(self) -> Capability:
        if self.latency_class == "inner" and self.timeout_s > INNER_TIMEOUT_S:
            raise ValueError(
                f"latency_class 'inner' answers within {INNER_TIMEOUT_S:g} s, and timeout_s is "
                f"{self.timeout_s:g}: lower timeout_s, or declare latency_class = 'outer'")
        if self.retry_policy in ("replay", "verify_first") and not self.mutates_state:
            raise ValueError(f"retry_policy '{self.retry_policy}' only applies to a capability "
                             "that mutates state; set mutates_state = true or retry_policy = "
                             "'manual'")
        if self.retry_policy == "verify_first" and not self.effects:
            raise ValueError("retry_policy 'verify_first' needs at least one declared effect to "
                             "verify")
        shadowed = sorted(set(self.parameters.model_fields) & set(self.options))
        if shadowed:
            raise ValueError(f"parameter {', '.join(repr(n) for n in shadowed)} has the name of "
                             "an option; rename the parameter or the option (a caller must never "
                             "choose an option's value, such as the file an effect verifies)")
        known = set(self.parameters.model_fields) | set(self.options)
        for index, effect in enumerate(self.effects):
            for field, template in effect.template_fields().items():
                try:
                    unknown = check_known(template, known)
                except TemplateError as exc:
                    raise ValueError(f"effects[{index}].{field}: {exc}") from exc
                if unknown:
                    raise ValueError(f"effects[{index}].{field}: unknown placeholder "
                                     f"{', '.join('{' + u + '}' for u in unknown)}; known names "
                                     f"are {', '.join(sorted(known)) or '(none)'}")
        return self

    def model_post_init(self, context: Any, /) -> None:
        """Decide once what the hot path asks: is ``func`` async, which parameter names exist.

        Kept in the instance ``__dict__`` under names that are not fields (pydantic's
        private attributes cost about 2 µs a read through its ``__getattr__``; these are
        read on every call). Serialisation, equality and hashing look at fields only.
        """
        names: frozenset[str] | None = None
        # A model that says nothing about extra keys refuses them (an agent's typo must
        # not be dropped silently); one that sets ``extra`` itself has opted in.
        if self.parameters.model_config.get("extra") is None:
            names = frozenset(
                known for field_name, info in self.parameters.model_fields.items()
                for known in (field_name, info.validation_alias, info.alias)
                if isinstance(known, str) and known)
        self.__dict__[_HOT] = (inspect.iscoroutinefunction(self.func), names)

    def unknown_params(self, params: Mapping[str, Any]) -> list[str]:
        """The keys of ``params`` the parameter model does not know (none if it allows extras)."""
        names = self.__dict__[_HOT][1]
        if names is None or params.keys() <= names:
            return []
        return sorted(k for k in params if k not in names)

    def fallbacks_for(self, error_type: str) -> tuple[str, ...]:
        """Return the capabilities to try after a failure with ``error_type``, in order.

        The route declared for exactly ``error_type`` wins, else the ``"*"``
        route, else there is none (an empty tuple). In a built registry the
        names are canonical (an alias in a declaration is resolved).
        """
        fallback: tuple[str, ...] = ()
        for route in self.on_error:
            if route.error_type == error_type:
                return route.try_
            if route.error_type == ANY_ERROR and not fallback:
                fallback = route.try_
        return fallback

    async def invoke(
        self, params: BaseModel, *, executor: Executor | None = None,
        on_thread: Callable[[ThreadHandle], None] | None = None,
    ) -> Any:
        """Call the capability with validated ``params`` and its bound options.

        A plain function runs on ``executor`` (the default executor when None).
        Cancelling the caller cannot stop such a thread: ``on_thread`` is handed
        the thread's future as soon as it is submitted, so that the caller can
        tell, after giving up on it, whether it is still running.
        """
        if self.__dict__[_HOT][0]:
            return await self.func(params, **self.options)
        call = partial(self.func, params, **self.options)
        if executor is None:
            return await asyncio.get_running_loop().run_in_executor(None, call)
        if isinstance(executor, OpThreads):  # the daemon's: no Future chain, batched wake-ups
            answer, running = executor.run_soon(call)
            if on_thread is not None:
                on_thread(running)
            return await answer
        thread = executor.submit(call)
        if on_thread is not None:
            on_thread(thread)
        return await asyncio.wrap_future(thread)
