"""What an op raises or returns to tell the gateway how a call went.

Ops import these from ``registry`` (the layer plugins already depend on)::

    ToolError
    ├── ToolUnavailable      the tool is down: transient, and the capability is disabled
    ├── TransientToolError   try again later (optionally after ``retry_after_s``)
    ├── PermanentToolError   retrying will not help
    └── Blocked              a policy refused the call

Any other exception is treated as permanent, with its type named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

USER_CODE_FAILURES: tuple[type[BaseException], ...] = (Exception, SystemExit, KeyboardInterrupt)
"""What code a user wrote (an op, a hook, a verify op, a probe, a plugin at import) may
raise that is the failure of that call or reload, never of the daemon: ``SystemExit``
(an argparse-wrapped CLI given a bad argument) and ``KeyboardInterrupt`` as well as any
``Exception``. Cancellation is not among them: it is the caller's, and goes on."""


class ToolError(Exception):
    """Root of the errors an op raises on purpose. A subclass may name its ``error_type``
    (what a ToolResult says); otherwise the kind of error names it."""

    error_type: str | None = None

    def __init__(self, message: str, *, retry_after_s: float | None = None,
                 answer: ToolAnswer | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s
        # What the tool answered with its error (an MCP server's blocks), relayed as is.
        self.answer = answer


class ToolUnavailable(ToolError):
    """The tool behind the capability is down. ``tool`` names it when the op knows which."""

    def __init__(self, message: str, *, tool: str | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.tool = tool


class TransientToolError(ToolError):
    """A failure that may pass: a timeout upstream, a 503, a lock held elsewhere."""


class PermanentToolError(ToolError):
    """A failure that retrying will not fix: bad input the schema could not catch, a 404."""


class Blocked(ToolError):
    """A before-hook or policy refused the call."""


@dataclass(frozen=True)
class ToolAnswer:
    """An answer that is more than a value: what an upstream MCP server said, as it said it.

    ``value`` is the call's result as before (the structured content, else the text);
    ``content`` the MCP content blocks as JSON (``text``, ``image``, ``audio``,
    ``resource``, ``resource_link``: base64 data, MIME types and annotations kept);
    ``structured`` the ``structuredContent``. The gateway puts ``value`` in the
    ToolResult's ``result`` and relays the other two beside it.
    """

    value: Any
    content: tuple[dict[str, Any], ...] = ()
    structured: dict[str, Any] | None = None


@dataclass(frozen=True)
class Partial:
    """Return this from an op when only part of the work was done."""

    value: Any
    message: str
