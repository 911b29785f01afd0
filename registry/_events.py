"""What a call in progress may tell its caller, and ask of it, before it answers.

A front door that can stream (the socket API's NDJSON answer, and through it
``capd mcp``) sets :data:`CALL_EVENTS` for the call it runs; an op reads it with
:func:`current_events`. Progress and log lines go out as they happen. A
server-to-client request made during the call (MCP sampling or elicitation) is
:meth:`CallEvents.ask`-ed of that caller alone, and only when the caller said it
can answer that kind (:attr:`CallEvents.answers`); otherwise it is refused with
:class:`CannotAsk`, never sent to anyone else.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Protocol


class CannotAsk(Exception):
    """The caller of this call cannot answer a request of this kind (say why)."""


class CallEvents(Protocol):
    """The caller's end of one call's stream."""

    @property
    def answers(self) -> frozenset[str]:
        """The request kinds the caller can answer: ``sampling``, ``elicitation``."""
        ...

    def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """Relay a progress notification (never blocks)."""
        ...

    def log(self, level: str, logger: str | None, data: Any) -> None:
        """Relay a log message (never blocks)."""
        ...

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Ask the caller (``sampling/createMessage``, ``elicitation/create``) and wait
        for its result; raise :class:`CannotAsk` when it cannot or will not answer."""
        ...


CALL_EVENTS: ContextVar[CallEvents | None] = ContextVar("capd_call_events", default=None)


def current_events() -> CallEvents | None:
    """The stream of the call running in this context, if its caller opened one."""
    return CALL_EVENTS.get()


KIND_OF_METHOD = {"sampling/createMessage": "sampling", "elicitation/create": "elicitation"}
"""Which answer kind a server-to-client request needs."""
