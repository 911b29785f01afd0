"""The error tree of capd's recovery layer.

::

    CapdError
    └── RecoveryError
        ├── UnknownTool              a recheck named a tool no capability declares
        └── QueueError               the durable retry queue (defined in ``_queue``)
            ├── QueueStorageError    the file cannot be used: permissions, pragmas, I/O
            │   ├── QueueCorrupt     not a healthy capd queue (empty, foreign, damaged);
            │   │                    permanent until an operator moves it aside
            │   └── QueueFull        the disk is full; transient, writes resume with space
            ├── QueueClosed          closed on purpose; nothing more is accepted
            ├── IdempotencyConflict  the key is used by a job with other parameters
            ├── UnknownJob           no job has that id
            └── InvalidTransition    the operator action does not apply to the job's state
"""

from __future__ import annotations

from capd.registry import CapdError


class RecoveryError(CapdError):
    """Root of the recovery layer's errors."""


class UnknownTool(RecoveryError, LookupError):
    """No tool by that name is declared."""

    def __init__(self, tool: str) -> None:
        self.tool = tool
        super().__init__(f"unknown tool {tool!r}")
