"""The errors of capd's recovery layer; the tree is drawn in the package docstring.

Transient and permanent are told apart by class, because the sweep and the
daemon act on it: :class:`QueueFull` passes once space is freed, while
:class:`QueueCorrupt` stays until an operator moves the file aside.
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


class QueueError(RecoveryError):
    """Root of the queue's errors."""


class QueueStorageError(QueueError):
    """The queue file cannot be used (permissions, pragmas that did not take, disk errors)."""


class QueueCorrupt(QueueStorageError):
    """The queue file is not a healthy capd queue. It is never replaced silently."""


class QueueFull(QueueStorageError):
    """The queue's filesystem is full (SQLITE_FULL, ENOSPC, EDQUOT).

    Transient: nothing was written, reads still work, and writes succeed again
    once space is freed, without a restart.
    """


class QueueClosed(QueueError):
    """The queue was closed on purpose; nothing more is accepted."""


class IdempotencyConflict(QueueError):
    """The idempotency key is already used by a job with other parameters."""


class UnknownJob(QueueError, LookupError):
    """No job has that id."""


class InvalidTransition(QueueError):
    """The operator action does not apply to the job's state."""
