"""Calling a capability once and classifying what happened.

The gateway (a caller's request) and the retry sweep (a queued job) call
capabilities the same way, so they share this one classification.
"""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Literal

import structlog
from pydantic import BaseModel

from registry import (
    Blocked,
    Capability,
    Partial,
    PermanentToolError,
    Registry,
    ToolUnavailable,
    TransientToolError,
)

from ._deadline import deadline

log = structlog.get_logger("capd.calls")

CallKind = Literal["success", "partial", "transient", "permanent", "blocked"]


@dataclass(frozen=True)
class CallOutcome:
    """What one call did. ``unavailable_tools`` names tools the op reported down."""

    kind: CallKind
    value: Any = None
    error_type: str | None = None
    message: str | None = None
    retry_after_s: float | None = None
    unavailable_tools: tuple[str, ...] = ()


async def call_capability(
    cap: Capability, params: BaseModel, *, unknown_errors_are_transient: bool = False,
    executor: Executor | None = None,
) -> CallOutcome:
    """Invoke ``cap`` under its ``timeout_s`` and classify the result. Never raises but on cancel.

    ``unknown_errors_are_transient`` is for calls made while the capability's
    tools are known to be down: an untyped failure then means "still down".
    """
    try:
        async with deadline(cap.timeout_s):
            value = await cap.invoke(params, executor=executor)
    except Blocked as exc:
        return CallOutcome("blocked", error_type="blocked", message=exc.message)
    except ToolUnavailable as exc:
        tools = (exc.tool,) if exc.tool else cap.requires
        return CallOutcome("transient", error_type="tool_unavailable", message=exc.message,
                           retry_after_s=exc.retry_after_s, unavailable_tools=tools)
    except TransientToolError as exc:
        return CallOutcome("transient", error_type="transient", message=exc.message,
                           retry_after_s=exc.retry_after_s)
    except PermanentToolError as exc:
        return CallOutcome("permanent", error_type="permanent", message=exc.message)
    except TimeoutError:
        return CallOutcome("transient", error_type="timeout",
                           message=f"{cap.name} did not finish within {cap.timeout_s:g}s")
    except Exception as exc:  # an op's unexpected failure is data, not a crash
        kind: CallKind = "transient" if unknown_errors_are_transient else "permanent"
        return CallOutcome(kind, error_type=type(exc).__name__,
                           message=str(exc) or type(exc).__name__)
    if isinstance(value, Partial):
        return CallOutcome("partial", value=value.value, message=value.message)
    return CallOutcome("success", value=value)


def apply_passive_health(registry: Registry, cap: Capability, outcome: CallOutcome) -> None:
    """Mark the tools an op reported down as failed, disabling what needs them.

    The gateway and the retry sweep both call this after a call, so a tool found
    down by either is seen by both. Tools the registry does not declare are skipped.
    """
    if not outcome.unavailable_tools:
        return
    for tool in outcome.unavailable_tools:
        if registry.has_tool(tool):
            registry.mark_tool_down(tool, f"reported by {cap.name}: {outcome.message}")
    log.warning("passive_disable", capability=cap.name, tools=list(outcome.unavailable_tools),
                error=outcome.message)
