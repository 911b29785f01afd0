"""The durable retry queue in one SQLite file, committed before a job is acknowledged.

:class:`RetryQueue` is the job logic of ``_job_queue`` over :class:`SqliteStore`: a
:class:`GroupCommit` (``_group_commit``) on the file :func:`open_queue_file` opens
(``_queue_file``) that runs each script on the database thread. What the SQLite
side adds: the disk is its own, so new jobs are refused under a reserve of free
space plus what finishing the jobs already acknowledged may still write, and the
write-ahead log is checkpointed when idle.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import structlog

from ._decision import BackoffPolicy
from ._errors import QueueFull, QueueStorageError
from ._group_commit import GroupCommit
from ._job_queue import QueueCore, Script, run_script
from ._jobs import EnqueueRequest, Job
from ._queries import queries
from ._queue_file import default_reserve, free_space, open_queue_file, storage_error

log = structlog.get_logger("capd.queue")

_SQL = queries("sqlite")
T = TypeVar("T")


class SqliteStore(GroupCommit):
    """The queue file's group commit, running the queue's scripts and named reads."""

    shared = False  # one daemon's file: it claims every due job

    @property
    def where(self) -> str:
        return str(self.path)

    def run(self, script: Script[T]) -> asyncio.Future[T]:
        def work(db: sqlite3.Connection) -> T:
            return run_script(script, lambda s: (db.executemany if s.many else db.execute)(
                _SQL[s.name], s.args))

        return self.transaction(work)

    def add(self, row: tuple[Any, ...], job: Job) -> asyncio.Future[Job]:
        return self.insert(_SQL["insert"], row, job)  # batched with its neighbours

    async def fetch(self, name: str, args: Any = ()) -> list[Any]:
        return await self.read(_SQL[name], args)

    async def integrity_check(self) -> str:
        rows = await self.read("PRAGMA integrity_check")
        return str(rows[0][0]) if rows else "no answer"


class _Reserved(QueueFull):
    """A new job refused under the disk reserve (the queue still writes: not a failure)."""


class RetryQueue(QueueCore[SqliteStore]):
    """The durable retry queue. Open it with :meth:`open`; close it with :meth:`close`."""

    def __init__(self, path: Path, store: SqliteStore, *, backoff: BackoffPolicy,
                 clock: Callable[[], float], boot_id: str, rng: random.Random,
                 on_enqueue: Callable[[], None], reserve_bytes: int | None = None) -> None:
        super().__init__(store, backoff=backoff, clock=clock, boot_id=boot_id, rng=rng,
                         on_enqueue=on_enqueue)
        self.path = path
        # The last enqueue the disk refused, and when: other writes (the sweep's updates)
        # may still commit on a nearly full disk, so their success does not hide it.
        self._refused: tuple[str, float] | None = None
        # Room kept on the file system for claims, completions and checkpoints: new jobs
        # are refused below it (None: the default for the file system's size).
        self._reserve_setting = reserve_bytes
        self._space: tuple[float, int, int] | None = None  # (read at, free, reserve)
        self._checkpoint_failing = False
        # What finishing the acknowledged, unfinished jobs may still write: how many
        # (pending, leased, needs_operator) and their parameters' bytes. Counted at
        # open and kept as jobs come and finish (this file has one owner: this queue).
        self._owed_jobs = 0
        self._owed_bytes = 0

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        backoff: BackoffPolicy | None = None,
        clock: Callable[[], float] = time.time,
        boot_id: str | None = None,
        rng: random.Random | None = None,
        max_batch: int = 512,
        busy_timeout_ms: int = 5000,
        on_enqueue: Callable[[], None] | None = None,
        reserve_bytes: int | None = None,
    ) -> RetryQueue:
        """Open (creating or migrating) the queue at ``path`` and start its writer.

        ``on_enqueue`` is called (on the loop, after the COMMIT) whenever a job
        is enqueued or an operator makes one due: the sweep's ``wake``.
        ``reserve_bytes`` is the free space kept on the file system for the queue's
        own progress (claims, completions, checkpoints): an enqueue is refused with
        :class:`QueueFull` below it (None: :func:`default_reserve` of its size).
        Raises :class:`QueueCorrupt` for a file that is not a healthy capd
        queue (an empty file included), :class:`QueueFull` when the disk is
        full, and :class:`QueueStorageError` when it cannot be opened or a
        pragma did not take. None of them ever replaces the file.
        """
        db = await open_queue_file(path, synchronous=synchronous,
                                   busy_timeout_ms=busy_timeout_ms)
        store = SqliteStore(path, db, clock=clock, max_batch=max_batch)
        queue = cls(path, store, backoff=backoff or BackoffPolicy(), clock=clock,
                    boot_id=boot_id or os.urandom(6).hex(), rng=rng or random.Random(),
                    on_enqueue=on_enqueue or (lambda: None), reserve_bytes=reserve_bytes)
        rows = await store.fetch("owed")
        queue._owe(int(rows[0]["b"] or 0), int(rows[0]["n"]))
        return queue

    REFUSAL_REPORTED_S = 60.0
    """How long a refused enqueue is reported when no enqueue has succeeded since."""

    @property
    def write_error(self) -> str | None:
        """Why the queue cannot write (``"disk full: …"`` if so), or None.

        The last group commit's failure until one succeeds; and the last refused
        enqueue until an enqueue succeeds (at most :attr:`REFUSAL_REPORTED_S`): a
        nearly full disk may still take the sweep's updates while it refuses new jobs.
        """
        if self._store.write_error is not None:
            return self._store.write_error
        if self._refused is not None:
            message, at = self._refused
            if self._clock() - at <= self.REFUSAL_REPORTED_S:
                return message
            self._refused = None
        return None

    async def _store_job(self, request: EnqueueRequest, new: Job, row: tuple[Any, ...]) -> Job:
        try:
            job = await super()._store_job(request, new, row)
        except QueueStorageError as exc:
            if not isinstance(exc, _Reserved):  # under the reserve is a warning of its own
                self._refused = (str(exc), self._clock())
            raise
        if job is new:  # a row was stored (a key already used stores nothing, proves nothing)
            self._refused = None
        return job

    FINISH_BYTES_PER_JOB = 16 << 10
    """What finishing one acknowledged job may write at most besides its parameters: its
    claim and its completion (the pages they change, in the write-ahead log until a
    checkpoint) and its trail's rows. Each also rewrites its parameters twice."""

    def _owe(self, params_bytes: int, jobs: int) -> None:
        self._owed_jobs = max(0, self._owed_jobs + jobs)
        self._owed_bytes = max(0, self._owed_bytes + params_bytes * (1 if jobs >= 0 else -1))

    @property
    def owed_bytes(self) -> int:
        """What finishing every acknowledged, unfinished job may still write (an upper
        bound): kept free beside the reserve, so new jobs never take it."""
        return self._owed_jobs * self.FINISH_BYTES_PER_JOB + 2 * self._owed_bytes

    SPACE_READ_S = 0.05
    """How long a reading of the file system's free space is reused (an enqueue's cost)."""

    def space(self) -> tuple[int, int] | None:
        """Bytes free on the queue's file system, and what is kept for its progress: the
        reserve, and what finishing the jobs already acknowledged may write."""
        free, reserve = self._space_now()
        return free, reserve + self.owed_bytes

    def _space_now(self) -> tuple[int, int]:
        now = time.monotonic()
        if self._space is None or now - self._space[0] > self.SPACE_READ_S:
            try:
                free, total = free_space(self.path.parent)
            except OSError as exc:
                raise storage_error(self.path, "cannot read the free space of", exc) from exc
            reserve = (self._reserve_setting if self._reserve_setting is not None
                       else default_reserve(total))
            self._space = (now, free, reserve)
        return self._space[1], self._space[2]

    def _check_room(self) -> None:
        free, reserve = self._space_now()
        owed = self.owed_bytes
        if free < reserve + owed:
            raise _Reserved(
                f"disk nearly full: {free / 2**20:.1f} MiB free on the file system of "
                f"{self.path}, under the {reserve / 2**20:.1f} MiB reserve "
                f"(queue_reserve_bytes) plus the {owed / 2**20:.1f} MiB that finishing the "
                f"{self._owed_jobs} job(s) already queued may need; free some space")

    async def checkpoint(self, mode: Literal["PASSIVE", "TRUNCATE"] = "TRUNCATE") -> None:
        """Fold the write-ahead log back into the file (``TRUNCATE``: and empty it); between
        two group commits, never inside one. A busy or full disk leaves it for next time."""
        try:
            await self._store.read(f"PRAGMA wal_checkpoint({mode})")
        except QueueStorageError as exc:
            if not self._checkpoint_failing:  # said once, until one succeeds again
                log.warning("queue_checkpoint_failed", mode=mode, error=str(exc))
            self._checkpoint_failing = True
        else:
            self._checkpoint_failing = False

    @property
    def idle_s(self) -> float:
        """Seconds since the last group commit (by the monotonic clock)."""
        return self._store.idle_s

