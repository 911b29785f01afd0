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


def _p(status: int, title: str, detail: str, **extra: Any) -> tuple[int, dict[str, Any]]:
    return status, {"type": f"urn:capd:problem:{title.lower().replace(' ', '-')}",
                    "title": title, "status": status, "detail": detail, **extra}


def problem_body(exc: Exception, path: str) -> tuple[int, dict[str, Any]]:
    """The status and problem+json body that say what went wrong with a request."""
    match exc:
        case BadRequest():
            return _p(400, "Bad Request", str(exc))
        case Forbidden():
            return _p(403, "Forbidden", str(exc))
        case InvalidArguments():
            return _p(422, "Invalid Arguments", str(exc), errors=exc.errors)
        case InvalidParams():
            return _p(422, "Invalid Parameters", str(exc), errors=exc.errors)
        case InvalidTimeout():
            return _p(422, "Invalid Timeout", str(exc), capability=exc.name,
                           requested=exc.requested, limit_s=exc.limit_s)
        case UnknownCapability():
            return _p(404, "Unknown Capability", str(exc), suggestions=exc.suggestions)
        case UnknownTool():
            return _p(404, "Unknown Tool", str(exc))
        case UnknownOffer():
            return _p(404, "Not Found", str(exc))
        case UnknownToken():
            return _p(404, "Unknown Token", str(exc))
        case UpstreamFailed():
            return _p(502, "Upstream Error", str(exc))
        case ToolUnavailable():
            return _p(503, "Server Unavailable", str(exc))
        case UnknownAgent():
            return _p(404, "Unknown Agent", str(exc), suggestions=exc.suggestions)
        case UnknownProfile():
            return _p(404, "Unknown Profile", str(exc), suggestions=exc.suggestions)
        case ExportConflict():
            return _p(409, "Export Conflict", str(exc), clashes=exc.clashes)
        case UnresolvedAgent():
            return _p(422, "Unresolved Agent", str(exc), agent=exc.agent,
                           unresolved=exc.problems)
        case UnknownTopology():
            return _p(404, "Unknown Topology", str(exc), suggestions=exc.suggestions)
        case InvalidTopology():
            return _p(422, "Invalid Topology", str(exc), topology=exc.topology_id,
                           problems=exc.problems)
        case Draining():
            return _p(503, "Draining", str(exc))
        case SearchUnavailable():
            return _p(503, "Search Unavailable", str(exc))
        case UnknownJob():
            return _p(404, "Unknown Job", str(exc))
        case UnknownGrant():
            return _p(404, "Unknown Grant", str(exc))
        case IdempotencyConflict():
            return _p(409, "Idempotency Conflict", str(exc))
        case InvalidTransition():
            return _p(409, "Invalid Transition", str(exc))
        case QueueClosed():
            return _p(503, "Queue Closed", str(exc))
        case CapdError():
            log.error("request_failed", path=path, error=str(exc))
            return _p(500, "Internal Error", str(exc))
    log.error("request_crashed", path=path, error=repr(exc))
    return _p(500, "Internal Error", f"{type(exc).__name__}: {exc}")
