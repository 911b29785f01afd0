"""Attempts still running after their call gave up on them.

A plain (non-async) op runs in a thread, and a thread cannot be stopped: when
its call passes ``timeout_s`` the caller hears "timed out" while the thread
goes on, and its write may land later. A job for that call must not be
verified or replayed while the thread runs, or the write could be done twice.
The gateway and the sweep hand such threads to :class:`RunningAttempts`, keyed
by job id; the sweep asks it before it touches a job.

Threads die with the process, so after a restart nothing is running and the
table starts empty.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from capd.registry import ThreadHandle


class RunningAttempts:
    """Threads of abandoned attempts, by job id. Owned by the daemon; one event loop."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._by_job: dict[str, list[tuple[float, ThreadHandle]]] = {}
        self._clock = clock

    def add(self, job_id: str, thread: ThreadHandle) -> None:
        """Remember that ``thread`` (an attempt of ``job_id``) is still running."""
        if thread.done():
            return
        self._by_job.setdefault(job_id, []).append((self._clock(), thread))

    def running_for_s(self, job_id: str) -> float | None:
        """How long the oldest still-running attempt of ``job_id`` has run; None when none is."""
        entries = [(since, t) for since, t in self._by_job.get(job_id, ()) if not t.done()]
        if not entries:
            self._by_job.pop(job_id, None)
            return None
        self._by_job[job_id] = entries
        return self._clock() - min(since for since, _ in entries)

    def count(self) -> int:
        """How many abandoned attempts are still running."""
        return sum(1 for entries in self._by_job.values() for _, t in entries if not t.done())
