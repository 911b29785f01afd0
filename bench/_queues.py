"""The queues bench/queue.py sets capd's beside: plain sqlite3, huey, persist-queue, litequeue.

Each is a class built on an empty folder (a fresh queue in it) with:
``pragmas()`` (journal_mode and synchronous read back from the library's own
connection), ``enqueue(n)`` (returns once the job is committed; safe from many
threads), ``cycle(batch, jobs)`` (jobs/s of enqueue → claim → complete, ``batch``
jobs per step, with the batching the library's API offers) and ``close()``.
Every one runs in WAL mode at ``synchronous=FULL``; where the library sets
something else, ``default`` says what it was.
"""

from __future__ import annotations

import json
import queue
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from capd.recovery._queue_file import MIGRATIONS

LINE = "x" * 64
SYNC_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def pragmas(conn: Any) -> str:
    """journal_mode and synchronous as ``conn`` (a library's own connection) has them."""
    journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    return f"journal_mode={journal} synchronous={SYNC_NAMES.get(sync, sync)}"


class PlainSqlite:
    """Plain sqlite3, capd's schema, one connection owned by one writer thread."""

    name = "plain sqlite3, one serialized writer"
    insert = ("INSERT INTO jobs (id, capability, params, policy, state, attempts, max_attempts,"
              " next_run_at, fence, boot_id, first_sent_at, timeout_s, created_at, updated_at)"
              " VALUES (?, 'bench.write', ?, 'replay', 'pending', 0, 8, ?, 0, 'b', ?, 5, ?, ?)")

    def __init__(self, folder: Path) -> None:
        self.conn = sqlite3.connect(folder / "plain.db", isolation_level=None,
                                    check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = FULL")
        self.conn.executescript(MIGRATIONS[1])
        self.inbox: queue.SimpleQueue[tuple[int, threading.Event] | None] = queue.SimpleQueue()
        self.writer = threading.Thread(target=self._write_loop)
        self.writer.start()
        self.counter = 0

    def _row(self, n: int) -> tuple[Any, ...]:
        self.counter += 1
        now = time.time()
        return (f"{time.time_ns():016x}{self.counter:08x}", json.dumps({"n": n, "line": LINE}),
                now, now, now, now)

    def _write_loop(self) -> None:
        while (item := self.inbox.get()) is not None:
            n, done = item
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute(self.insert, self._row(n))
            self.conn.execute("COMMIT")
            done.set()

    def pragmas(self) -> str:
        return pragmas(self.conn)

    def enqueue(self, n: int) -> None:
        done = threading.Event()
        self.inbox.put((n, done))
        done.wait()

    def cycle(self, batch: int, jobs: int) -> float:
        self.inbox.put(None)  # the cycle runs on this thread: one writer still
        self.writer.join()
        c = self.conn
        started = time.perf_counter()
        for first in range(0, jobs, batch):
            c.execute("BEGIN IMMEDIATE")
            c.executemany(self.insert, [self._row(first + i) for i in range(batch)])
            c.execute("COMMIT")
            now = time.time()
            c.execute("BEGIN IMMEDIATE")
            claimed = c.execute(
                "UPDATE jobs SET state = 'leased', attempts = attempts + 1, fence = fence + 1,"
                " lease_until = ? + timeout_s, updated_at = ? WHERE id IN (SELECT id FROM jobs"
                " WHERE state = 'pending' AND next_run_at <= ? ORDER BY next_run_at LIMIT ?)"
                " RETURNING id, fence", (now, now, now, batch)).fetchall()
            c.execute("COMMIT")
            c.execute("BEGIN IMMEDIATE")
            c.executemany("UPDATE jobs SET state = 'done', updated_at = ? WHERE id = ?"
                          " AND fence = ?", [(now, i, f) for i, f in claimed])
            c.execute("COMMIT")
        elapsed = time.perf_counter() - started
        done = c.execute("SELECT count(*) FROM jobs WHERE state = 'done'").fetchone()[0]
        assert done == jobs, (done, jobs)
        return jobs / elapsed

    def close(self) -> None:
        if self.writer.is_alive():
            self.inbox.put(None)
            self.writer.join()
        self.conn.close()


class Huey:
    """huey's SqliteHuey (fsync=True, WAL), results stored: the library's own worker steps."""

    name = "huey SqliteHuey(fsync=True)"

    def __init__(self, folder: Path) -> None:
        from huey import SqliteHuey

        self.huey = SqliteHuey("bench", filename=str(folder / "huey.db"), fsync=True,
                               journal_mode="wal", results=True)

        @self.huey.task()
        def write(n: int, line: str) -> bool:
            return True

        self.task = write

    def pragmas(self) -> str:
        return pragmas(self.huey.storage.conn)

    def enqueue(self, n: int) -> None:
        self.task(n, LINE)

    def cycle(self, batch: int, jobs: int) -> float:
        started = time.perf_counter()
        for first in range(0, jobs, batch):
            for i in range(batch):
                self.task(first + i, LINE)
            claimed = [self.huey.dequeue() for _ in range(batch)]
            for task in claimed:
                assert self.huey.execute(task) is True
        return jobs / (time.perf_counter() - started)

    def close(self) -> None:
        self.huey.storage.close()


class PersistQueue:
    """persist-queue's SQLiteAckQueue (put, get = lease, ack), synchronous set to FULL."""

    name = "persist-queue SQLiteAckQueue"

    def __init__(self, folder: Path) -> None:
        from persistqueue import SQLiteAckQueue

        self.q = SQLiteAckQueue(str(folder / "pq"), multithreading=True, auto_commit=True)
        self.default = pragmas(self.q._putter)
        for conn in {id(c): c for c in (self.q._putter, self.q._getter)}.values():
            conn.execute("PRAGMA synchronous = FULL")

    def pragmas(self) -> str:
        return f"put: {pragmas(self.q._putter)}; get: {pragmas(self.q._getter)}"

    def enqueue(self, n: int) -> None:
        self.q.put({"n": n, "line": LINE})

    def cycle(self, batch: int, jobs: int) -> float:
        started = time.perf_counter()
        for first in range(0, jobs, batch):
            for i in range(batch):
                self.q.put({"n": first + i, "line": LINE})
            claimed = [self.q.get(block=False, raw=True) for _ in range(batch)]
            for item in claimed:
                self.q.ack(id=item["pqid"])
        elapsed = time.perf_counter() - started
        assert self.q.acked_count() == jobs
        return jobs / elapsed

    def close(self) -> None:
        self.q.close()


class LiteQueue:
    """litequeue (put, pop = lease, done), synchronous raised from its NORMAL to FULL."""

    name = "litequeue"

    def __init__(self, folder: Path) -> None:
        from litequeue import LiteQueue as Lq

        self.q = Lq(str(folder / "lite.db"))
        self.default = pragmas(self.q.conn)
        self.q.conn.execute("PRAGMA synchronous = FULL")
        # One connection shared by the producer threads: sqlite3 is not to be used by
        # two threads at once on one connection, so they take turns, as a user must.
        self.lock = threading.Lock()

    def pragmas(self) -> str:
        return pragmas(self.q.conn)

    def enqueue(self, n: int) -> None:
        with self.lock:
            self.q.put(json.dumps({"n": n, "line": LINE}))

    def cycle(self, batch: int, jobs: int) -> float:
        started = time.perf_counter()
        for first in range(0, jobs, batch):
            with self.q.transaction("IMMEDIATE"):
                for i in range(batch):
                    self.q.put(json.dumps({"n": first + i, "line": LINE}))
            claimed = [self.q.pop() for _ in range(batch)]
            with self.q.transaction("IMMEDIATE"):
                for message in claimed:
                    self.q.done(message.message_id)
        elapsed = time.perf_counter() - started
        return jobs / elapsed

    def close(self) -> None:
        self.q.close()


PEERS: list[tuple[str, type[Any]]] = [("huey", Huey), ("persistqueue", PersistQueue),
                                      ("litequeue", LiteQueue)]
