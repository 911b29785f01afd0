"""The retry queue in PostgreSQL, for a fleet: several daemons, one queue.

:class:`PgRetryQueue` has :class:`RetryQueue`'s API and semantics (see
``_queue``): a job is acknowledged after its COMMIT, a claim bumps a fencing
counter and finishing is conditional on it, every change is written with a row
of the audit trail in the same transaction, and time decisions come from the
same :meth:`BackoffPolicy.decide`. What a shared queue changes:

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

import json
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import structlog

from ._decision import BackoffPolicy
from ._errors import (
    IdempotencyConflict,
    QueueClosed,
    QueueStorageError,
    UnknownJob,
)
from ._jobs import (
    CURRENT_STATES_SQL,
    RETAINED_STATES_SQL,
    Attempt,
    EnqueueRequest,
    Job,
    JobState,
    QueueStats,
    changed_meanwhile,
    check_cancellable,
    check_listable,
    check_purgeable,
    check_retryable,
    decide_for,
    enqueue_entry,
    failure_of,
    job_from_row,
    job_of,
    operator_note,
    params_text,
    queue_stats,
)

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

_COLUMNS = ", ".join(Job.model_fields)
_INSERT_JOB = (
    "INSERT INTO capd_jobs (id, capability, params, idempotency_key, policy, state,"
    " attempts, max_attempts, next_run_at, lease_until, fence, boot_id,"
    " first_sent_at, timeout_s, last_error, error_class, first_error,"
    " first_error_class, created_at, updated_at)"
    " VALUES (%s, %s, %s, %s, %s, %s, 0, %s, %s, NULL, 0, %s, %s, %s, %s, %s, %s, %s, %s, %s)")
_INSERT_ATTEMPT = ("INSERT INTO capd_attempts (job_id, at, kind, fence, boot_id, outcome,"
                   " detail) VALUES (%s, %s, %s, %s, %s, %s, %s)")


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


def _unreachable(url: str, exc: BaseException) -> QueueStorageError:
    """A database error as the queue's storage error, naming the database without its
    password."""
    error = QueueStorageError(f"the queue's database ({_where(url)}) cannot be used: "
                              f"{type(exc).__name__}: {str(exc).strip() or 'no detail'}")
    error.__cause__ = exc
    return error


class PgRetryQueue:
    """The durable retry queue in PostgreSQL. Open it with :meth:`open`."""

    shared = True  # other daemons claim from it too

    def __init__(self, url: str, pool: AsyncConnectionPool, *, backoff: BackoffPolicy,
                 clock: Callable[[], float] | None, boot_id: str, rng: random.Random,
                 on_enqueue: Callable[[], None]) -> None:
        self.url = url
        self.where = _where(url)  # what stats and logs name as the queue's place
        self._pool = pool
        self.backoff = backoff
        # Every daemon's times (due, leases) are the database's clock: this host's clock
        # plus the offset measured at each (re)connection. A host running ahead would
        # otherwise take back a lease another still holds, and a job would run twice.
        self._offset = 0.0
        self._clock: Callable[[], float] = clock or (lambda: time.time() + self._offset)
        self.boot_id = boot_id
        self._rng = rng
        self._on_enqueue = on_enqueue
        self._id_low = int.from_bytes(os.urandom(3), "big") << 24
        self._id_counter = 0
        self._migrated = False
        self._closed = False
        self.write_error: str | None = None
        self.write_error_at: float | None = None
        self.batches = 0
        self.batched_jobs = 0

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
        queue: PgRetryQueue | None = None

        async def configure(conn: AsyncConnection[Any]) -> None:
            # each new connection measures how far this host's clock is from the database's
            if queue is not None:
                await queue._measure_clock(conn)

        pool = AsyncConnectionPool(
            url, min_size=1, max_size=pool_size, open=False, timeout=connect_timeout_s,
            kwargs={"autocommit": True, "row_factory": dict_row,
                    "connect_timeout": max(1, int(connect_timeout_s))},
            # A connection attempt backs off (1 s, 2 s, 4 s...) for 20 s at most, then the
            # next operation starts a fresh one: the queue resumes soon after the database.
            name="capd-queue", reconnect_timeout=20.0, configure=configure,
            # a connection the server dropped (a restart) is found before it is used
            check=AsyncConnectionPool.check_connection)
        queue = cls(url, pool, backoff=backoff or BackoffPolicy(), clock=clock,
                    boot_id=boot_id or os.urandom(6).hex(), rng=rng or random.Random(),
                    on_enqueue=on_enqueue or (lambda: None))
        await pool.open(wait=False)
        try:
            await queue._ensure_schema()
        except QueueStorageError as exc:  # not there yet: the first operation that can, will
            log.warning("queue_database_unreachable", error=str(exc))
        return queue

    async def close(self) -> None:
        """Stop accepting and close the pool (every transaction handed in has finished)."""
        if not self._closed:
            self._closed = True
            await self._pool.close()

    # ---------------------------------------------------------------- plumbing

    async def _measure_clock(self, conn: AsyncConnection[Any]) -> None:
        before = time.time()
        row = await (await conn.execute(
            "SELECT extract(epoch from clock_timestamp())::float8 AS now")).fetchone()
        after = time.time()
        if row is not None:
            self._offset = float(row["now"]) - (before + after) / 2

    async def _ensure_schema(self) -> None:
        if self._migrated:
            return

        async def migrate(conn: AsyncConnection[Any]) -> None:
            async with conn.transaction():
                found = await (await conn.execute(
                    "SELECT to_regclass('capd_schema') IS NOT NULL AS made")).fetchone()
                version = 0
                if found is not None and found["made"]:  # reading needs no CREATE right
                    row = await (await conn.execute(
                        "SELECT max(version) AS v FROM capd_schema")).fetchone()
                    version = int(row["v"]) if row and row["v"] is not None else 0
                if version >= PG_SCHEMA_VERSION:
                    if version > PG_SCHEMA_VERSION:
                        raise QueueStorageError(
                            f"the queue's database has schema version {version}, newer than "
                            f"this capd understands ({PG_SCHEMA_VERSION}); upgrade capd")
                    return
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
                await conn.execute("CREATE TABLE IF NOT EXISTS capd_schema (version INTEGER "
                                   "NOT NULL)")
                row = await (await conn.execute("SELECT max(version) AS v FROM capd_schema")
                             ).fetchone()
                version = int(row["v"]) if row and row["v"] is not None else 0
                if version > PG_SCHEMA_VERSION:
                    raise QueueStorageError(
                        f"the queue's database has schema version {version}, newer than this "
                        f"capd understands ({PG_SCHEMA_VERSION}); upgrade capd")
                for target in range(version + 1, PG_SCHEMA_VERSION + 1):
                    await conn.execute(PG_MIGRATIONS[target])
                    await conn.execute("INSERT INTO capd_schema (version) VALUES (%s)",
                                       (target,))
                    log.info("queue_migrated", database=self.where, version=target)

        await self._run(migrate, migrating=True)
        self._migrated = True

    async def _run(self, work: Callable[[AsyncConnection[Any]], Awaitable[T]], *,
                   migrating: bool = False, writes: bool = False) -> T:
        """``work`` on a pooled connection; database failures as :class:`QueueStorageError`
        (kept in ``write_error`` for a write until one succeeds)."""
        psycopg, PoolTimeout = _PSYCOPG  # the modules, imported at open
        if self._closed:
            raise QueueClosed("the retry queue is closed")
        if not migrating and not self._migrated:
            try:
                await self._ensure_schema()
            except QueueStorageError as exc:
                if writes:
                    self._write_failed(exc)
                raise
        try:
            async with self._pool.connection() as conn:
                result = await work(conn)
        except PoolTimeout as exc:
            error = QueueStorageError(
                f"the queue's database ({self.where}) cannot be used: no connection within "
                f"{self._pool.timeout:g} s (it does not answer, or all {self._pool.max_size} "
                "are busy: queue_pool_size)")
            if writes:
                self._write_failed(error)
            raise error from exc
        except psycopg.Error as exc:  # refused rights, a read-only server, gone away...
            error = _unreachable(self.url, exc)
            if writes:
                self._write_failed(error)
            raise error from exc
        if writes:
            if self.write_error is not None:
                log.info("queue_writable_again", database=self.where,
                         failed_at=self.write_error_at)
            self.write_error = self.write_error_at = None
            self.batches += 1
        return result

    def _write_failed(self, error: QueueStorageError) -> None:
        if self.write_error is None:
            log.error("queue_database_failed", error=str(error))
        self.write_error, self.write_error_at = str(error), self._clock()

    async def _transaction(self, work: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
        async def inside(conn: AsyncConnection[Any]) -> T:
            async with conn.transaction():
                return await work(conn)

        return await self._run(inside, writes=True)

    async def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        async def read(conn: AsyncConnection[Any]) -> list[dict[str, Any]]:
            return list(await (await conn.execute(sql, args)).fetchall())

        return await self._run(read)

    async def _audit(self, conn: AsyncConnection[Any], job_id: str, kind: str,
                     fence: int | None, outcome: str | None, detail: str | None) -> None:
        await conn.execute(_INSERT_ATTEMPT, (job_id, self._clock(), kind, fence, self.boot_id,
                                             outcome, detail))

    # ------------------------------------------------------------ enqueue

    def space(self) -> tuple[int, int] | None:
        """The database's disk is the database's to watch: None."""
        return None

    async def enqueue(self, request: EnqueueRequest) -> Job:
        """Store ``request`` durably and return its job once the COMMIT is done (as
        :meth:`RetryQueue.enqueue`). One autocommit statement, its own transaction: the
        INSERT (``ON CONFLICT DO NOTHING`` for a key); the job is built from the values
        sent, as the SQLite queue builds it."""
        now = self._clock()
        self._id_counter = (self._id_counter + 1) % 0x1000000
        job_id = f"{time.time_ns() << 48 | self._id_low | self._id_counter:028x}"
        req = request
        max_attempts = req.max_attempts or self.backoff.max_attempts
        run_at = now if req.run_at is None else req.run_at
        row = (job_id, req.capability, params_text(req.params), req.idempotency_key, req.policy,
               req.state, max_attempts, run_at, self.boot_id, req.first_sent_at, req.timeout_s,
               req.error, req.error_class, req.error, req.error_class, now, now)
        job = job_of({
            "id": job_id, "capability": req.capability, "params": req.params,
            "idempotency_key": req.idempotency_key, "policy": req.policy, "state": req.state,
            "attempts": 0, "max_attempts": max_attempts, "next_run_at": run_at,
            "lease_until": None, "fence": 0, "boot_id": self.boot_id,
            "first_sent_at": req.first_sent_at, "timeout_s": req.timeout_s,
            "last_error": req.error, "error_class": req.error_class, "first_error": req.error,
            "first_error_class": req.error_class, "created_at": now, "updated_at": now,
            "retried_at": None,
        })

        async def plain(conn: AsyncConnection[Any]) -> Job:
            # the id is ours: sent again after a connection dropped, it lands once
            await conn.execute(_INSERT_JOB + " ON CONFLICT (id) DO NOTHING", row)
            return job

        async def keyed(conn: AsyncConnection[Any]) -> Job:
            while True:
                inserted = await (await conn.execute(
                    _INSERT_JOB + " ON CONFLICT (idempotency_key) DO NOTHING RETURNING id",
                    row)).fetchone()
                if inserted is not None:
                    return job
                # The key is taken (by a committed job: the insert waited for any other):
                # its job, when it is the same call.
                found = await (await conn.execute(
                    f"SELECT {_COLUMNS} FROM capd_jobs WHERE idempotency_key = %s",
                    (req.idempotency_key,))).fetchone()
                if found is None:  # purged in between: the key is free again
                    continue
                existing = job_from_row(found)
                if existing.capability != req.capability or existing.params != req.params:
                    raise IdempotencyConflict(
                        f"idempotency key {req.idempotency_key!r} is already used by job "
                        f"{existing.id} for {existing.capability} with other parameters; "
                        "use a new key")
                return existing

        store = keyed if req.idempotency_key is not None else plain
        try:
            stored = await self._run(store, writes=True)
        except QueueStorageError as exc:
            # The INSERT may have committed before the connection dropped: sending it again
            # (it lands once, by its id or its key) answers the caller the truth.
            if not _connection_lost(exc):
                raise
            stored = await self._run(store, writes=True)
        if stored is job:
            self.batched_jobs += 1
        self._on_enqueue()
        return stored

    # ------------------------------------------------------------ leases

    async def expire_previous_boot_leases(self) -> int:
        """Nothing: in a shared queue another daemon's lease is live until it runs out
        (:meth:`requeue_expired_leases` takes back a lost host's jobs then)."""
        return 0

    async def requeue_expired_leases(self) -> int:
        """Leases past their deadline go back to pending (their worker is presumed gone)."""
        now = self._clock()

        async def work(conn: AsyncConnection[Any]) -> int:
            rows = await (await conn.execute(
                "UPDATE capd_jobs SET state = 'pending', lease_until = NULL, updated_at = %s"
                " WHERE state = 'leased' AND lease_until < %s RETURNING id, fence",
                (now, now))).fetchall()
            for row in rows:
                await self._audit(conn, row["id"], "lease_expired", row["fence"], "pending",
                                  "lease ran out")
            return len(rows)

        return await self._transaction(work)

    async def claim_due(self, limit: int, *, grace_s: float = 5.0,
                        only: Collection[str] | None = None) -> list[Job]:
        """Claim up to ``limit`` due jobs (of the capabilities in ``only``, when given), the
        earliest due first, skipping rows another daemon holds; as
        :meth:`RetryQueue.claim_due` otherwise."""
        now = self._clock()
        where = "" if only is None else " AND capability = ANY(%s)"
        args: tuple[Any, ...] = (now, *(() if only is None else (list(only),)), limit * 2 + 8)

        async def work(conn: AsyncConnection[Any]) -> list[Job]:
            due = await (await conn.execute(
                f"SELECT {_COLUMNS} FROM capd_jobs WHERE state = 'pending' AND next_run_at <= %s"
                f"{where} ORDER BY next_run_at LIMIT %s FOR UPDATE SKIP LOCKED",
                args)).fetchall()
            jobs: list[Job] = []
            for row in due:
                if len(jobs) >= limit:
                    break
                decision = decide_for(self.backoff, row, now=now, rng=self._rng)
                if decision.state != "pending":
                    error = f"{row['last_error'] or ''} [gave up: {decision.reason}]"
                    await conn.execute("UPDATE capd_jobs SET state = %s, updated_at = %s,"
                                       " last_error = %s WHERE id = %s",
                                       (decision.state, now, error, row["id"]))
                    await self._audit(conn, row["id"], "dead", row["fence"], decision.state,
                                      error)
                    continue
                lease_until = now + row["timeout_s"] + grace_s
                claimed = await (await conn.execute(
                    "UPDATE capd_jobs SET state = 'leased', attempts = attempts + 1,"
                    " fence = fence + 1, lease_until = %s, boot_id = %s, updated_at = %s"
                    f" WHERE id = %s RETURNING {_COLUMNS}",
                    (lease_until, self.boot_id, now, row["id"]))).fetchone()
                assert claimed is not None  # the row is locked by this transaction
                job = job_from_row(claimed)
                await self._audit(conn, job.id, "claim", job.fence, None,
                                  f"attempt {job.attempts}/{job.max_attempts}")
                jobs.append(job)
            return jobs

        return await self._transaction(work)

    async def extend_lease(self, job: Job, lease_s: float) -> bool:
        """Push ``job``'s lease to now + ``lease_s`` if this worker still holds it."""
        now = self._clock()

        async def work(conn: AsyncConnection[Any]) -> bool:
            cursor = await conn.execute(
                "UPDATE capd_jobs SET lease_until = %s, updated_at = %s WHERE id = %s"
                " AND fence = %s AND state = 'leased'", (now + lease_s, now, job.id, job.fence))
            return cursor.rowcount == 1

        return await self._transaction(work)

    # ------------------------------------------------------------ completion

    async def record(self, job: Job, kind: str, outcome: str | None, detail: Any = None) -> None:
        """Append one row to ``job``'s audit trail."""
        text = detail if isinstance(detail, str) or detail is None else json.dumps(detail)

        async def work(conn: AsyncConnection[Any]) -> None:
            await self._audit(conn, job.id, kind, job.fence, outcome, text)

        await self._transaction(work)

    async def complete(self, job: Job, *, state: Literal["done", "partial"] = "done",
                       detail: str | None = None) -> bool:
        """Finish ``job`` if this worker's fence still holds; False when it was taken over."""
        return await self._finish(job, state, None, None, None, detail, "complete")

    async def retry_later(self, job: Job, *, error: str, error_class: str,
                          retry_after_s: float | None = None,
                          permanent: bool = False, down: bool = False) -> Job | None:
        """Back ``job`` off, or give up on it (as :meth:`RetryQueue.retry_later`)."""
        now = self._clock()
        decision = decide_for(self.backoff, vars(job), now=now, rng=self._rng,
                              failure=failure_of(permanent=permanent, down=down),
                              retry_after_s=retry_after_s)
        state, next_run = decision.state, decision.run_at
        if await self._finish(job, state, next_run, error, error_class, error, "retry",
                              refund_attempt=down and not permanent):
            return job.model_copy(update={"state": state, "next_run_at": next_run,
                                          "last_error": error, "error_class": error_class})
        return None

    async def park(self, job: Job, *, reason: str, error_class: str = "needs_operator") -> bool:
        """Hand ``job`` to an operator (``needs_operator``), if this worker still holds it."""
        return await self._finish(job, "needs_operator", None, reason, error_class, reason,
                                  "park")

    async def postpone(self, job: Job, *, run_at: float, detail: str) -> bool:
        """Put a claimed ``job`` back to pending until ``run_at``, refunding its attempt."""
        return await self._finish(job, "pending", run_at, None, None, detail, "postpone",
                                  refund_attempt=True)

    async def _finish(self, job: Job, state: JobState, next_run: float | None,
                      error: str | None, error_class: str | None, detail: str | None,
                      kind: str, *, refund_attempt: bool = False) -> bool:
        now = self._clock()

        async def work(conn: AsyncConnection[Any]) -> bool:
            cursor = await conn.execute(
                "UPDATE capd_jobs SET state = %s, lease_until = NULL,"
                " next_run_at = coalesce(%s, next_run_at), last_error = coalesce(%s, last_error),"
                " error_class = coalesce(%s, error_class), updated_at = %s,"
                " attempts = greatest(attempts - %s, 0)"
                " WHERE id = %s AND fence = %s AND state = 'leased'",
                (state, next_run, error, error_class, now, int(refund_attempt), job.id,
                 job.fence))
            if cursor.rowcount != 1:
                await self._audit(conn, job.id, "stale_worker", job.fence, "rejected",
                                  f"{kind} to {state} refused: fence {job.fence} no longer holds")
                return False
            await self._audit(conn, job.id, kind, job.fence, state, detail)
            return True

        held = await self._transaction(work)
        if not held:
            log.warning("stale_worker_rejected", job=job.id, fence=job.fence, wanted=state)
        return held

    # ------------------------------------------------------------ operator

    async def get(self, job_id: str) -> Job:
        """Return the job ``job_id``; raise :class:`UnknownJob`."""
        rows = await self._read(f"SELECT {_COLUMNS} FROM capd_jobs WHERE id = %s", (job_id,))
        if not rows:
            raise UnknownJob(f"no job {job_id!r}; see `capd queue list`")
        return job_from_row(rows[0])

    async def attempts(self, job_id: str) -> list[Attempt]:
        """The audit trail of ``job_id``, oldest first, starting with its enqueue."""
        job = await self.get(job_id)
        rows = await self._read("SELECT id, job_id, at, kind, fence, boot_id, outcome, detail"
                                " FROM capd_attempts WHERE job_id = %s ORDER BY id", (job_id,))
        return [enqueue_entry(job), *(Attempt.model_validate(r) for r in rows)]

    async def list_jobs(self, state: str | None = None, limit: int = 100) -> list[Job]:
        """Jobs, newest first, optionally in one state."""
        check_listable(state)
        if state is None:
            rows = await self._read(
                f"SELECT {_COLUMNS} FROM capd_jobs ORDER BY created_at DESC LIMIT %s", (limit,))
        else:
            rows = await self._read(
                f"SELECT {_COLUMNS} FROM capd_jobs WHERE state = %s ORDER BY created_at DESC"
                " LIMIT %s", (state, limit))
        return [job_from_row(r) for r in rows]

    async def operator_retry(self, job_id: str, *, actor: str | None = None) -> Job:
        """Make a parked, dead, cancelled or partial job due now, with at least one more
        attempt; ``created_at`` stays, the retry is appended to the trail."""
        job = await self.get(job_id)
        check_retryable(job)
        now = self._clock()

        async def work(conn: AsyncConnection[Any]) -> None:
            cursor = await conn.execute(
                "UPDATE capd_jobs SET state = 'pending', next_run_at = %s, updated_at = %s,"
                " max_attempts = greatest(max_attempts, attempts + 1), retried_at = %s"
                " WHERE id = %s AND state = %s", (now, now, now, job_id, job.state))
            if cursor.rowcount != 1:
                raise changed_meanwhile(job)
            await self._audit(conn, job_id, "operator", job.fence, "pending",
                              operator_note("retry requested", job, actor))

        await self._transaction(work)
        self._on_enqueue()
        return await self.get(job_id)

    async def cancel(self, job_id: str, *, actor: str | None = None) -> Job:
        """Cancel a job that is not running or finished; ``actor`` goes to its audit trail."""
        job = await self.get(job_id)
        check_cancellable(job)

        async def work(conn: AsyncConnection[Any]) -> None:
            cursor = await conn.execute(
                "UPDATE capd_jobs SET state = 'cancelled', updated_at = %s WHERE id = %s"
                " AND state = %s", (self._clock(), job_id, job.state))
            if cursor.rowcount != 1:
                raise changed_meanwhile(job)
            await self._audit(conn, job_id, "operator", job.fence, "cancelled",
                              operator_note("cancelled", job, actor))

        await self._transaction(work)
        return await self.get(job_id)

    async def purge(self, state: str, older_than_s: float) -> int:
        """Delete finished jobs in ``state`` not touched for ``older_than_s``; return how many."""
        check_purgeable(state)
        cutoff = self._clock() - older_than_s

        async def work(conn: AsyncConnection[Any]) -> int:
            cursor = await conn.execute(
                "DELETE FROM capd_jobs WHERE state = %s AND updated_at < %s", (state, cutoff))
            return int(cursor.rowcount)

        return await self._transaction(work)

    async def expire_finished(self, older_than_s: float, *, batch: int = 500) -> int:
        """Remove done and cancelled jobs finished over ``older_than_s`` ago (as
        :meth:`RetryQueue.expire_finished`); how many."""
        cutoff = self._clock() - older_than_s
        removed = 0
        while True:
            async def work(conn: AsyncConnection[Any]) -> int:
                cursor = await conn.execute(
                    "DELETE FROM capd_jobs WHERE id IN (SELECT id FROM capd_jobs WHERE state IN "
                    f"{RETAINED_STATES_SQL} AND updated_at < %s LIMIT %s"
                    " FOR UPDATE SKIP LOCKED)", (cutoff, batch))
                return int(cursor.rowcount)

            count = await self._transaction(work)
            removed += count
            if count < batch:
                return removed

    async def stats(self, *, retained: bool = True) -> QueueStats:
        """Counts by state, the oldest unfinished job and the next due time (as
        :meth:`RetryQueue.stats`)."""
        where = "" if retained else f" WHERE state IN {CURRENT_STATES_SQL}"  # by index
        rows = await self._read(
            f"SELECT state, count(*) AS n FROM capd_jobs{where} GROUP BY state")
        oldest = await self._read(
            "SELECT id, capability, created_at, coalesce(retried_at, created_at) AS since"
            " FROM capd_jobs WHERE state IN ('pending', 'leased') ORDER BY since LIMIT 1")
        due = await self._read(
            "SELECT min(next_run_at) AS d FROM capd_jobs WHERE state = 'pending'")
        return queue_stats(rows, oldest[0] if oldest else None, due[0]["d"] if due else None,
                           self._clock(), self.where, retained=retained)

    async def next_wake_at(self, *, only: Collection[str] | None = None) -> float | None:
        """When the sweep must next look: the earliest due job (of the capabilities in
        ``only``: another daemon's due job must not wake this one again and again) or lease
        deadline."""
        where, args = ("", ()) if only is None else (" AND capability = ANY(%s)", (list(only),))
        rows = await self._read(
            "SELECT min(CASE WHEN state = 'pending' THEN next_run_at END) AS d,"
            " min(CASE WHEN state = 'leased' THEN lease_until END) AS l FROM capd_jobs"
            f" WHERE state IN ('pending', 'leased'){where}", args)
        values = [v for v in (rows[0]["d"], rows[0]["l"]) if v is not None] if rows else []
        return min(values) if values else None

    async def integrity_check(self) -> str:
        """'ok' when the database answers and holds capd's schema."""
        rows = await self._read("SELECT max(version) AS v FROM capd_schema")
        version = rows[0]["v"] if rows else None
        return "ok" if version == PG_SCHEMA_VERSION else f"schema version {version}"
