"""The seam between the daemon and what serves a request: handlers and metrics.

Handlers (``_handlers.py``) and the metrics collector (``_metrics.py``) read the
daemon only through :class:`Services`: exactly the parts they use, nothing more.
``Daemon`` satisfies it and remains the one place that wires things. This module
imports nothing else of the sidecar when it runs (the parts' types only for the
type checker), so no import circle can pass through it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from capd.recovery import JobQueue, QueueStats
from capd.registry import Registry

from ._grant import Caller

if TYPE_CHECKING:
    from capd.recovery import Rechecker, RetrySweep
    from capd.registry import UpstreamPool

    from ._config import LoadedConfig
    from ._gateway import Gateway
    from ._policy import Policy
    from ._reload import Reloader
    from ._search import SearchIndexes
    from ._streams import Streams
    from ._tokens import TokenStore

State = Literal["starting", "ready", "draining", "stopped"]

JSON = "application/json"


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


class MetricsText(Protocol):
    """The Prometheus exposition (``_metrics.Metrics``, which reads the daemon through
    :class:`Services`)."""

    async def render(self) -> bytes: ...


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
    def loaded(self) -> LoadedConfig: ...
    @property
    def gateway(self) -> Gateway: ...
    @property
    def rechecker(self) -> Rechecker: ...
    @property
    def reloader(self) -> Reloader[Any]: ...
    @property
    def queue(self) -> JobQueue | None: ...
    @property
    def sweep(self) -> RetrySweep | None: ...
    @property
    def metrics(self) -> MetricsText: ...
    @property
    def policy(self) -> Policy: ...
    @property
    def front_door(self) -> dict[str, Any] | None:
        """The HTTP front door serving now (address, origins, TLS, connections), if any."""
        ...
    @property
    def upstreams(self) -> UpstreamPool: ...
    @property
    def streams(self) -> Streams: ...
    @property
    def tokens(self) -> TokenStore: ...
    @property
    def search(self) -> SearchIndexes: ...
    def task_stats(self) -> dict[str, int]: ...
    async def queue_stats(self, max_age_s: float = 1.0) -> QueueStats: ...
