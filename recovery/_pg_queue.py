"""The retry queue in PostgreSQL, for a fleet: several daemons, one queue.

:class:`PgRetryQueue` is the job logic of ``_job_queue`` (that of
:class:`RetryQueue`) over :class:`PgStore`, which runs each script in a
transaction on a pooled connection. What a shared queue changes:

- claims take due rows ``FOR UPDATE SKIP LOCKED``: two daemons never claim the
  same job, and neither waits for the other's rows;
- a daemon claims only jobs of capabilities it knows (``claim_due(only=…)``): a
  fleet whose hosts declare different capabilities shares one queue;
- a lease outlives the host that took it: no daemon releases another's leases at
  its start (a lost host's jobs come back when their leases run out);
- the database may be unreachable, at the start or later: the daemon serves,
  an enqueue answers NOT queued (:class:`QueueStorageError`), ``write_error``
  says why (``/health`` fails), and everything resumes when it answers again.

psycopg 3 (async) with its connection pool; plain SQL migrations, versioned in
:data:`PG_MIGRATIONS` like the SQLite schema, applied under an advisory lock so
that daemons starting together migrate once. Times are the daemons' clocks
(seconds since the epoch, as in SQLite): keep the hosts' clocks in step (NTP).
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from ._decision import BackoffPolicy
from ._errors import QueueClosed, QueueStorageError
from ._job_queue import QueueCore, Result, Script, Sql
from ._jobs import EnqueueRequest, Job
from ._queries import queries

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

log = structlog.get_logger("capd.queue")

T = TypeVar("T")

PG_SCHEMA_VERSION = 2
PG_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE capd_jobs (
        id TEXT PRIMARY KEY,
        capability TEXT NOT NULL,
        params TEXT NOT NULL,
        idempotency_key TEXT UNIQUE,
        policy TEXT NOT NULL CHECK (policy IN ('manual', 'replay', 'verify_first')),
        state TEXT NOT NULL CHECK (state IN ('pending', 'leased', 'done', 'partial',
                                             'needs_operator', 'dead', 'cancelled')),
        attempts INTEGER NOT NULL DEFAULT 0,
        max_attempts INTEGER NOT NULL,
        next_run_at DOUBLE PRECISION NOT NULL,
        lease_until DOUBLE PRECISION,
        fence BIGINT NOT NULL DEFAULT 0,
        boot_id TEXT,
        first_sent_at DOUBLE PRECISION NOT NULL,
        timeout_s DOUBLE PRECISION NOT NULL,
        last_error TEXT,
        error_class TEXT,
        first_error TEXT,
        first_error_class TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        retried_at DOUBLE PRECISION
    );
    CREATE INDEX capd_jobs_due ON capd_jobs (state, next_run_at);
    CREATE TABLE capd_attempts (
        id BIGSERIAL PRIMARY KEY,
        job_id TEXT NOT NULL REFERENCES capd_jobs (id) ON DELETE CASCADE,
        at DOUBLE PRECISION NOT NULL,
        kind TEXT NOT NULL,
        fence BIGINT,
        boot_id TEXT,
        outcome TEXT,
        detail TEXT
    );
    CREATE INDEX capd_attempts_job ON capd_attempts (job_id, id);
    """,
    # Finished jobs by when they finished: the retention pass reads only what expired.
    2: """
    CREATE INDEX capd_jobs_finished ON capd_jobs (state, updated_at);
    """,
}
"""The schema by version; ``capd_schema`` holds the version a database is at."""

_PSYCOPG: tuple[Any, Any] = (None, None)
"""psycopg and the pool's timeout error, imported once a queue opens (never before)."""

_MIGRATION_LOCK = 0x63617064  # "capd": the advisory lock migrations run under
_SQL = queries("postgresql")


def _where(url: str) -> str:
    """The database of ``url`` for people: ``postgresql://HOST/DBNAME``, never a password."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(url)
    except Exception:
        return "postgresql (the configured database)"
    return f"postgresql://{parts.get('host', 'localhost')}/{parts.get('dbname', '')}"


def _connection_lost(error: QueueStorageError) -> bool:
    """Whether ``error`` is a connection that broke (the statement may or may not have
    committed), not a refusal."""
    psycopg = _PSYCOPG[0]
    cause = error.__cause__
    return psycopg is not None and isinstance(cause, psycopg.OperationalError | \
                                              psycopg.InterfaceError)


def _newer(version: int) -> QueueStorageError:
    return QueueStorageError(f"the queue's database has schema version {version}, newer than "
                             f"this capd understands ({PG_SCHEMA_VERSION}); upgrade capd")


class _Rows(list[Any]):
    """A statement's rows, fetched, and how many it changed."""

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        super().__init__(rows)
        self.rowcount = rowcount

    def close(self) -> None:
        pass


class PgStore:
    """The queue's database through a psycopg pool: scripts in transactions, the schema
    made or migrated at the first operation that reaches it, failures as
    :class:`QueueStorageError` (a write's kept in ``write_error`` until one succeeds)."""

    shared = True  # other daemons claim from it too

    def __init__(self, url: str, pool: AsyncConnectionPool, clock: Callable[[], float] | None
                 ) -> None:
        self.url = url
        self.where = _where(url)  # what stats and logs name as the queue's place
        self._pool = pool
        # Every daemon's times (due, leases) are the database's clock: this host's clock
        # plus the offset measured at each (re)connection. A host running ahead would
        # otherwise take back a lease another still holds, and a job would run twice.
        self._offset = 0.0
        self.clock: Callable[[], float] = clock or (lambda: time.time() + self._offset)
        self._migrated = False
        self._closed = False
        self.write_error: str | None = None
        self.write_error_at: float | None = None
        self.batches = 0
        self.operations = 0

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._pool.close()

    async def measure_clock(self, conn: AsyncConnection[Any]) -> None:
        """How far this host's clock is from the database's (at each new connection)."""
        before = time.time()
        row = await (await conn.execute(
            "SELECT extract(epoch from clock_timestamp())::float8 AS now")).fetchone()
        after = time.time()
        if row is not None:
            self._offset = float(row["now"]) - (before + after) / 2

    async def ensure_schema(self) -> None:
        """Make or migrate the schema, once, under an advisory lock (daemons starting
        together migrate once)."""
        if self._migrated:
            return

        async def migrate(conn: AsyncConnection[Any]) -> None:
            async with conn.transaction():
                found = await (await conn.execute(
                    "SELECT to_regclass('capd_schema') IS NOT NULL AS made")).fetchone()
                # reading needs no CREATE right
                at = await self._version(conn) if found is not None and found["made"] else 0
                if at >= PG_SCHEMA_VERSION:
                    if at > PG_SCHEMA_VERSION:
                        raise _newer(at)
                    return
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
                await conn.execute("CREATE TABLE IF NOT EXISTS capd_schema (version INTEGER "
                                   "NOT NULL)")
                at = await self._version(conn)
                if at > PG_SCHEMA_VERSION:
                    raise _newer(at)
                for target in range(at + 1, PG_SCHEMA_VERSION + 1):
                    await conn.execute(PG_MIGRATIONS[target])
                    await conn.execute("INSERT INTO capd_schema (version) VALUES (%s)",
                                       (target,))
                    log.info("queue_migrated", database=self.where, version=target)

        await self._on_connection(migrate, migrating=True)
        self._migrated = True

    async def _on_connection(self, work: Callable[[AsyncConnection[Any]], Awaitable[T]], *,
                             migrating: bool = False, writes: bool = False) -> T:
        """``work`` on a pooled connection; database failures as :class:`QueueStorageError`
        (kept in ``write_error`` for a write until one succeeds)."""
        psycopg, PoolTimeout = _PSYCOPG  # the modules, imported at open
        if self._closed:
            raise QueueClosed("the retry queue is closed")
        try:
            if not migrating:
                await self.ensure_schema()
            try:
                async with self._pool.connection() as conn:
                    result = await work(conn)
            except PoolTimeout as exc:
                raise QueueStorageError(
                    f"the queue's database ({self.where}) cannot be used: no connection "
                    f"within {self._pool.timeout:g} s (it does not answer, or all "
                    f"{self._pool.max_size} are busy: queue_pool_size)") from exc
            except psycopg.Error as exc:  # refused rights, a read-only server, gone away...
                raise QueueStorageError(
                    f"the queue's database ({self.where}) cannot be used: "
                    f"{type(exc).__name__}: {str(exc).strip() or 'no detail'}") from exc
        except QueueStorageError as exc:
            if writes:
                if self.write_error is None:
                    log.error("queue_database_failed", error=str(exc))
                self.write_error, self.write_error_at = str(exc), self.clock()
            raise
        if writes:
            if self.write_error is not None:
                log.info("queue_writable_again", database=self.where,
                         failed_at=self.write_error_at)
            self.write_error = self.write_error_at = None
            self.batches += 1
        return result

    async def run(self, script: Script[T]) -> T:
        async def work(conn: AsyncConnection[Any]) -> T:
            async with conn.transaction():
                statement = next(script)
                while True:
                    try:
                        statement = script.send(await self._execute(conn, statement))
                    except StopIteration as done:
                        result: T = done.value
                        return result

        return await self._on_connection(work, writes=True)

    @staticmethod
    async def _execute(conn: AsyncConnection[Any], statement: Sql) -> Result:
        async with conn.cursor() as cursor:
            if statement.many:
                await cursor.executemany(_SQL[statement.name], statement.args)
            else:
                await cursor.execute(_SQL[statement.name], statement.args)
            rows = await cursor.fetchall() if cursor.description is not None else []
            return _Rows(rows, cursor.rowcount)

    async def add(self, row: tuple[Any, ...], job: Job) -> Job:
        async def work(conn: AsyncConnection[Any]) -> Job:
            await conn.execute(_SQL["insert"], row)  # one statement: its own transaction
            return job

        return await self._on_connection(work, writes=True)

    async def fetch(self, name: str, args: Any = ()) -> list[Any]:
        async def read(conn: AsyncConnection[Any]) -> list[Any]:
            return list(await (await conn.execute(_SQL[name], args)).fetchall())

        return await self._on_connection(read)

    async def integrity_check(self) -> str:
        """'ok' when the database answers and holds capd's schema."""
        version = await self._on_connection(self._version)
        return "ok" if version == PG_SCHEMA_VERSION else f"schema version {version}"

    @staticmethod
    async def _version(conn: AsyncConnection[Any]) -> int:
        """The schema version the database is at (0: none)."""
        row = await (await conn.execute("SELECT max(version) AS v FROM capd_schema")).fetchone()
        return int(row["v"]) if row and row["v"] is not None else 0


class PgRetryQueue(QueueCore[PgStore]):
    """The durable retry queue in PostgreSQL. Open it with :meth:`open`."""

    @classmethod
    async def open(cls, url: str, *, backoff: BackoffPolicy | None = None,
                   clock: Callable[[], float] | None = None, boot_id: str | None = None,
                   rng: random.Random | None = None, pool_size: int = 16,
                   on_enqueue: Callable[[], None] | None = None,
                   connect_timeout_s: float = 5.0) -> PgRetryQueue:
        """A queue on the database at ``url`` (``postgresql://…``). Never fails for a
        database that does not answer yet: the pool keeps trying, and each operation
        raises :class:`QueueStorageError` until it answers (the schema is made or
        migrated at the first that does)."""
        global _PSYCOPG
        try:
            import psycopg
            from psycopg.rows import dict_row
            from psycopg_pool import AsyncConnectionPool, PoolTimeout
        except ImportError as exc:
            raise QueueStorageError(
                "queue_url names a PostgreSQL queue, but psycopg is not installed: pip install "
                "'capd[postgres]'") from exc

        _PSYCOPG = (psycopg, PoolTimeout)
        # The pool would log each failed reconnection; the queue says it once (write_error,
        # /health, queue_database_failed) and again when it is back.
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
        store: PgStore | None = None

        async def configure(conn: AsyncConnection[Any]) -> None:
            if store is not None:
                await store.measure_clock(conn)

        pool = AsyncConnectionPool(
            url, min_size=1, max_size=pool_size, open=False, timeout=connect_timeout_s,
            kwargs={"autocommit": True, "row_factory": dict_row,
                    "connect_timeout": max(1, int(connect_timeout_s))},
            # A connection attempt backs off (1 s, 2 s, 4 s...) for 20 s at most, then the
            # next operation starts a fresh one: the queue resumes soon after the database.
            name="capd-queue", reconnect_timeout=20.0, configure=configure,
            # a connection the server dropped (a restart) is found before it is used
            check=AsyncConnectionPool.check_connection)
        store = PgStore(url, pool, clock)
        queue = cls(store, backoff=backoff or BackoffPolicy(), clock=store.clock,
                    boot_id=boot_id or os.urandom(6).hex(), rng=rng or random.Random(),
                    on_enqueue=on_enqueue or (lambda: None))
        await pool.open(wait=False)
        try:
            await store.ensure_schema()
        except QueueStorageError as exc:  # not there yet: the first operation that can, will
            log.warning("queue_database_unreachable", error=str(exc))
        return queue

    @property
    def url(self) -> str:
        return self._store.url

    async def _store_job(self, request: EnqueueRequest, new: Job, row: tuple[Any, ...]) -> Job:
        try:
            stored = await super()._store_job(request, new, row)
        except QueueStorageError as exc:
            # The INSERT may have committed before the connection dropped: sending it again
            # (it lands once, by its id or its key) answers the caller the truth.
            if not _connection_lost(exc):
                raise
            stored = await super()._store_job(request, new, row)
        if stored is new:
            self._store.operations += 1
        return stored
