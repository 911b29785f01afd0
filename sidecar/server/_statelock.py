"""One daemon per state directory: an exclusive ``flock`` on ``capd.lock`` in it.

Two daemons on one ``queue.db`` would both sweep it and claim the same jobs.
The lock is held for the process's life and released by the kernel when it
exits, however it exits (``kill -9`` included), so a stale lock never blocks a
restart. The file holds the holder's pid, for the message a second daemon
prints.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from .._errors import SidecarError, StateDirLocked

LOCK_NAME = "capd.lock"


class StateLock:
    """The held lock on a state directory; :meth:`release` (or process exit) frees it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Unlock and close (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _holder_pid(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, 32, 0).decode().strip() or "x")
    return None


def acquire_state_lock(state_dir: Path) -> StateLock:
    """Lock ``state_dir`` for this process; raise :class:`StateDirLocked` if another holds it.

    Raises :class:`SidecarError` when the folder cannot be made or the lock file opened.
    """
    path = state_dir / LOCK_NAME
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # an existing one is kept
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise SidecarError(f"cannot open the state lock {path}: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        pid = _holder_pid(fd)
        os.close(fd)
        holder = f"pid {pid}" if pid else "another process"
        raise StateDirLocked(
            f"another capd ({holder}) is using the state directory {state_dir}; stop it, or "
            "give this daemon its own state_dir (two daemons on one queue would run the same "
            "jobs)", pid) from exc
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return StateLock(path, fd)
