"""Calling a capability once and classifying what happened.

The gateway (a caller's request) and the retry sweep (a queued job) call
capabilities the same way, so they share this one classification.

An op's typed errors (``TransientToolError``, ``ToolUnavailable``, …) say what
they mean. An untyped exception is classified by what it is:

- a class the capability names in ``permanent_errors`` → permanent;
- a class it names in ``transient_errors`` → transient;
- a network failure (connection refused or reset, a timeout, an unreachable
  host, or the connection errors of aiohttp, httpx, requests and urllib3),
  also when it is the ``__cause__`` of what the op raised → transient, and the
  capability's network tools are reported down;
- anything else → permanent (transient while the capability's tools are known
  to be down).
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Literal

import structlog
from pydantic import BaseModel

from capd.registry import (
    USER_CODE_FAILURES,
    Blocked,
    Capability,
    Partial,
    PermanentToolError,
    Registry,
    ThreadHandle,
    ToolUnavailable,
    TransientToolError,
)

from ._deadline import deadline

log = structlog.get_logger("capd.calls")

CallKind = Literal["success", "partial", "transient", "permanent", "blocked"]

# Connection errors of the common HTTP client libraries, by package and class name
# (matched without importing the libraries).
NETWORK_ERROR_NAMES: frozenset[str] = frozenset({
    "aiohttp.ClientConnectionError",  # refused, reset, disconnected, server timeout
    "aiohttp.ClientPayloadError",
    "httpx.TransportError",  # connect, read, write and pool errors and timeouts
    "httpcore.NetworkError",
    "httpcore.TimeoutException",
    "requests.ConnectionError",
    "requests.Timeout",
    "urllib3.NewConnectionError",
    "urllib3.ProtocolError",
    "urllib3.TimeoutError",
    "urllib3.MaxRetryError",
})
NETWORK_ERRNOS: frozenset[int] = frozenset({
    errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE, errno.ENOTCONN,
    errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN, errno.EHOSTDOWN,
    errno.ENETRESET,
})
# Tool kinds reached over a connection: the ones a network failure says are down.
NETWORK_TOOL_KINDS: frozenset[str] = frozenset({"http", "tcp", "unix"})


@dataclass(frozen=True)
class CallOutcome:
    """What one call did.

    ``unavailable_tools`` names tools the op reported down; ``network_failure``
    says an untyped network error was seen (the capability's network tools are
    then down). ``abandoned`` is a plain op's thread that was still running
    when the call gave up on it: its write may still land.
    """

    kind: CallKind
    value: Any = None
    error_type: str | None = None
    message: str | None = None
    retry_after_s: float | None = None
    unavailable_tools: tuple[str, ...] = ()
    network_failure: bool = False
    abandoned: ThreadHandle | None = None


def _names_match(cls: type, names: Iterable[str]) -> bool:
    """Whether ``cls`` or a base of it is one of ``names``.

    A name matches by its full dotted path (``httpx._exceptions.ConnectError``)
    or by its top-level package and class name (``httpx.ConnectError``), so a
    library's public alias works too.
    """
    wanted = set(names)
    return bool(wanted) and any(
        f"{k.__module__}.{k.__qualname__}" in wanted
        or f"{k.__module__.partition('.')[0]}.{k.__qualname__}" in wanted for k in cls.__mro__)


def is_network_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or the error it was raised from) is a network failure."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 4:
        if isinstance(current, (ConnectionError, TimeoutError)):
            return True
        if isinstance(current, socket.gaierror):
            if current.errno == socket.EAI_AGAIN:
                return True
        elif isinstance(current, OSError) and current.errno in NETWORK_ERRNOS:
            return True
        if _names_match(type(current), NETWORK_ERROR_NAMES):
            return True
        reason = getattr(current, "reason", None)  # urllib.error.URLError wraps the cause
        current = current.__cause__ or (reason if isinstance(reason, BaseException) else None)
        seen += 1
    return False


def classify_error(cap: Capability, exc: BaseException, *, unknown_is_transient: bool = False
                   ) -> tuple[Literal["transient", "permanent"], bool]:
    """(kind, network failure) for an untyped exception raised by ``cap``'s op."""
    if _names_match(type(exc), cap.permanent_errors):
        return "permanent", False
    if _names_match(type(exc), cap.transient_errors):
        return "transient", False
    if is_network_error(exc):
        return "transient", True
    return ("transient" if unknown_is_transient else "permanent"), False


async def call_capability(cap: Capability, params: BaseModel, *,
                          unknown_errors_are_transient: bool = False,
                          executor: Executor | None = None,
                          timeout_s: float | None = None) -> CallOutcome:
    """Invoke ``cap`` under its ``timeout_s`` and classify the result. Never raises but on cancel.

    ``unknown_errors_are_transient`` is for calls made while the capability's
    tools are known to be down: an untyped failure then means "still down".
    ``timeout_s`` is a caller's shorter limit for this call; the shorter of it
    and the capability's own ``timeout_s`` applies.
    """
    threads: list[ThreadHandle] = []
    limit_s = cap.timeout_s if timeout_s is None else min(timeout_s, cap.timeout_s)
    limit = deadline(limit_s)
    try:
        async with limit:
            value = await cap.invoke(params, executor=executor, on_thread=threads.append)
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
        return CallOutcome("permanent", value=exc.answer,
                           error_type=exc.error_type or "permanent", message=exc.message)
    except TimeoutError as exc:
        if not limit.expired:  # the op's own client timed out: a network failure
            return CallOutcome("transient", error_type="TimeoutError", network_failure=True,
                               message=str(exc) or f"{cap.name}: its tool did not answer in time")
        running = next((t for t in threads if not t.done()), None)
        message = f"{cap.name} did not finish within {limit_s:g}s"
        if running is not None:
            message += "; its thread is still running, so the write may still land"
        return CallOutcome("transient", error_type="timeout", message=message, abandoned=running)
    except USER_CODE_FAILURES as exc:  # an op's unexpected failure (SystemExit too) is data
        kind, network = classify_error(cap, exc, unknown_is_transient=unknown_errors_are_transient)
        return CallOutcome(kind, error_type=type(exc).__name__,
                           message=str(exc) or type(exc).__name__, network_failure=network)
    if isinstance(value, Partial):
        return CallOutcome("partial", value=value.value, message=value.message)
    return CallOutcome("success", value=value)


def apply_passive_health(registry: Registry, cap: Capability, outcome: CallOutcome) -> None:
    """Mark the tools an op reported down as failed, disabling what needs them.

    A network failure marks down the capability's tools that are reached over a
    connection (http, tcp, unix), never a local file or command. The gateway
    and the retry sweep both call this after a call, so a tool found down by
    either is seen by both. Tools the registry does not declare are skipped.
    """
    tools = outcome.unavailable_tools
    if outcome.network_failure:
        tools = tuple(t for t in cap.requires
                      if registry.has_tool(t) and registry.tool_spec(t).kind in NETWORK_TOOL_KINDS)
    if not tools:
        return
    for tool in tools:
        if registry.has_tool(tool):
            registry.mark_tool_down(tool, f"reported by {cap.name}: {outcome.message}")
    log.warning("passive_disable", capability=cap.name, tools=list(tools), error=outcome.message)
