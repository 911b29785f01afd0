"""The error tree of capd's recovery layer.

::

    CapdError
    └── RecoveryError
        └── UnknownTool        a recheck named a tool no capability declares
"""

from __future__ import annotations

from registry import CapdError


class RecoveryError(CapdError):
    """Root of the recovery layer's errors."""


class UnknownTool(RecoveryError, LookupError):
    """No tool by that name is declared."""

    def __init__(self, tool: str) -> None:
        self.tool = tool
        super().__init__(f"unknown tool {tool!r}")
