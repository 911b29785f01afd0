"""The durable retry queue: jobs in one SQLite file, committed before they are acknowledged.

One aiosqlite connection in WAL mode with ``synchronous=FULL``; every write is
a ``BEGIN IMMEDIATE`` transaction taken under one :class:`asyncio.Lock`, so no
two transactions interleave on the connection. Enqueues are *group-committed*:
concurrent callers are batched into one transaction by a writer task the
queue owns, and each caller's future resolves only after that COMMIT.

Job states::

    pending ──claim──► leased ──complete──► done | partial
       ▲                 │
       └──retry_later────┤──permanent / exhausted──► dead | needs_operator
                         └──lease expired / daemon restart──► pending
    operator: retry (→ pending), cancel (→ cancelled), purge (terminal → gone)

Claiming bumps a fencing counter; completing is conditional on it, so a
worker whose lease was taken over cannot complete the job.

The file is only ever initialised by capd itself: a new queue is created and
migrated under a temporary name beside it and hard-linked into place, which
never replaces a file. Anything already at the path (an empty file, another
database, garbage) is refused with :class:`QueueCorrupt` and left as it is.

Storage failures are translated at this boundary: a full disk is
:class:`QueueFull` (the queue keeps serving reads and accepts writes again
once there is room), anything else :class:`QueueStorageError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import random
import sqlite3
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import aiosqlite
import orjson
import structlog
from pydantic import BaseModel, ConfigDict

from capd.registry import RetryPolicy

from ._errors import RecoveryError

log = structlog.get_logger("capd.queue")

T = TypeVar("T")

JobState = Literal["pending", "leased", "done", "partial", "needs_operator", "dead", "cancelled"]
JOB_STATES: tuple[JobState, ...] = (
    "pending", "leased", "done", "partial", "needs_operator", "dead", "cancelled")
TERMINAL: frozenset[str] = frozenset({"done", "partial", "dead", "cancelled"})

SCHEMA_VERSION = 1
MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        capability TEXT NOT NULL,
        params TEXT NOT NULL,
        idempotency_key TEXT,
        policy TEXT NOT NULL CHECK (policy IN ('manual', 'replay', 'verify_first')),
        state TEXT NOT NULL CHECK (state IN ('pending', 'leased', 'done', 'partial',
                                             'needs_operator', 'dead', 'cancelled')),
        attempts INTEGER NOT NULL DEFAULT 0,
        max_attempts INTEGER NOT NULL,
        next_run_at REAL NOT NULL,
        lease_until REAL,
        fence INTEGER NOT NULL DEFAULT 0,
        boot_id TEXT,
        first_sent_at REAL NOT NULL,
        timeout_s REAL NOT NULL,
        last_error TEXT,
        error_class TEXT,
        first_error TEXT,
        first_error_class TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX jobs_idempotency_key ON jobs (idempotency_key)
        WHERE idempotency_key IS NOT NULL;
    CREATE INDEX jobs_due ON jobs (state, next_run_at);
    CREATE TABLE attempts (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        fence INTEGER,
        boot_id TEXT,
        outcome TEXT,
        detail TEXT
    );
    CREATE INDEX attempts_job ON attempts (job_id, id);
    """,
}


# ------------------------------------------------------------------------- errors


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


# ------------------------------------------------------------------------- models


class Job(BaseModel):
    """One durable job, as stored."""

    model_config = ConfigDict(frozen=True)

    id: str
    capability: str
    params: dict[str, Any]
    idempotency_key: str | None
    policy: RetryPolicy
    state: JobState
    attempts: int
    max_attempts: int
    next_run_at: float
    lease_until: float | None
    fence: int
    boot_id: str | None
    first_sent_at: float
    timeout_s: float
    last_error: str | None
    error_class: str | None
    first_error: str | None = None
    first_error_class: str | None = None
    created_at: float
    updated_at: float


class Attempt(BaseModel):
    """One row of a job's audit trail."""

    model_config = ConfigDict(frozen=True)

    id: int
    job_id: str
    at: float
    kind: str
    fence: int | None
    boot_id: str | None
    outcome: str | None
    detail: str | None


class QueueStats(BaseModel):
    """A snapshot of the queue's counts."""

    model_config = ConfigDict(frozen=True)

    by_state: dict[str, int]
    oldest_pending_age_s: float | None
    next_due_at: float | None
    path: str


@dataclass(frozen=True)
class EnqueueRequest:
    """What the gateway asks the queue to keep."""

    capability: str
    params: dict[str, Any]
    policy: RetryPolicy
    timeout_s: float
    first_sent_at: float
    idempotency_key: str | None = None
    state: Literal["pending", "needs_operator"] = "pending"
    run_at: float | None = None
    error: str | None = None
    error_class: str | None = None
    max_attempts: int | None = None


@dataclass(frozen=True)
class BackoffPolicy:
    """Exponential back-off with full jitter, a cap, a maximum of attempts and of age."""

    base_s: float = 1.0
    factor: float = 2.0
    cap_s: float = 300.0
    max_attempts: int = 8
    max_age_s: float = 7 * 86400.0

    def delay_s(self, attempts: int, rng: random.Random) -> float:
        """Seconds to wait after the ``attempts``-th attempt failed (full jitter)."""
        ceiling = min(self.cap_s, self.base_s * self.factor ** max(0, attempts - 1))
        return rng.uniform(0.0, ceiling)


@dataclass
class _Pending:
    work: Callable[[sqlite3.Connection], Any]
    future: asyncio.Future[Any] = field(repr=False)


def _row_to_job(row: sqlite3.Row) -> Job:
    data = dict(row)
    data["params"] = json.loads(data["params"])
    return Job.model_validate(data)


def _is_disk_full(exc: BaseException) -> bool:
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_FULL:
            return True
        return "database or disk is full" in str(exc)
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _storage_error(path: Path, failed: str, exc: BaseException) -> QueueStorageError:
    """Translate ``exc`` from SQLite or the OS; ``failed`` reads "could not commit to" and the like.

    The caller raises the result ``from exc``.
    """
    if _is_disk_full(exc):
        return QueueFull(f"disk full: {failed} the queue {path} ({exc}); free space on its "
                         "filesystem — capd retries by itself, nothing needs restarting")
    return QueueStorageError(f"{failed} the queue {path}: {exc}")


def _open_error(path: Path, exc: sqlite3.Error) -> QueueStorageError:
    """Tell a file that is not a database (or a damaged one) from one that cannot be used now."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
        return QueueCorrupt(f"{path} is not a readable capd queue ({exc}); move it aside and "
                            "inspect it — capd never replaces it")
    return _storage_error(path, "cannot open", exc)


def _uri(path: Path, mode: Literal["rw", "rwc"]) -> str:
    # mode=rw never creates a file: only _create_queue_file may bring one into being.
    return f"{path.absolute().as_uri()}?mode={mode}"


def _queue_file_exists(path: Path) -> bool:
    """False when nothing is at ``path``; raise :class:`QueueCorrupt` for what cannot be a queue."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise _storage_error(path, "cannot look at", exc) from exc
    if not stat.S_ISREG(info.st_mode):
        raise QueueCorrupt(f"{path} is not a regular file: not a capd queue; move it aside "
                           "(capd never replaces it) and start capd again to create a new queue")
    if info.st_size == 0:
        wal = path.with_name(path.name + "-wal")
        hint = ""
        with contextlib.suppress(OSError):
            if wal.stat().st_size > 0:
                hint = f"; {wal} beside it is not empty and may hold jobs: keep the two together"
        raise QueueCorrupt(
            f"{path} is empty: not a capd queue; move it aside (capd never replaces it), restore "
            f"it from a backup if it held jobs, or start capd again to create a new queue{hint}")
    return True


def _discard_temporary(tmp: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{tmp}{suffix}")


def _install(tmp: Path, path: Path) -> bool:
    """Hard-link the finished ``tmp`` to ``path`` unless something is there; False if it was.

    ``tmp`` is gone afterwards either way. The folder is fsynced so the new
    name survives a power cut.
    """
    with contextlib.suppress(FileNotFoundError):
        if os.stat(f"{tmp}-wal").st_size > 0:  # only the main file is linked: it must be whole
            raise QueueStorageError(f"cannot create the queue {path}: the new file's WAL was "
                                    "not folded into it when it was closed")
    try:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # unlike rename, link never replaces what is at path
        except FileExistsError:
            return False
        finally:
            _discard_temporary(tmp)
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    except OSError as exc:
        raise _storage_error(path, "could not put in place", exc) from exc
    return True


def _params_text(params: dict[str, Any]) -> str:
    try:
        return orjson.dumps(params, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # what orjson cannot hold (an int past 64 bits) the json module can
        return json.dumps(params, sort_keys=True, separators=(",", ":"))


# -------------------------------------------------------------------------- queue


class RetryQueue:
    """The durable retry queue. Open it with :meth:`open`; close it with :meth:`close`."""

    def __init__(
        self,
        path: Path,
        db: aiosqlite.Connection,
        *,
        backoff: BackoffPolicy,
        clock: Callable[[], float],
        boot_id: str,
        rng: random.Random,
        max_batch: int,
    ) -> None:
        self.path = path
        self._db = db
        self.backoff = backoff
        self._clock = clock
        self.boot_id = boot_id
        self._rng = rng
        self._max_batch = max_batch
        self._pending: list[_Pending] = []
        self._wakeup = asyncio.Event()
        self._closed = False
        self._writer: asyncio.Task[None] | None = None
        self.on_enqueue: Callable[[], None] = lambda: None
        self.batches = 0
        self.batched_jobs = 0
        self._id_prefix = os.urandom(3).hex()
        self._id_counter = 0
        self._write_error: str | None = None
        self._write_error_at: float | None = None

    @property
    def write_error(self) -> str | None:
        """Why the last group commit failed (``"disk full: …"`` if so); None once one succeeds."""
        return self._write_error

    @property
    def write_error_at(self) -> float | None:
        """When (by the queue's clock) the last group commit failed; None while writes succeed."""
        return self._write_error_at

    def _new_id(self) -> str:
        # Time-ordered ids: new rows append to the primary-key B-tree instead of
        # landing at random places in it, which keeps big group commits cheap.
        self._id_counter = (self._id_counter + 1) % 0x1000000
        return f"{time.time_ns():016x}{self._id_prefix}{self._id_counter:06x}"

    # ------------------------------------------------------------- lifecycle

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
    ) -> RetryQueue:
        """Open (creating or migrating) the queue at ``path`` and start its writer.

        When nothing is at ``path``, a new queue is built beside it and linked
        into place (see :meth:`_create_queue_file`). Raises
        :class:`QueueCorrupt` for a file that is not a healthy capd queue (an
        empty file included), :class:`QueueFull` when the disk is full, and
        :class:`QueueStorageError` when it cannot be opened or a pragma did not
        take. None of them ever replaces the file.
        """
        try:
            await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
        except OSError as exc:
            raise _storage_error(path, "cannot create the folder of", exc) from exc
        if not await asyncio.to_thread(_queue_file_exists, path):
            await cls._create_queue_file(path, busy_timeout_ms)
            # Ours, or one another process linked first: the same checks either way.
            if not await asyncio.to_thread(_queue_file_exists, path):
                raise QueueStorageError(f"the queue {path} vanished as soon as it was created; "
                                        "is something else cleaning the state directory?")
        try:
            db = await aiosqlite.connect(_uri(path, "rw"), uri=True, isolation_level=None)
        except (sqlite3.Error, OSError) as exc:
            raise _storage_error(path, "cannot open", exc) from exc
        db.row_factory = sqlite3.Row
        try:
            await cls._inspect(db, path)  # reads only: a foreign file is refused untouched
            await cls._configure(db, path, synchronous, busy_timeout_ms)
            await cls._migrate(db, path)
        except BaseException:
            await db.close()
            raise
        queue = cls(path, db, backoff=backoff or BackoffPolicy(), clock=clock,
                    boot_id=boot_id or os.urandom(6).hex(), rng=rng or random.Random(),
                    max_batch=max_batch)
        queue._writer = asyncio.get_running_loop().create_task(queue._write_loop())
        return queue

    @staticmethod
    async def _configure(db: aiosqlite.Connection, path: Path, synchronous: str,
                         busy_timeout_ms: int) -> None:
        wanted = {"journal_mode": "wal", "synchronous": {"FULL": 2, "NORMAL": 1}[synchronous],
                  "busy_timeout": busy_timeout_ms, "foreign_keys": 1}
        try:
            await db.execute("PRAGMA journal_mode = WAL")
            await db.execute(f"PRAGMA synchronous = {synchronous}")
            await db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            await db.execute("PRAGMA foreign_keys = ON")
            actual = {}
            for name in wanted:
                row = await (await db.execute(f"PRAGMA {name}")).fetchone()
                actual[name] = row[0] if row else None
        except sqlite3.Error as exc:
            raise _open_error(path, exc) from exc
        if str(actual["journal_mode"]).lower() != "wal":
            raise QueueStorageError(
                f"the queue {path} could not switch to WAL (journal_mode is "
                f"{actual['journal_mode']}); put the state directory on a local filesystem"
            )
        for name in ("synchronous", "busy_timeout", "foreign_keys"):
            if actual[name] != wanted[name]:
                raise QueueStorageError(
                    f"the queue {path}: PRAGMA {name} is {actual[name]}, expected {wanted[name]}"
                )

    @classmethod
    async def _create_queue_file(cls, path: Path, busy_timeout_ms: int) -> None:
        """Build a migrated queue under a temporary name beside ``path``, then link it there.

        Nothing at ``path`` is ever replaced: when another process linked a
        queue first, ours is dropped and the caller opens theirs. Closing the
        temporary database before the link checkpoints its WAL into the main
        file, so the one file linked holds the whole schema. On any failure
        the temporary files are removed.
        """
        tmp = path.with_name(f"{path.name}.init-{os.getpid()}-{os.urandom(4).hex()}")
        try:
            try:
                db = await aiosqlite.connect(_uri(tmp, "rwc"), uri=True, isolation_level=None)
            except (sqlite3.Error, OSError) as exc:
                raise _storage_error(path, "cannot create", exc) from exc
            try:
                # Messages name the path the operator knows, not the temporary one.
                await cls._configure(db, path, "FULL", busy_timeout_ms)
                await cls._migrate(db, path)
                try:
                    row = await (await db.execute("PRAGMA wal_checkpoint(TRUNCATE)")).fetchone()
                except sqlite3.Error as exc:
                    raise _storage_error(path, "cannot create", exc) from exc
                if row is None or row[0] != 0:
                    raise QueueStorageError(f"cannot create the queue {path}: the new file's "
                                            "WAL could not be checkpointed")
            finally:
                await db.close()
            installed = await asyncio.to_thread(_install, tmp, path)
        except BaseException:
            # A few unlinks, done here and now: a second cancellation must not skip them.
            _discard_temporary(tmp)
            raise
        if installed:
            log.info("queue_created", path=str(path), version=SCHEMA_VERSION)
        else:
            log.info("queue_created_elsewhere", path=str(path))

    @staticmethod
    async def _inspect(db: aiosqlite.Connection, path: Path) -> None:
        """Refuse an existing file that is not a healthy capd queue, without writing to it.

        Only a file being created by :meth:`_create_queue_file` may start from
        schema version 0; an existing one at version 0, or one that claims a
        version but lacks the tables, is not a capd queue. A version newer than
        this capd knows is left for that capd (:class:`QueueStorageError`).
        """
        try:
            check = await (await db.execute("PRAGMA quick_check")).fetchone()
            row = await (await db.execute("PRAGMA user_version")).fetchone()
            tables = await (await db.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
                " AND name IN ('jobs', 'attempts')")).fetchone()
        except sqlite3.Error as exc:
            raise _open_error(path, exc) from exc
        if check is None or check[0] != "ok":
            raise QueueCorrupt(
                f"the queue {path} failed its integrity check ({check[0] if check else '?'});"
                " move it aside and inspect it with sqlite3 — capd never replaces it"
            )
        version = int(row[0]) if row else 0
        if version > SCHEMA_VERSION:
            raise QueueStorageError(
                f"the queue {path} has schema version {version}, newer than this capd "
                f"understands ({SCHEMA_VERSION}); upgrade capd"
            )
        if version == 0:
            raise QueueCorrupt(
                f"{path} is a SQLite database but not a capd queue (it has no capd schema); "
                "move it aside (capd never replaces it) and start capd again to create a new "
                "queue")
        if tables is None or tables[0] != 2:
            raise QueueCorrupt(
                f"{path} says it is capd queue schema version {version} but lacks its tables; "
                "move it aside and inspect it — capd never replaces it")

    @staticmethod
    async def _migrate(db: aiosqlite.Connection, path: Path) -> None:
        """Bring the schema to :data:`SCHEMA_VERSION`.

        Runs after :meth:`_inspect` (an existing file) or on a file being
        created, the only one that may start from version 0.
        """
        try:
            row = await (await db.execute("PRAGMA user_version")).fetchone()
        except sqlite3.Error as exc:
            raise _open_error(path, exc) from exc
        version = int(row[0]) if row else 0
        for target in range(version + 1, SCHEMA_VERSION + 1):
            try:
                await db.execute("BEGIN IMMEDIATE")
                try:
                    for statement in MIGRATIONS[target].split(";"):
                        if statement.strip():
                            await db.execute(statement)
                    await db.execute(f"PRAGMA user_version = {target}")
                    await db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:  # SQLite may have rolled back already (SQLITE_FULL)
                        with contextlib.suppress(sqlite3.Error):
                            await db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise _storage_error(path, "could not migrate", exc) from exc
            log.info("queue_migrated", path=str(path), version=target)

    async def close(self) -> None:
        """Stop accepting, commit what was already handed in, and close the file."""
        if self._closed:
            return
        self._closed = True
        self._wakeup.set()
        if self._writer is not None:
            await self._writer
        await self._db.close()

    # --------------------------------------------------------------- enqueue

    async def enqueue(self, request: EnqueueRequest) -> Job:
        """Store ``request`` durably and return its job once the COMMIT is done.

        With an idempotency key already used for the same capability and
        parameters, the existing job is returned; for other parameters,
        :class:`IdempotencyConflict` is raised. Raises :class:`QueueClosed`
        after :meth:`close`.
        """
        job: Job = await self._transaction(lambda conn: self._insert(conn, request))
        self.on_enqueue()
        return job

    def _insert(self, db: sqlite3.Connection, req: EnqueueRequest) -> Job:
        """Insert one job in the current transaction (runs on the database thread)."""
        key = req.idempotency_key
        if key is not None:
            row = db.execute("SELECT * FROM jobs WHERE idempotency_key = ?", (key,)).fetchone()
            if row is not None:
                existing = _row_to_job(row)
                if existing.capability != req.capability or existing.params != req.params:
                    raise IdempotencyConflict(
                        f"idempotency key {key!r} is already used by job {existing.id} for "
                        f"{existing.capability} with other parameters; use a new key")
                return existing
        now = self._clock()
        # Every field comes from a typed request: build without re-validating.
        job = Job.model_construct(
            id=self._new_id(), capability=req.capability, params=req.params,
            idempotency_key=key, policy=req.policy, state=req.state, attempts=0,
            max_attempts=req.max_attempts or self.backoff.max_attempts,
            next_run_at=req.run_at if req.run_at is not None else now, lease_until=None,
            fence=0, boot_id=self.boot_id, first_sent_at=req.first_sent_at,
            timeout_s=req.timeout_s, last_error=req.error, error_class=req.error_class,
            first_error=req.error, first_error_class=req.error_class,
            created_at=now, updated_at=now,
        )
        # The enqueue itself is recorded in the job row (created_at, first_error): one
        # insert per job, and attempts() shows it as the trail's first entry.
        db.execute(
            "INSERT INTO jobs (id, capability, params, idempotency_key, policy, state,"
            " attempts, max_attempts, next_run_at, lease_until, fence, boot_id,"
            " first_sent_at, timeout_s, last_error, error_class, first_error,"
            " first_error_class, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?, NULL, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (job.id, job.capability, _params_text(job.params), key, job.policy, job.state,
             job.max_attempts, job.next_run_at, job.boot_id, job.first_sent_at, job.timeout_s,
             job.last_error, job.error_class, job.last_error, job.error_class, now, now))
        return job

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
            message = str(_storage_error(self.path, "could not commit to", exc))
            self._write_error, self._write_error_at = message, self._clock()
            log.error("queue_commit_failed", error=repr(exc), disk_full=_is_disk_full(exc),
                      operations=len(batch))
            for item in batch:
                if not item.future.done():
                    # One exception object per caller: each raise adds to its own traceback.
                    error = _storage_error(self.path, "could not commit to", exc)
                    error.__cause__ = exc
                    item.future.set_exception(error)

    def _settle(self, batch: Sequence[_Pending], results: Sequence[Any]) -> None:
        """Answer each operation of a committed batch (on the event loop)."""
        self.batches += 1
        self.batched_jobs += len(batch)
        if self._write_error is not None:
            log.info("queue_writable_again", path=str(self.path), failed_at=self._write_error_at)
            self._write_error = self._write_error_at = None
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

    # ------------------------------------------------------------ transactions

    async def _in_db_thread(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        # aiosqlite runs every statement on its one worker thread; _execute is the
        # hook its own methods use. Handing it a whole transaction makes one thread
        # hop per transaction instead of one per statement: that is what lets a
        # group commit of many jobs cost about one fsync.
        conn: sqlite3.Connection = self._db._conn
        result: T = await self._db._execute(fn, conn)  # type: ignore[no-untyped-call]
        return result

    async def _transaction(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` inside the next group commit; return its result after the COMMIT."""
        if self._closed:
            raise QueueClosed("the retry queue is closed")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(work, future))
        self._wakeup.set()
        return await future

    async def _read(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        if self._closed:
            raise QueueClosed("the retry queue is closed")
        try:
            return await self._in_db_thread(lambda conn: conn.execute(sql, args).fetchall())
        except (sqlite3.Error, OSError) as exc:
            raise _storage_error(self.path, "could not read", exc) from exc

    def _audit(self, db: sqlite3.Connection, job_id: str, kind: str, fence: int | None,
               outcome: str | None, detail: str | None) -> None:
        db.execute(
            "INSERT INTO attempts (job_id, at, kind, fence, boot_id, outcome, detail)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (job_id, self._clock(), kind, fence, self.boot_id, outcome, detail))

    # ------------------------------------------------------------------ leases

    async def expire_previous_boot_leases(self) -> int:
        """At start-up: every lease held by another boot goes back to pending at once."""
        now = self._clock()
        count = await self._release_leases(
            "next_run_at = ?, updated_at = ? WHERE state = 'leased'"
            " AND (boot_id IS NULL OR boot_id != ?)", (now, now, self.boot_id),
            "held by a previous boot")
        if count:
            log.warning("orphaned_leases_recovered", jobs=count)
        return count

    async def requeue_expired_leases(self) -> int:
        """Leases past their deadline go back to pending (their worker is presumed gone)."""
        now = self._clock()
        return await self._release_leases(
            "updated_at = ? WHERE state = 'leased' AND lease_until < ?", (now, now),
            "lease ran out")

    async def _release_leases(self, tail: str, args: tuple[Any, ...], why: str) -> int:
        def work(db: sqlite3.Connection) -> int:
            cursor = db.execute(
                f"UPDATE jobs SET state = 'pending', lease_until = NULL, {tail}"
                " RETURNING id, fence", args)
            rows = cursor.fetchall()
            for row in rows:
                self._audit(db, row["id"], "lease_expired", row["fence"], "pending", why)
            return len(rows)

        count: int = await self._transaction(work)
        return count

    async def claim_due(self, limit: int, *, grace_s: float = 5.0) -> list[Job]:
        """Claim up to ``limit`` due jobs in one statement.

        Each claimed job's attempts are incremented *now* (a job that crashes the
        daemon every time still runs out of attempts), its fence bumped and its
        lease set to its timeout plus ``grace_s``. Due jobs that have already
        used every attempt, or are older than the maximum age, go to ``dead``.
        """
        now = self._clock()
        max_age = self.backoff.max_age_s

        def work(db: sqlite3.Connection) -> list[Job]:
            cursor = db.execute(
                "UPDATE jobs SET state = 'dead', updated_at = ?, last_error = coalesce("
                "last_error, '') || ' [gave up: ' || CASE WHEN attempts >= max_attempts THEN"
                " 'no attempts left' ELSE 'too old' END || ']' WHERE state = 'pending' AND"
                " next_run_at <= ? AND (attempts >= max_attempts OR created_at < ?)"
                " RETURNING id, fence, last_error", (now, now, now - max_age))
            for row in cursor.fetchall():
                self._audit(db, row["id"], "dead", row["fence"], "dead", row["last_error"])
            cursor = db.execute(
                "UPDATE jobs SET state = 'leased', attempts = attempts + 1, fence = fence + 1,"
                " lease_until = ? + timeout_s + ?, boot_id = ?, updated_at = ?"
                " WHERE id IN (SELECT id FROM jobs WHERE state = 'pending' AND next_run_at <= ?"
                " ORDER BY next_run_at LIMIT ?) RETURNING *",
                (now, grace_s, self.boot_id, now, now, limit))
            jobs = [_row_to_job(row) for row in cursor.fetchall()]
            if jobs:
                db.executemany(
                    "INSERT INTO attempts (job_id, at, kind, fence, boot_id, outcome, detail)"
                    " VALUES (?, ?, 'claim', ?, ?, NULL, ?)",
                    [(j.id, now, j.fence, self.boot_id, f"attempt {j.attempts}/{j.max_attempts}")
                     for j in jobs])
            return jobs

        jobs: list[Job] = await self._transaction(work)
        return jobs

    async def extend_lease(self, job: Job, lease_s: float) -> bool:
        """Push ``job``'s lease to now + ``lease_s`` if this worker still holds it."""
        now = self._clock()

        def work(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "UPDATE jobs SET lease_until = ?, updated_at = ? WHERE id = ? AND fence = ?"
                " AND state = 'leased'", (now + lease_s, now, job.id, job.fence))
            return cursor.rowcount == 1

        held: bool = await self._transaction(work)
        return held

    # ------------------------------------------------------------- completion

    async def record(self, job: Job, kind: str, outcome: str | None, detail: Any = None) -> None:
        """Append one row to ``job``'s audit trail (a call, a verification, …)."""
        text = detail if isinstance(detail, str) or detail is None else json.dumps(detail)

        def work(db: sqlite3.Connection) -> None:
            self._audit(db, job.id, kind, job.fence, outcome, text)

        await self._transaction(work)

    async def complete(self, job: Job, *, state: Literal["done", "partial"] = "done",
                       detail: str | None = None) -> bool:
        """Finish ``job`` if this worker's fence still holds; False when it was taken over."""
        return await self._finish(job, state, None, None, None, detail, "complete")

    async def retry_later(
        self,
        job: Job,
        *,
        error: str,
        error_class: str,
        retry_after_s: float | None = None,
        permanent: bool = False,
    ) -> Job | None:
        """Back ``job`` off, or give up on it; None when this worker's fence no longer holds.

        A permanent error sends it to ``dead`` (``needs_operator`` for policy
        manual); so does running out of attempts or age. Otherwise it is due
        again after the back-off delay, or ``retry_after_s`` if that is longer.
        """
        now = self._clock()
        exhausted = job.attempts >= job.max_attempts or now - job.created_at > (
            self.backoff.max_age_s)
        if permanent:
            state: JobState = "needs_operator" if job.policy == "manual" else "dead"
            next_run = now
        elif exhausted:
            state, next_run = "dead", now
        else:
            delay = self.backoff.delay_s(job.attempts, self._rng)
            state, next_run = "pending", now + max(delay, retry_after_s or 0.0)
        if await self._finish(job, state, next_run, error, error_class, error, "retry"):
            return job.model_copy(update={"state": state, "next_run_at": next_run,
                                          "last_error": error, "error_class": error_class})
        return None

    async def park(self, job: Job, *, reason: str, error_class: str = "needs_operator") -> bool:
        """Hand ``job`` to an operator (``needs_operator``), if this worker still holds it."""
        return await self._finish(job, "needs_operator", None, reason, error_class, reason,
                                  "park")

    async def postpone(self, job: Job, *, run_at: float, detail: str) -> bool:
        """Put a claimed ``job`` back to pending until ``run_at``, refunding its claim's attempt.

        For a job that must not run yet: an earlier attempt of it is still
        running in this process, so it can be neither verified nor replayed.
        The claim counted an attempt that was never made, so ``attempts``
        goes back down by one; the fence stays bumped. Returns False (and
        audits ``stale_worker``) when this worker's fence no longer holds.
        """
        return await self._finish(job, "pending", run_at, None, None, detail, "postpone",
                                  refund_attempt=True)

    async def _finish(self, job: Job, state: JobState, next_run: float | None,
                      error: str | None, error_class: str | None, detail: str | None,
                      kind: str, *, refund_attempt: bool = False) -> bool:
        now = self._clock()

        def work(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "UPDATE jobs SET state = ?, lease_until = NULL,"
                " next_run_at = coalesce(?, next_run_at), last_error = coalesce(?, last_error),"
                " error_class = coalesce(?, error_class), updated_at = ?,"
                " attempts = max(attempts - ?, 0)"
                " WHERE id = ? AND fence = ? AND state = 'leased'",
                (state, next_run, error, error_class, now, int(refund_attempt), job.id,
                 job.fence))
            if cursor.rowcount != 1:
                self._audit(db, job.id, "stale_worker", job.fence, "rejected",
                                  f"{kind} to {state} refused: fence {job.fence} no longer holds")
                return False
            self._audit(db, job.id, kind, job.fence, state, detail)
            return True

        held: bool = await self._transaction(work)
        if not held:
            log.warning("stale_worker_rejected", job=job.id, fence=job.fence, wanted=state)
        return held

    # ---------------------------------------------------------------- operator

    async def get(self, job_id: str) -> Job:
        """Return the job ``job_id``; raise :class:`UnknownJob`."""
        rows = await self._read("SELECT * FROM jobs WHERE id = ?", (job_id,))
        if not rows:
            raise UnknownJob(f"no job {job_id!r}; see `capd queue list`")
        return _row_to_job(rows[0])

    async def attempts(self, job_id: str) -> list[Attempt]:
        """The audit trail of ``job_id``, oldest first, starting with its enqueue."""
        job = await self.get(job_id)
        rows = await self._read("SELECT * FROM attempts WHERE job_id = ? ORDER BY id", (job_id,))
        enqueue = Attempt(id=0, job_id=job.id, at=job.created_at, kind="enqueue", fence=0,
                          boot_id=None, outcome=job.first_error_class, detail=job.first_error)
        return [enqueue, *(Attempt.model_validate(dict(r)) for r in rows)]

    async def list_jobs(self, state: str | None = None, limit: int = 100) -> list[Job]:
        """Jobs, newest first, optionally in one state."""
        if state is not None and state not in JOB_STATES:
            raise InvalidTransition(f"unknown state {state!r}; one of {', '.join(JOB_STATES)}")
        if state is None:
            rows = await self._read("SELECT * FROM jobs ORDER BY created_at DESC LIMIT ?",
                                    (limit,))
        else:
            rows = await self._read(
                "SELECT * FROM jobs WHERE state = ? ORDER BY created_at DESC LIMIT ?",
                (state, limit))
        return [_row_to_job(r) for r in rows]

    async def operator_retry(self, job_id: str) -> Job:
        """Make a parked, dead, cancelled or partial job due now, with at least one more attempt."""
        job = await self.get(job_id)
        if job.state not in ("needs_operator", "dead", "cancelled", "partial"):
            raise InvalidTransition(
                f"job {job_id} is {job.state}; only needs_operator, dead, cancelled or partial "
                "jobs can be retried")
        now = self._clock()

        def work(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE jobs SET state = 'pending', next_run_at = ?, updated_at = ?,"
                " max_attempts = max(max_attempts, attempts + 1), created_at = ?"
                " WHERE id = ? AND state = ?", (now, now, now, job_id, job.state))
            self._audit(db, job_id, "operator", job.fence, "pending",
                              f"retry requested (was {job.state})")

        await self._transaction(work)
        self.on_enqueue()
        return await self.get(job_id)

    async def cancel(self, job_id: str) -> Job:
        """Cancel a job that is not running or finished."""
        job = await self.get(job_id)
        if job.state not in ("pending", "needs_operator", "dead"):
            raise InvalidTransition(
                f"job {job_id} is {job.state}; only pending, needs_operator or dead jobs can be "
                "cancelled" + (" (it is running now: try again when it settles)"
                               if job.state == "leased" else ""))

        def work(db: sqlite3.Connection) -> None:
            db.execute("UPDATE jobs SET state = 'cancelled', updated_at = ? WHERE id = ?"
                             " AND state = ?", (self._clock(), job_id, job.state))
            self._audit(db, job_id, "operator", job.fence, "cancelled",
                              f"cancelled (was {job.state})")

        await self._transaction(work)
        return await self.get(job_id)

    async def purge(self, state: str, older_than_s: float) -> int:
        """Delete finished jobs in ``state`` not touched for ``older_than_s``; return how many."""
        if state not in TERMINAL:
            raise InvalidTransition(
                f"only finished jobs can be purged ({', '.join(sorted(TERMINAL))}), not {state!r}")
        cutoff = self._clock() - older_than_s

        def work(db: sqlite3.Connection) -> int:
            cursor = db.execute("DELETE FROM jobs WHERE state = ? AND updated_at < ?",
                                      (state, cutoff))
            return int(cursor.rowcount)

        count: int = await self._transaction(work)
        return count

    async def stats(self) -> QueueStats:
        """Counts by state, the oldest pending job's age and the next due time."""
        rows = await self._read("SELECT state, count(*) AS n FROM jobs GROUP BY state")
        by_state = dict.fromkeys(JOB_STATES, 0)
        by_state.update({r["state"]: r["n"] for r in rows})
        oldest = await self._read(
            "SELECT min(created_at) AS c, min(CASE WHEN state = 'pending' THEN next_run_at END)"
            " AS d FROM jobs WHERE state IN ('pending', 'leased')")
        created, due = (oldest[0]["c"], oldest[0]["d"]) if oldest else (None, None)
        return QueueStats(by_state=by_state,
                          oldest_pending_age_s=None if created is None else self._clock() - created,
                          next_due_at=due, path=str(self.path))

    async def next_wake_at(self) -> float | None:
        """When the sweep must next look: the earliest due job or lease deadline."""
        rows = await self._read(
            "SELECT min(CASE WHEN state = 'pending' THEN next_run_at END) AS d,"
            " min(CASE WHEN state = 'leased' THEN lease_until END) AS l FROM jobs"
            " WHERE state IN ('pending', 'leased')")
        values = [v for v in (rows[0]["d"], rows[0]["l"]) if v is not None] if rows else []
        return min(values) if values else None

    async def integrity_check(self) -> str:
        """``PRAGMA integrity_check``: 'ok' for a healthy file."""
        rows = await self._read("PRAGMA integrity_check")
        return str(rows[0][0]) if rows else "no answer"


def default_state_dir() -> Path:
    """``$CAPD_STATE_DIR``, else ``/var/lib/capd`` as root, else ``$XDG_STATE_HOME/capd``."""
    explicit = os.environ.get("CAPD_STATE_DIR")
    if explicit:
        return Path(explicit)
    if os.geteuid() == 0:
        return Path("/var/lib/capd")
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "capd"
