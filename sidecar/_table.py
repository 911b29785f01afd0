"""The one operator table: every operator command is one row.

The HTTP routes (:mod:`sidecar._api`) and the ``capd`` CLI subcommands
(:mod:`sidecar.cli`) are both generated from :data:`COMMANDS`; a parity test
fails if either surface has something the table does not.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from . import _handlers as h
from . import _render as r

if TYPE_CHECKING:
    from ._handlers import Context, Reply

Handler = Callable[["Context"], Awaitable["Reply"]]


@dataclass(frozen=True)
class Option:
    """A CLI option carried to the daemon in the query string or the JSON body."""

    flags: tuple[str, ...]
    dest: str
    help: str
    target: Literal["query", "body"] = "query"
    is_flag: bool = False
    choices: tuple[str, ...] | None = None


@dataclass(frozen=True)
class OperatorCommand:
    """One operator command, rendered as an HTTP route and a CLI subcommand."""

    id: str
    summary: str
    method: Literal["GET", "POST"]
    path: str
    cli: tuple[str, ...]
    handler: Handler
    options: tuple[Option, ...] = ()
    takes_params: bool = False
    render: Callable[[Any], str] = r.render_json
    json_mode: bool = True
    path_params: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path_params", tuple(re.findall(r"\{(\w+)\}", self.path)))


FORCE = Option(("--force",), "force", "ignore the per-tool cooldown", is_flag=True)

COMMANDS: tuple[OperatorCommand, ...] = (
    OperatorCommand("health", "Overall health (application/health+json).", "GET", "/health",
                    ("health",), h.health, render=r.render_health),
    OperatorCommand("livez", "Liveness: 200 while the process serves.", "GET", "/livez",
                    ("livez",), h.livez, json_mode=False),
    OperatorCommand("readyz", "Readiness: 503 while starting or draining.", "GET", "/readyz",
                    ("readyz",), h.readyz, json_mode=False),
    OperatorCommand(
        "list", "List capabilities as capsules.", "GET", "/capabilities", ("list",), h.list_caps,
        options=(
            Option(("--state",), "state", "only live or disabled ones",
                   choices=("live", "disabled")),
            Option(("--tag",), "tag", "only capabilities with this tag"),
        ),
        render=r.render_list,
    ),
    OperatorCommand("show", "Full manifest of one capability, with JSON Schema.", "GET",
                    "/capabilities/{name}", ("show",), h.show),
    OperatorCommand("call", "Call a capability with JSON parameters.", "POST", "/call/{name}",
                    ("call",), h.call, takes_params=True, render=r.render_call),
    OperatorCommand("recheck", "Re-probe a disabled capability's missing tools.", "POST",
                    "/recheck/{name}", ("recheck",), h.recheck, options=(FORCE,)),
    OperatorCommand("recheck-tool", "Re-probe one tool and restore what it unblocks.", "POST",
                    "/recheck-tool/{tool}", ("recheck-tool",), h.recheck_tool, options=(FORCE,)),
    OperatorCommand("reload", "Full reload: config, declarations, plugins, probes.", "POST",
                    "/reload", ("reload",), h.reload),
    OperatorCommand("status", "Registry, reload and task statistics.", "GET", "/status",
                    ("status",), h.status),
    OperatorCommand("metrics", "Prometheus metrics (text format).", "GET", "/metrics",
                    ("metrics",), h.metrics, json_mode=False),
    # /queue/stats and /queue/purge come before /queue/{id} so that they match first.
    OperatorCommand("queue-stats", "Retry queue counts, oldest pending age, sweep outcomes.",
                    "GET", "/queue/stats", ("queue", "stats"), h.queue_stats),
    OperatorCommand(
        "queue-purge", "Delete finished jobs of one state older than a duration.", "POST",
        "/queue/purge", ("queue", "purge"), h.queue_purge,
        options=(
            Option(("--state",), "state", "done, partial, dead or cancelled",
                   choices=("done", "partial", "dead", "cancelled")),
            Option(("--older-than",), "older_than", "e.g. 7d, 12h, 30m (default 7d)"),
        ),
    ),
    OperatorCommand(
        "queue-list", "List retry jobs, newest first.", "GET", "/queue", ("queue", "list"),
        h.queue_list,
        options=(Option(("--state",), "state", "only jobs in this state"),
                 Option(("--limit",), "limit", "at most this many (default 100)")),
        render=r.render_jobs,
    ),
    OperatorCommand("queue-show", "One retry job with its attempts.", "GET", "/queue/{id}",
                    ("queue", "show"), h.queue_show),
    OperatorCommand("queue-retry", "Make a parked or dead job due now.", "POST",
                    "/queue/{id}/retry", ("queue", "retry"), h.queue_retry),
    OperatorCommand("queue-cancel", "Cancel a job that is not running.", "POST",
                    "/queue/{id}/cancel", ("queue", "cancel"), h.queue_cancel),
)


def command(command_id: str) -> OperatorCommand:
    """Return the row ``command_id``; raise KeyError."""
    for row in COMMANDS:
        if row.id == command_id:
            return row
    raise KeyError(command_id)
