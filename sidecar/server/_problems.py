"""What an error raised while answering a request says: its HTTP status and problem body.

The socket API answers a request's error with it; ``POST /calls`` puts it in the entry of
the call that failed, so each call of a batch says what a call alone would have.
"""

from __future__ import annotations

from typing import Any

import structlog

from capd.recovery import (
    IdempotencyConflict,
    InvalidTransition,
    QueueClosed,
    UnknownJob,
    UnknownTool,
)
from capd.registry import (
    CapdError,
    InvalidTopology,
    ToolUnavailable,
    UnknownCapability,
    UnknownOffer,
    UnknownTopology,
)

from .._errors import (
    BadRequest,
    Draining,
    ExportConflict,
    Forbidden,
    InvalidArguments,
    InvalidParams,
    InvalidTimeout,
    SearchUnavailable,
    UnknownAgent,
    UnknownProfile,
    UnknownToken,
    UnresolvedAgent,
    UpstreamFailed,
)
from ._consent import UnknownGrant

log = structlog.get_logger("capd.api")


_PROBLEMS: dict[type[Exception], tuple[int, str, dict[str, str]]] = {
    # the error, its status and title, and its attributes the body carries (key: attribute)
    BadRequest: (400, "Bad Request", {}),
    Forbidden: (403, "Forbidden", {}),
    InvalidArguments: (422, "Invalid Arguments", {"errors": "errors"}),
    InvalidParams: (422, "Invalid Parameters", {"errors": "errors"}),
    InvalidTimeout: (422, "Invalid Timeout",
                     {"capability": "name", "requested": "requested", "limit_s": "limit_s"}),
    UnknownCapability: (404, "Unknown Capability", {"suggestions": "suggestions"}),
    UnknownTool: (404, "Unknown Tool", {}),
    UnknownOffer: (404, "Not Found", {}),
    UnknownToken: (404, "Unknown Token", {}),
    UpstreamFailed: (502, "Upstream Error", {}),
    ToolUnavailable: (503, "Server Unavailable", {}),
    UnknownAgent: (404, "Unknown Agent", {"suggestions": "suggestions"}),
    UnknownProfile: (404, "Unknown Profile", {"suggestions": "suggestions"}),
    ExportConflict: (409, "Export Conflict", {"clashes": "clashes"}),
    UnresolvedAgent: (422, "Unresolved Agent", {"agent": "agent", "unresolved": "problems"}),
    UnknownTopology: (404, "Unknown Topology", {"suggestions": "suggestions"}),
    InvalidTopology: (422, "Invalid Topology", {"topology": "topology_id", "problems": "problems"}),
    Draining: (503, "Draining", {}),
    SearchUnavailable: (503, "Search Unavailable", {}),
    UnknownJob: (404, "Unknown Job", {}),
    UnknownGrant: (404, "Unknown Grant", {}),
    IdempotencyConflict: (409, "Idempotency Conflict", {}),
    InvalidTransition: (409, "Invalid Transition", {}),
    QueueClosed: (503, "Queue Closed", {}),
}
"""What each error a request may meet answers, looked up in this order (as ``except``
clauses would be)."""


def _p(status: int, title: str, detail: str, **extra: Any) -> tuple[int, dict[str, Any]]:
    return status, {"type": f"urn:capd:problem:{title.lower().replace(' ', '-')}",
                    "title": title, "status": status, "detail": detail, **extra}


def problem_body(exc: Exception, path: str) -> tuple[int, dict[str, Any]]:
    """The status and problem+json body that say what went wrong with a request."""
    for kind, (status, title, extra) in _PROBLEMS.items():
        if isinstance(exc, kind):
            return _p(status, title, str(exc),
                      **{key: getattr(exc, attribute) for key, attribute in extra.items()})
    if isinstance(exc, CapdError):
        log.error("request_failed", path=path, error=str(exc))
        return _p(500, "Internal Error", str(exc))
    log.error("request_crashed", path=path, error=repr(exc))
    return _p(500, "Internal Error", f"{type(exc).__name__}: {exc}")
