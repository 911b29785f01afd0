"""The durable retry queue: jobs in one SQLite file, committed before they are acknowledged.

:class:`RetryQueue` is the queue's API: it enqueues jobs and moves them
between states (see ``_jobs`` for the state diagram) — claim, complete,
postpone, retry, park, and the operator's retry, cancel and purge. It takes
its decisions about time from :meth:`BackoffPolicy.decide` (``_decision``),
writes through one :class:`GroupCommit` (``_group_commit``) and opens its file
with :func:`open_queue_file` (``_queue_file``).

Claiming bumps a fencing counter; completing is conditional on it, so a
worker whose lease was taken over cannot complete the job. Every change is
written with a row of the job's audit trail in the same transaction.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sqlite3
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, Literal, TypeVar

import structlog

from ._decision import BackoffPolicy, RetryDecision
from ._errors import (
    IdempotencyConflict,
    QueueFull,
    QueueStorageError,
    UnknownJob,
)
from ._group_commit import GroupCommit
from ._jobs import (
    CURRENT_STATES_SQL,
    OWED_STATES,
    OWED_STATES_SQL,
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
from ._queue_file import default_reserve, free_space, open_queue_file, storage_error

log = structlog.get_logger("capd.queue")

T = TypeVar("T")

_INSERT_JOB = (
    "INSERT INTO jobs (id, capability, params, idempotency_key, policy, state,"
    " attempts, max_attempts, next_run_at, lease_until, fence, boot_id,"
    " first_sent_at, timeout_s, last_error, error_class, first_error,"
    " first_error_class, created_at, updated_at)"
    " VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?, NULL, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
# A job's columns in the order of its fields: job_of takes a row of them as it is.
_SELECT_DUE = (f"SELECT {', '.join(Job.model_fields)} FROM jobs"
               " WHERE state = 'pending' AND next_run_at <= ? ORDER BY next_run_at")
_CLAIM = ("UPDATE jobs SET state = 'leased', attempts = ?, fence = ?, lease_until = ?,"
          " boot_id = ?, updated_at = ? WHERE id = ?")
_INSERT_ATTEMPT = ("INSERT INTO attempts (job_id, at, kind, fence, boot_id, outcome, detail)"
                   " VALUES (?, ?, ?, ?, ?, ?, ?)")


class _Reserved(QueueFull):
    """A new job refused under the disk reserve (the queue still writes: not a failure)."""


class RetryQueue:
    """The durable retry queue. Open it with :meth:`open`; close it with :meth:`close`."""

    shared = False  # one daemon's file: it claims every due job

    def __init__(
        self,
        path: Path,
        store: GroupCommit,
        *,
        backoff: BackoffPolicy,
        clock: Callable[[], float],
        boot_id: str,
        rng: random.Random,
        on_enqueue: Callable[[], None],
        reserve_bytes: int | None = None,
    ) -> None:
        self.path = path
        self._store = store
        self.backoff = backoff
        self._clock = clock
        self.boot_id = boot_id
        self._rng = rng
        self._on_enqueue = on_enqueue
        self._id_low = int.from_bytes(os.urandom(3), "big") << 24  # the id's random prefix
        self._id_counter = 0
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
        store = GroupCommit(path, db, clock=clock, max_batch=max_batch)
        queue = cls(path, store, backoff=backoff or BackoffPolicy(), clock=clock,
                    boot_id=boot_id or os.urandom(6).hex(), rng=rng or random.Random(),
                    on_enqueue=on_enqueue or (lambda: None), reserve_bytes=reserve_bytes)
        rows = await store.read(
            f"SELECT count(*) AS n, total(length(params)) AS b FROM jobs WHERE state IN "
            f"{OWED_STATES_SQL}")
        queue._owe(int(rows[0]["b"] or 0), int(rows[0]["n"]))
        return queue

    async def close(self) -> None:
        """Stop accepting, commit what was already handed in, and close the file."""
        await self._store.close()

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

    @property
    def where(self) -> str:
        """The queue file's path."""
        return str(self.path)

    @property
    def write_error_at(self) -> float | None:
        """When (by the queue's clock) the last group commit failed; None while writes succeed."""
        return self._store.write_error_at

    @property
    def batches(self) -> int:
        """How many group commits have succeeded."""
        return self._store.batches

    @property
    def batched_jobs(self) -> int:
        """How many operations those group commits held."""
        return self._store.operations

    # --------------------------------------------------------------- enqueue

    async def enqueue(self, request: EnqueueRequest) -> Job:
        """Store ``request`` durably and return its job once the COMMIT is done.

        With an idempotency key already used for the same capability and
        parameters, the existing job is returned; for other parameters,
        :class:`IdempotencyConflict` is raised. Raises :class:`QueueClosed`
        after :meth:`close`.
        """
        new, row = self._new_job(request)
        try:
            if request.idempotency_key is None:
                self._check_reserve()
                # A new id cannot collide: a plain insert, batched with its neighbours.
                job = await self._store.insert(_INSERT_JOB, row, new)
            else:  # a retry of a stored call is answered its job, whatever the disk
                job = await self._transaction(
                    lambda db: self._insert_keyed(db, request, new, row, self._check_reserve))
        except QueueStorageError as exc:
            if not isinstance(exc, _Reserved):  # under the reserve is a warning of its own
                self._refused = (str(exc), self._clock())
            raise
        if job is new:  # a row was stored (a key already used stores nothing, proves nothing)
            self._refused = None
            self._owe(len(row[2]), 1)
        self._on_enqueue()
        return job

    FINISH_BYTES_PER_JOB = 16 << 10
    """What finishing one acknowledged job may write at most besides its parameters: its
    claim and its completion (the pages they change, in the write-ahead log until a
    checkpoint) and its trail's rows. Each also rewrites its parameters twice."""

    def _owe(self, params_bytes: int, jobs: int) -> None:
        """Count ``jobs`` more (or fewer) unfinished jobs holding ``params_bytes``."""
        self._owed_jobs = max(0, self._owed_jobs + jobs)
        self._owed_bytes = max(0, self._owed_bytes + params_bytes * (1 if jobs >= 0 else -1))

    def _settle(self, job: Job) -> None:
        """``job`` left the unfinished states: nothing more is owed for it."""
        self._owe(len(params_text(job.params)), -1)

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

    def _check_reserve(self) -> None:
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

    def _new_id(self) -> str:
        # Time-ordered ids: new rows append to the primary-key B-tree instead of
        # landing at random places in it, which keeps big group commits cheap. 16 hex
        # digits of time_ns, the 6 of this queue's random prefix, the 6 of a counter.
        self._id_counter = (self._id_counter + 1) % 0x1000000
        return f"{time.time_ns() << 48 | self._id_low | self._id_counter:028x}"

    def _new_job(self, req: EnqueueRequest) -> tuple[Job, tuple[Any, ...]]:
        """The job ``req`` makes and its ``jobs`` row (built on the loop, before the batch)."""
        now = self._clock()
        job_id = self._new_id()
        max_attempts = req.max_attempts or self.backoff.max_attempts
        run_at = now if req.run_at is None else req.run_at
        capability, params, key, policy, state = (
            req.capability, req.params, req.idempotency_key, req.policy, req.state)
        first_sent_at, timeout_s, error, error_class = (
            req.first_sent_at, req.timeout_s, req.error, req.error_class)
        boot_id = self.boot_id
        # The enqueue itself is recorded in the job row (created_at, first_error): one
        # insert per job, and attempts() shows it as the trail's first entry. Every field
        # comes from a typed request: the job is built without re-validating.
        row = (job_id, capability, params_text(params), key, policy, state, max_attempts,
               run_at, boot_id, first_sent_at, timeout_s, error, error_class, error,
               error_class, now, now)
        job = job_of({
            "id": job_id, "capability": capability, "params": params, "idempotency_key": key,
            "policy": policy, "state": state, "attempts": 0, "max_attempts": max_attempts,
            "next_run_at": run_at, "lease_until": None, "fence": 0, "boot_id": boot_id,
            "first_sent_at": first_sent_at, "timeout_s": timeout_s, "last_error": error,
            "error_class": error_class, "first_error": error, "first_error_class": error_class,
            "created_at": now, "updated_at": now, "retried_at": None,
        })
        return job, row

    @staticmethod
    def _insert_keyed(db: sqlite3.Connection, req: EnqueueRequest, job: Job,
                      row: tuple[Any, ...], check_room: Callable[[], None]) -> Job:
        """Insert ``job`` unless its idempotency key is taken (on the database thread);
        ``check_room`` refuses a new row under the reserve."""
        key = req.idempotency_key
        found = db.execute("SELECT * FROM jobs WHERE idempotency_key = ?", (key,)).fetchone()
        if found is not None:
            existing = job_from_row(found)
            if existing.capability != req.capability or existing.params != req.params:
                raise IdempotencyConflict(
                    f"idempotency key {key!r} is already used by job {existing.id} for "
                    f"{existing.capability} with other parameters; use a new key")
            return existing
        check_room()
        db.execute(_INSERT_JOB, row)
        return job

    # ------------------------------------------------------------ transactions

    def _transaction(self, work: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Run ``work`` inside the next group commit; its result after the COMMIT, to await."""
        return self._store.transaction(work)

    def _audit(self, db: sqlite3.Connection, job_id: str, kind: str, fence: int | None,
               outcome: str | None, detail: str | None) -> None:
        db.execute(_INSERT_ATTEMPT,
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

    async def claim_due(self, limit: int, *, grace_s: float = 5.0,
                        only: Collection[str] | None = None) -> list[Job]:
        """Claim up to ``limit`` due jobs, the earliest due first, in one transaction.

        Each claimed job's attempts are incremented *now* (a job that crashes the
        daemon every time still runs out of attempts), its fence bumped and its
        lease set to its timeout plus ``grace_s``. A due job that
        :meth:`BackoffPolicy.decide` gives up on (every attempt used, or too
        old) goes to ``dead`` instead, its ``last_error`` saying why. The scan
        stops once the batch is full: later due jobs wait for the next claim.
        With ``only``, jobs of other capabilities are left where they are.
        """
        now = self._clock()
        settled: list[int] = []  # the parameters' sizes of the jobs given up on

        def work(db: sqlite3.Connection) -> list[Job]:
            runnable: list[sqlite3.Row] = []
            given_up: list[tuple[sqlite3.Row, RetryDecision]] = []
            due = db.execute(_SELECT_DUE, (now,))
            for row in due:
                if len(runnable) >= limit:
                    break
                if only is not None and row["capability"] not in only:
                    continue
                decision = decide_for(self.backoff, row, now=now, rng=self._rng)
                if decision.state == "pending":
                    runnable.append(row)
                else:
                    given_up.append((row, decision))
            due.close()
            for row, decision in given_up:
                error = f"{row['last_error'] or ''} [gave up: {decision.reason}]"
                db.execute("UPDATE jobs SET state = ?, updated_at = ?, last_error = ?"
                           " WHERE id = ?", (decision.state, now, error, row["id"]))
                self._audit(db, row["id"], "dead", row["fence"], decision.state, error)
                if decision.state not in OWED_STATES:
                    settled.append(len(row["params"]))
            # The rows were read in this write transaction: each claimed job is its row
            # with the claim's changes, built here rather than read back.
            jobs: list[Job] = []
            for row in runnable:
                data = dict(row)
                data["params"] = json.loads(data["params"])
                data["state"] = "leased"
                data["attempts"] += 1
                data["fence"] += 1
                data["lease_until"] = now + data["timeout_s"] + grace_s
                data["boot_id"] = self.boot_id
                data["updated_at"] = now
                jobs.append(job_of(data))
            db.executemany(_CLAIM, [(j.attempts, j.fence, j.lease_until, self.boot_id, now, j.id)
                                    for j in jobs])
            db.executemany(
                "INSERT INTO attempts (job_id, at, kind, fence, boot_id, outcome, detail)"
                " VALUES (?, ?, 'claim', ?, ?, NULL, ?)",
                [(j.id, now, j.fence, self.boot_id, f"attempt {j.attempts}/{j.max_attempts}")
                 for j in jobs])
            return jobs

        claimed: list[Job] = await self._transaction(work)
        for size in settled:  # given up on: nothing more is owed for them
            self._owe(size, -1)
        return claimed

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
        down: bool = False,
    ) -> Job | None:
        """Back ``job`` off, or give up on it; None when this worker's fence no longer holds.

        :meth:`BackoffPolicy.decide` answers: a permanent error sends it to
        ``dead`` (``needs_operator`` for policy manual); so does running out
        of attempts or age. Otherwise it is due again after the back-off
        delay, or ``retry_after_s`` if that is longer. ``down``: the failure was its
        capability's tool being down; the attempt is given back and it is due again
        on the recheck cooldown (only its age can end it).
        """
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
        elif state not in OWED_STATES:
            self._settle(job)
        return held

    # ---------------------------------------------------------------- operator

    async def get(self, job_id: str) -> Job:
        """Return the job ``job_id``; raise :class:`UnknownJob`."""
        rows = await self._store.read("SELECT * FROM jobs WHERE id = ?", (job_id,))
        if not rows:
            raise UnknownJob(f"no job {job_id!r}; see `capd queue list`")
        return job_from_row(rows[0])

    async def attempts(self, job_id: str) -> list[Attempt]:
        """The audit trail of ``job_id``, oldest first, starting with its enqueue."""
        job = await self.get(job_id)
        rows = await self._store.read("SELECT * FROM attempts WHERE job_id = ? ORDER BY id",
                                      (job_id,))
        return [enqueue_entry(job), *(Attempt.model_validate(dict(r)) for r in rows)]

    async def list_jobs(self, state: str | None = None, limit: int = 100) -> list[Job]:
        """Jobs, newest first, optionally in one state."""
        check_listable(state)
        if state is None:
            rows = await self._store.read(
                "SELECT * FROM jobs ORDER BY created_at DESC LIMIT ?", (limit,))
        else:
            rows = await self._store.read(
                "SELECT * FROM jobs WHERE state = ? ORDER BY created_at DESC LIMIT ?",
                (state, limit))
        return [job_from_row(r) for r in rows]

    async def operator_retry(self, job_id: str, *, actor: str | None = None) -> Job:
        """Make a parked, dead, cancelled or partial job due now, with at least one more attempt.

        ``actor`` (who asked: uid, pid, grant) is written to the job's audit trail."""
        job = await self.get(job_id)
        check_retryable(job)
        now = self._clock()

        def work(db: sqlite3.Connection) -> None:
            cursor = db.execute(
                "UPDATE jobs SET state = 'pending', next_run_at = ?, updated_at = ?,"
                " max_attempts = max(max_attempts, attempts + 1), retried_at = ?"
                " WHERE id = ? AND state = ?", (now, now, now, job_id, job.state))
            if cursor.rowcount != 1:
                raise changed_meanwhile(job)
            self._audit(db, job_id, "operator", job.fence, "pending",
                        operator_note("retry requested", job, actor))

        await self._transaction(work)
        if job.state not in OWED_STATES:  # a finished job owes again
            self._owe(len(params_text(job.params)), 1)
        self._on_enqueue()
        return await self.get(job_id)

    async def cancel(self, job_id: str, *, actor: str | None = None) -> Job:
        """Cancel a job that is not running or finished; ``actor`` goes to its audit trail."""
        job = await self.get(job_id)
        check_cancellable(job)

        def work(db: sqlite3.Connection) -> None:
            cursor = db.execute("UPDATE jobs SET state = 'cancelled', updated_at = ? WHERE id = ?"
                                " AND state = ?", (self._clock(), job_id, job.state))
            if cursor.rowcount != 1:
                raise changed_meanwhile(job)
            self._audit(db, job_id, "operator", job.fence, "cancelled",
                        operator_note("cancelled", job, actor))

        await self._transaction(work)
        if job.state in OWED_STATES:
            self._settle(job)
        return await self.get(job_id)

    async def purge(self, state: str, older_than_s: float) -> int:
        """Delete finished jobs in ``state`` not touched for ``older_than_s``; return how many."""
        check_purgeable(state)
        cutoff = self._clock() - older_than_s

        def work(db: sqlite3.Connection) -> int:
            cursor = db.execute("DELETE FROM jobs WHERE state = ? AND updated_at < ?",
                                (state, cutoff))
            return int(cursor.rowcount)

        count: int = await self._transaction(work)
        return count

    async def expire_finished(self, older_than_s: float, *, batch: int = 500) -> int:
        """Remove done and cancelled jobs (and their trails) finished over ``older_than_s``
        ago, ``batch`` a transaction so that enqueues never wait long; how many."""
        cutoff = self._clock() - older_than_s
        removed = 0
        while True:
            def work(db: sqlite3.Connection) -> int:
                cursor = db.execute(
                    "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE state IN "
                    f"{RETAINED_STATES_SQL} AND updated_at < ? LIMIT ?)", (cutoff, batch))
                return int(cursor.rowcount)

            count: int = await self._transaction(work)
            removed += count
            if count < batch:
                return removed
            await asyncio.sleep(0)  # a turn for the rest of the loop between batches

    async def stats(self, *, retained: bool = True) -> QueueStats:
        """Counts by state, the oldest pending job's age and the next due time; without
        ``retained``, done and cancelled jobs are not counted (a read of the index over
        the current jobs only: what health asks, however long the history kept)."""
        where = "" if retained else f" WHERE state IN {CURRENT_STATES_SQL}"  # by index
        rows = await self._store.read(
            f"SELECT state, count(*) AS n FROM jobs{where} GROUP BY state")
        oldest = await self._store.read(
            "SELECT id, capability, created_at, coalesce(retried_at, created_at) AS since"
            " FROM jobs WHERE state IN ('pending', 'leased') ORDER BY since LIMIT 1")
        due = await self._store.read(
            "SELECT min(next_run_at) AS d FROM jobs WHERE state = 'pending'")
        return queue_stats([dict(r) for r in rows], dict(oldest[0]) if oldest else None,
                           due[0]["d"] if due else None, self._clock(), self.where,
                           retained=retained)

    async def next_wake_at(self, *, only: Collection[str] | None = None) -> float | None:
        """When the sweep must next look: the earliest due job or lease deadline (one
        daemon's file: ``only`` is not needed, every job is its own)."""
        rows = await self._store.read(
            "SELECT min(CASE WHEN state = 'pending' THEN next_run_at END) AS d,"
            " min(CASE WHEN state = 'leased' THEN lease_until END) AS l FROM jobs"
            " WHERE state IN ('pending', 'leased')")
        values = [v for v in (rows[0]["d"], rows[0]["l"]) if v is not None] if rows else []
        return min(values) if values else None

    async def integrity_check(self) -> str:
        """``PRAGMA integrity_check``: 'ok' for a healthy file."""
        rows = await self._store.read("PRAGMA integrity_check")
        return str(rows[0][0]) if rows else "no answer"
