"""The queue's one writer: concurrent transactions group-committed on one connection.

Every write is a ``BEGIN IMMEDIATE`` transaction on one aiosqlite connection,
run on its database thread (a lone ``INSERT`` is its own transaction, without
the BEGIN and COMMIT statements). A caller hands in a ``work`` function, which runs
on that thread inside the transaction, or one row for an ``INSERT``
(:meth:`GroupCommit.insert`); whatever is waiting when the thread turns to the
queue goes into one transaction (one COMMIT, one fsync), consecutive rows for
the same statement as one ``executemany``, and each caller's future resolves
only after that COMMIT. Only that thread opens transactions, and only between
two batches, so no two interleave on the connection.

The database thread picks the next batch up itself, as soon as the previous
one has committed: nothing waits for the event loop between two batches, and
a lone caller's transaction starts at once, without waiting for company. The
loop hears of each batch once, when it is committed: one callback answers all
of its callers.

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
import itertools
import operator
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from queue import SimpleQueue
from typing import Any, TypeVar, cast

import aiosqlite
import structlog

from ._errors import QueueClosed, QueueError
from ._queue_file import is_disk_full, storage_error

log = structlog.get_logger("capd.queue")

T = TypeVar("T")

# One operation waiting for its group commit: (sql, row, result, future) for a row
# to insert, answered with ``result``; (None, work, None, future) for a ``work``.
_Op = tuple[str | None, Any, Any, "asyncio.Future[Any]"]


class _NoAnswer:
    """Stands for the future aiosqlite's worker would answer: a drain answers its own callers."""

    def get_loop(self) -> _NoAnswer:
        return self

    def call_soon_threadsafe(self, *args: object) -> None:
        pass


_NO_ANSWER = _NoAnswer()


class GroupCommit:
    """Group-commits transactions on ``db``, the open queue file at ``path``.

    Make it on the running loop, whose callers it answers; :meth:`close`
    commits what was handed in and closes ``db``.
    """

    def __init__(self, path: Path, db: aiosqlite.Connection, *, clock: Callable[[], float],
                 max_batch: int) -> None:
        self.path = path
        self._db = db
        self._clock = clock
        self._max_batch = max_batch
        self._loop = asyncio.get_running_loop()
        # aiosqlite's own thread and its queue of work: a drain handed to it runs there
        # between aiosqlite's other calls (the reads), in order with them.
        self._to_db_thread = cast("SimpleQueue[Any]", db._tx)
        self._lock = threading.Lock()  # guards _pending and _scheduled across the threads
        self._pending: list[_Op] = []
        self._scheduled = False  # a drain is queued or running on the database thread
        self._closed = False
        self.batches = 0
        self.operations = 0
        # Why the last batch could not commit, and when (by ``clock``); None once one does.
        self.write_error: str | None = None
        self.write_error_at: float | None = None
        self._last_commit = time.monotonic()

    def transaction(self, work: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Run ``work`` inside the next group commit; the future of its result after the COMMIT.

        The future raises what ``work`` raised if it is a :class:`QueueError`,
        and :class:`QueueFull` or :class:`QueueStorageError` when the batch
        could not commit. Raises :class:`QueueClosed` after :meth:`close`.
        """
        return self._submit((None, work, None, self._loop.create_future()))

    def insert(self, sql: str, row: Sequence[Any], result: T) -> asyncio.Future[T]:
        """Run ``sql`` with ``row`` inside the next group commit; ``result`` once it commits.

        For an ``INSERT`` that cannot refuse: consecutive ones of the same
        ``sql`` in a batch are one ``executemany``. Fails as :meth:`transaction`.
        """
        return self._submit((sql, row, result, self._loop.create_future()))

    @property
    def idle_s(self) -> float:
        """Seconds since the last batch committed, or since this writer began."""
        return time.monotonic() - self._last_commit

    def _submit(self, op: _Op) -> asyncio.Future[Any]:
        if self._closed:
            raise QueueClosed("the retry queue is closed")
        with self._lock:
            self._pending.append(op)
            if self._scheduled:
                return op[3]
            self._scheduled = True
        self._to_db_thread.put_nowait((_NO_ANSWER, self._drain))
        return op[3]

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
        while True:
            # Behind every drain queued so far; their answers reach the loop before ours.
            await self._in_db_thread(lambda conn: None)
            with self._lock:
                if not self._scheduled:
                    break
        await self._db.close()

    def _drain(self) -> None:
        """Commit one batch of what is waiting (on the database thread); queue the next drain."""
        with self._lock:
            batch = self._pending
            if len(batch) > self._max_batch:
                self._pending = batch[self._max_batch:]
                del batch[self._max_batch:]
            else:
                self._pending = []
        try:
            if batch:
                try:
                    results = self._run_batch(self._db._conn, batch)
                except BaseException as exc:  # every caller must hear of it; none may hang
                    self._answer(self._fail, batch, exc)
                else:
                    self._answer(self._settle, batch, results)
        finally:
            with self._lock:
                if self._pending:  # behind the reads queued meanwhile: they are not starved
                    self._to_db_thread.put_nowait((_NO_ANSWER, self._drain))
                else:
                    self._scheduled = False

    def _answer(self, callback: Callable[..., None], *args: Any) -> None:
        # Answer the callers from the database thread as soon as the COMMIT is done:
        # one loop callback for the whole batch.
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting
            self._loop.call_soon_threadsafe(callback, *args)

    def _settle(self, batch: Sequence[_Op], results: Sequence[Any]) -> None:
        """Answer each operation of a committed batch (on the event loop)."""
        self._last_commit = time.monotonic()
        self.batches += 1
        self.operations += len(batch)
        if self.write_error is not None:
            log.info("queue_writable_again", path=str(self.path), failed_at=self.write_error_at)
            self.write_error = self.write_error_at = None
        for (*_, future), outcome in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(outcome, QueueError):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def _fail(self, batch: Sequence[_Op], exc: BaseException) -> None:
        """Fail every operation of a batch that could not commit (on the event loop)."""
        message = str(storage_error(self.path, "could not commit to", exc))
        self.write_error, self.write_error_at = message, self._clock()
        log.error("queue_commit_failed", error=repr(exc), disk_full=is_disk_full(exc),
                  operations=len(batch))
        for *_, future in batch:
            if not future.done():
                # One exception object per caller: each raise adds to its own traceback.
                error = storage_error(self.path, "could not commit to", exc)
                error.__cause__ = exc
                future.set_exception(error)

    @staticmethod
    def _run_batch(db: sqlite3.Connection, batch: Sequence[_Op]) -> list[Any]:
        """Run every operation of ``batch`` in one transaction: one COMMIT, one fsync.

        An operation that refuses (a :class:`QueueError` such as an idempotency
        conflict) raises before it writes anything, so it is answered alone
        and the others still commit. Any database error rolls back the batch
        and is raised as it came, whether or not SQLite had rolled back itself.
        A batch of one row to insert is that one statement in autocommit mode:
        its own transaction, committed (and fsynced) before it returns.
        """
        if len(batch) == 1:
            sql, row, result, _ = batch[0]
            if sql is not None:
                db.execute(sql, row)
                return [result]
        db.execute("BEGIN IMMEDIATE")
        results: list[Any] = []
        try:
            for sql, group in itertools.groupby(batch, key=operator.itemgetter(0)):
                run = list(group)
                if sql is not None:
                    db.executemany(sql, [op[1] for op in run])
                    results.extend([op[2] for op in run])
                    continue
                for _, work, _, _ in run:
                    try:
                        results.append(work(db))
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
        # hook its own methods use. Handing it a whole function makes one thread hop
        # for it instead of one per statement.
        conn: sqlite3.Connection = self._db._conn
        result: T = await self._db._execute(fn, conn)  # type: ignore[no-untyped-call]
        return result
