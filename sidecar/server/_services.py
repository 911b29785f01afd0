"""The seam between the daemon and what serves a request: handlers and metrics.

Handlers (``_handlers.py``) and the metrics collector (``_metrics.py``) read the
daemon only through :class:`Services`: exactly what they use, nothing more.
``Daemon`` satisfies it and remains the one place that wires things; a test can
hand a handler anything else that does. This module imports nothing else of
the sidecar, so no import circle can pass through it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from capd.recovery import (
    CapabilityRecheck,
    JobQueue,
    QueueStats,
    RecheckStats,
    ToolRecheck,
)
from capd.registry import (
    AgentSpec,
    CallEvents,
    Capability,
    InjectionSpec,
    Registry,
    TopologySet,
)

from ._grant import OPERATOR, Grant, Profile

if TYPE_CHECKING:
    from capd.registry import SearchIndex, UpstreamPool

State = Literal["starting", "ready", "draining", "stopped"]

JSON = "application/json"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling: the peer's credentials, read from the socket, its session, its grant.

    ``groups`` are the supplementary groups the peer connected with (None: they could
    not be read, and rules that need them fail closed). ``session`` is the
    ``Capd-Session`` header: an agent session (``capd mcp`` sends one per client
    connection), the unit of session grants; loop detection counts by
    :attr:`loop_key`. ``grant`` is what the authority decided for this peer under the
    serving configuration (``_authority.py``); an in-process caller is an operator.
    """

    pid: int | None = None
    uid: int | None = None
    gid: int | None = None
    session: str | None = None
    groups: frozenset[int] | None = None
    grant: Grant = OPERATOR

    @property
    def loop_key(self) -> str | None:
        """What loop detection counts by: the session; else, for an agent, its uid and
        grant (a new process starts no fresh count); else the peer (uid and pid)."""
        if self.session is not None:
            return self.session
        if self.pid is None:  # in process, or a bearer token's (counted by its token)
            return self._grant_key if self.grant.token is not None else None
        return self._grant_key or f"peer:{self.uid}:{self.pid}"

    @property
    def acts_as_agent(self) -> bool:
        """Whether this caller acts as an agent: an agent's grant (bound or unbound
        non-operator peer, token, narrowed bridge, engine) or an agent session named."""
        return self.grant.role == "agent" or self.session is not None

    @property
    def agent_key(self) -> str | None:
        """For an agent in a session, the count its sessions share (uid and grant), so
        making up a new session name starts no fresh count; None otherwise."""
        return None if self.session is None else self._grant_key

    @property
    def _grant_key(self) -> str | None:
        """An agent's count by uid and grant; None for a caller that is no agent."""
        tag = self.grant.tag
        if tag is not None and self.grant.token is not None:  # a token is its own caller
            return tag
        return None if tag is None or self.uid is None else f"{tag}:{self.uid}"


@dataclass
class Context:
    """One request as a handler sees it."""

    services: Services
    caller: Caller
    request_id: str
    # The request's headers, lower-cased names (``capd-timeout``, ``capd-run-disabled``).
    headers: Mapping[str, str] = field(default_factory=dict)
    # An event set when the client goes away (None in process): a streamed call stops.
    gone: Callable[[], Any] | None = None


@dataclass
class Reply:
    """A handler's answer: a status, a JSON-able body (or bytes), extra headers."""

    status: int
    body: Any
    content_type: str = JSON
    headers: dict[str, str] = field(default_factory=dict)
    # A body written as it is made (a streamed call: ``_streams.py``); ``body`` unused.
    stream: Any = None


Handler = Callable[[Context, Any], Awaitable[Reply]]
"""What an operator row's handler is: the request's context and the row's parameters."""


class CallResult(Protocol):
    """What a handler reads of a dispatched call's result."""

    @property
    def status(self) -> str: ...
    @property
    def capability(self) -> str: ...
    @property
    def queued(self) -> str | None: ...
    @property
    def retry_after_s(self) -> float | None: ...
    def as_json(self) -> dict[str, Any]: ...


class CallCounters(Protocol):
    """Per-capability call counters since start."""

    @property
    def by_status(self) -> Mapping[str, Counter[str]]: ...
    @property
    def total_duration_s(self) -> Mapping[str, float]: ...
    def as_dict(self) -> dict[str, Any]: ...


class Dispatcher(Protocol):
    """The gateway, as handlers and metrics see it."""

    @property
    def in_flight(self) -> int: ...
    @property
    def stats(self) -> CallCounters: ...
    async def dispatch(self, name: str, params: Mapping[str, Any], caller: Caller | None = None,
                       *, request_id: str | None = None,
                       idempotency_key: str | None = None, timeout_s: float | None = None,
                       run_disabled: bool = False) -> CallResult: ...


class Rechecks(Protocol):
    """Re-probes on demand, with their statistics."""

    @property
    def cooldown_s(self) -> float: ...
    @property
    def stats(self) -> RecheckStats: ...
    async def recheck_disabled_capability(self, name: str, *,
                                          force: bool = False) -> CapabilityRecheck: ...
    async def recheck_tool(self, tool: str, *, force: bool = False) -> ToolRecheck: ...


class ReloadReport(Protocol):
    """What one reload did."""

    @property
    def ok(self) -> bool: ...
    @property
    def started_at(self) -> float: ...
    @property
    def duration_s(self) -> float: ...
    @property
    def error(self) -> str | None: ...
    def model_dump(self, *, mode: str = "python") -> dict[str, Any]: ...


class Reloads(Protocol):
    """Full reloads: run one, and what the last ones did."""

    @property
    def count(self) -> int: ...
    @property
    def ok_count(self) -> int: ...
    @property
    def running(self) -> bool: ...
    @property
    def last(self) -> ReloadReport | None: ...
    @property
    def last_failure(self) -> ReloadReport | None: ...
    async def reload(self) -> ReloadReport: ...


class Sweeping(Protocol):
    """The retry sweep's counters and state."""

    @property
    def busy(self) -> int: ...
    @property
    def outcomes(self) -> Mapping[str, int]: ...
    @property
    def storage_error(self) -> str | None: ...


class GrantView(Protocol):
    """One consent grant."""

    @property
    def id(self) -> str: ...
    def view(self, now: float) -> dict[str, Any]: ...


class ConsentBook(Protocol):
    """The operator's consent grants."""

    def grant(self, operations: Iterable[str], *, ttl_s: float, session: str | None = None,
              granted_by_uid: int | None = None) -> GrantView: ...
    def revoke(self, grant_id: str) -> GrantView: ...
    def live(self) -> Sequence[GrantView]: ...
    def missing(self, operations: Iterable[str], session: str | None) -> list[str]: ...


class LoopBook(Protocol):
    """Loop detection's per-session counts."""

    def reset(self, session: str) -> bool: ...
    def sessions(self) -> list[dict[str, Any]]: ...


class Authorities(Protocol):
    """Who a peer is under the serving configuration (``_authority.Authority``)."""

    def grant_for(self, peer: Caller) -> Grant:
        """The peer's grant; raises ``PeerRefused`` when it may not connect."""
        ...
    def narrow(self, grant: Grant, header: str) -> Grant:
        """``grant`` held to a ``Capd-Grant`` header; raises ``BadRequest``/``GrantRefused``."""
        ...
    @property
    def profiles(self) -> Mapping[str, Profile]:
        """The ``[profiles]`` of capd.toml, by name."""
        ...


class PolicyView(Protocol):
    """What handlers read of the policy: who sees what, consent, loop counts, decisions."""

    @property
    def authority(self) -> Authorities: ...

    def visible(self, caller: Caller, cap: Capability) -> bool: ...
    @property
    def profile_names(self) -> Sequence[str]: ...
    def in_profile(self, profile: str, cap: Capability) -> bool:
        """Whether the declared profile ``profile`` takes in ``cap`` (KeyError if none)."""
        ...
    def bound(self, caller: Caller) -> bool: ...
    @property
    def consent(self) -> ConsentBook | None: ...
    @property
    def loops(self) -> LoopBook: ...
    @property
    def decisions(self) -> Mapping[tuple[str, str], int]: ...
    @property
    def recent(self) -> Iterable[Mapping[str, Any]]:
        """The latest decisions that were not a plain allow (refusals first of all)."""
        ...


class McpSettings(Protocol):
    """capd.toml's ``[mcp]`` table, as handlers read it."""

    @property
    def operator_tools(self) -> Sequence[str]: ...
    @property
    def tools(self) -> str: ...


class Settings(Protocol):
    """What handlers read of capd.toml's own settings."""

    @property
    def health_pending_age_s(self) -> float: ...
    @property
    def mcp(self) -> McpSettings: ...


class AgentDeclarations(Protocol):
    """What the rows read of the serving configuration: capd.toml's settings, its agents
    and run-time injections as the serving generation read them, and the declared
    topologies."""

    @property
    def config(self) -> Settings: ...
    @property
    def agents(self) -> Mapping[str, AgentSpec]: ...
    @property
    def injections(self) -> Sequence[InjectionSpec]: ...
    def topologies(self) -> TopologySet:
        """Read the ``[[topology]]`` tables of the declaration files now; blocking."""
        ...


class MetricsText(Protocol):
    """The Prometheus exposition."""

    async def render(self) -> bytes: ...


class StreamView(Protocol):
    """One streamed call, as a handler answers its questions (``_streams.CallStream``)."""

    def answer(self, question: str, body: Any) -> None: ...


class StreamsView(Protocol):
    """The streamed calls running now (``_streams.Streams``)."""

    def of(self, call_id: str, caller: Caller) -> StreamView | None: ...
    def open(self, caller: Caller, answers: frozenset[str]) -> OpenStream: ...


class OpenStream(CallEvents, Protocol):
    """A new stream as the call handler uses it."""

    def close(self) -> None: ...
    async def said_something(self, task: Any, gone: Any) -> bool: ...
    def body(self, task: Any, last_line: Any) -> Any: ...


class TokensView(Protocol):
    """The bearer tokens (``_tokens.TokenStore``); records are ``_tokens.TokenRecord``."""

    def create(self, name: str, *, profile: str | None = ..., allow: tuple[str, ...] = ...,
               channel: str | None = ..., ttl_s: float | None = ...) -> tuple[Any, str]: ...
    def records(self) -> list[Any]: ...
    def revoke(self, key: str) -> Any: ...


class SearchView(Protocol):
    """The serving registry's search index (``_search.SearchIndexes``)."""

    async def index(self, grant: Grant | None = None) -> SearchIndex:
        """The search index; for a restricted grant, of what it may see alone."""
        ...
    def boosts(self, max_age_s: float = 1.0) -> Mapping[str, float]: ...


class Services(Protocol):
    """Everything a handler or the metrics collector reads of the daemon."""

    @property
    def state(self) -> State: ...
    @property
    def version(self) -> str: ...
    @property
    def pid(self) -> int: ...
    @property
    def uptime_s(self) -> float: ...
    @property
    def loop_lag_s(self) -> float: ...
    @property
    def stall_threshold_s(self) -> float: ...
    @property
    def socket_path(self) -> Path: ...
    @property
    def registry(self) -> Registry: ...
    @property
    def loaded(self) -> AgentDeclarations: ...
    @property
    def gateway(self) -> Dispatcher: ...
    @property
    def rechecker(self) -> Rechecks: ...
    @property
    def reloader(self) -> Reloads: ...
    @property
    def queue(self) -> JobQueue | None: ...
    @property
    def sweep(self) -> Sweeping | None: ...
    @property
    def metrics(self) -> MetricsText: ...
    @property
    def policy(self) -> PolicyView: ...
    @property
    def front_door(self) -> dict[str, Any] | None:
        """The HTTP front door serving now (address, origins, TLS, connections), if any."""
        ...
    @property
    def upstreams(self) -> UpstreamPool: ...
    @property
    def streams(self) -> StreamsView: ...
    @property
    def tokens(self) -> TokensView: ...
    @property
    def search(self) -> SearchView: ...
    def task_stats(self) -> dict[str, int]: ...
    async def queue_stats(self, max_age_s: float = 1.0) -> QueueStats: ...
