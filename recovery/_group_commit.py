"""The queue's one writer: concurrent transactions group-committed on one connection.

Every write is a ``BEGIN IMMEDIATE`` transaction on one aiosqlite connection.
A caller hands in a ``work`` function, which runs on the database thread
inside the transaction; the writer task that :class:`GroupCommit` owns
batches whatever is waiting into one transaction (one COMMIT, one fsync), and
each caller's future resolves only after that COMMIT. Only the writer task
opens transactions, so no two interleave on the connection.

A ``work`` that refuses with a :class:`QueueError` (an idempotency conflict)
raises before it writes anything: it is answered alone and the rest of its
batch still commits. A batch that cannot commit fails every one of its
callers with :class:`QueueFull` (a full disk: transient) or
:class:`QueueStorageError`, and the failure is kept in :attr:`write_error`
until a later batch commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
import structlog

from ._errors import QueueClosed, QueueError
from ._queue_file import is_disk_full, storage_error

log = structlog.get_logger("capd.queue")

T = TypeVar("T")


@dataclass
class _Pending:
    work: Callable[[sqlite3.Connection], Any]
    future: asyncio.Future[Any] = field(repr=False)


class GroupCommit:
    """Group-commits transactions on ``db``, the open queue file at ``path``.

    Make it on the running loop: it starts its writer task at once, and
    :meth:`close` ends that task and closes ``db``.
    """

    def __init__(self, path: Path, db: aiosqlite.Connection, *, clock: Callable[[], float],
                 max_batch: int) -> None:
        self.path = path
        self._db = db
        self._clock = clock
        self._max_batch = max_batch
        self._pending: list[_Pending] = []
        self._wakeup = asyncio.Event()
        self._closed = False
        self.batches = 0
        self.operations = 0
        # Why the last batch could not commit, and when (by ``clock``); None once one does.
        self.write_error: str | None = None
        self.write_error_at: float | None = None
        self._writer = asyncio.get_running_loop().create_task(self._write_loop())

    async def transaction(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` inside the next group commit; return its result after the COMMIT.

        Raises what ``work`` raised if it is a :class:`QueueError`,
        :class:`QueueFull` or :class:`QueueStorageError` when the batch could
        not commit, and :class:`QueueClosed` after :meth:`close`.
        """
        if self._closed:
            raise QueueClosed("the retry queue is closed")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(work, future))
        self._wakeup.set()
        return await future

    async def read(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """The rows of one statement, outside any batch; raises :class:`QueueStorageError`."""
        if self._closed:
            raise QueueClosed("the retry queue is closed")
        try:
            return await self._in_db_thread(lambda conn: conn.execute(sql, args).fetchall())
        except (sqlite3.Error, OSError) as exc:
            raise storage_error(self.path, "could not read", exc) from exc

    async def close(self) -> None:
        """Stop accepting, commit what was already handed in, and close the file."""
        if self._closed:
            return
        self._closed = True
        self._wakeup.set()
        await self._writer
        await self._db.close()

    async def _write_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                await self._commit_batch(batch)
            if self._closed:
                return

    async def _commit_batch(self, batch: Sequence[_Pending]) -> None:
        loop = asyncio.get_running_loop()

        def commit_and_settle(conn: sqlite3.Connection) -> None:
            # Answer the callers from the database thread as soon as the COMMIT is
            # done: they wake in the same loop turn as this writer, not one later.
            results = self._run_batch(conn, batch)
            loop.call_soon_threadsafe(self._settle, batch, results)

        try:
            await self._in_db_thread(commit_and_settle)
        except Exception as exc:  # every caller of the batch must hear of it; none may hang
            message = str(storage_error(self.path, "could not commit to", exc))
            self.write_error, self.write_error_at = message, self._clock()
            log.error("queue_commit_failed", error=repr(exc), disk_full=is_disk_full(exc),
                      operations=len(batch))
            for item in batch:
                if not item.future.done():
                    # One exception object per caller: each raise adds to its own traceback.
                    error = storage_error(self.path, "could not commit to", exc)
                    error.__cause__ = exc
                    item.future.set_exception(error)

    def _settle(self, batch: Sequence[_Pending], results: Sequence[Any]) -> None:
        """Answer each operation of a committed batch (on the event loop)."""
        self.batches += 1
        self.operations += len(batch)
        if self.write_error is not None:
            log.info("queue_writable_again", path=str(self.path), failed_at=self.write_error_at)
            self.write_error = self.write_error_at = None
        for item, outcome in zip(batch, results, strict=True):
            if item.future.done():
                continue
            if isinstance(outcome, QueueError):
                item.future.set_exception(outcome)
            else:
                item.future.set_result(outcome)

    @staticmethod
    def _run_batch(db: sqlite3.Connection, batch: Sequence[_Pending]) -> list[Any]:
        """Run every operation of ``batch`` in one transaction: one COMMIT, one fsync.

        An operation that refuses (a :class:`QueueError` such as an idempotency
        conflict) raises before it writes anything, so it is answered alone
        and the others still commit. Any database error rolls back the batch
        and is raised as it came, whether or not SQLite had rolled back itself.
        """
        db.execute("BEGIN IMMEDIATE")
        results: list[Any] = []
        try:
            for item in batch:
                try:
                    results.append(item.work(db))
                except QueueError as exc:
                    results.append(exc)
            db.execute("COMMIT")
        except BaseException:
            # After SQLITE_FULL or SQLITE_IOERR SQLite may have rolled back already; a
            # ROLLBACK then fails ("no transaction is active") and would hide the cause.
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise
        return results

    async def _in_db_thread(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        # aiosqlite runs every statement on its one worker thread; _execute is the
        # hook its own methods use. Handing it a whole transaction makes one thread
        # hop per transaction instead of one per statement: that is what lets a
        # group commit of many jobs cost about one fsync.
        conn: sqlite3.Connection = self._db._conn
        result: T = await self._db._execute(fn, conn)  # type: ignore[no-untyped-call]
        return result
