"""The queue's job logic, written once over a store: what each operation reads and writes.

Each operation is a *script*: a generator that yields named statements
(:class:`Sql`, rendered per dialect by ``_queries``) and is sent what each
returned. A store runs a script in one transaction: SQLite's on its database
thread inside a group commit (``_queue``), PostgreSQL's on a pooled connection
(``_pg_queue``). Decisions about time come from :meth:`BackoffPolicy.decide`
(``_decision``); the SQL restates none of them.

Claiming bumps a fencing counter; finishing is conditional on it, so a worker
whose lease was taken over cannot finish the job. Every change is written with a
row of the job's audit trail in the same transaction.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Awaitable, Callable, Collection, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Literal, NamedTuple, Protocol, TypeVar

import structlog

from ._decision import BackoffPolicy, RetryDecision
from ._errors import IdempotencyConflict, UnknownJob
from ._jobs import (
    OWED_STATES,
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

log = structlog.get_logger("capd.queue")

T = TypeVar("T")


class Sql(NamedTuple):
    """One statement of a script: its name in ``_queries``, its arguments (a list of
    them with ``many``)."""

    name: str
    args: Any = ()
    many: bool = False


class Result(Protocol):
    """What a statement returned: its rows (iterated once) and how many it changed."""

    @property
    def rowcount(self) -> int: ...

    def __iter__(self) -> Iterator[Any]: ...
    def close(self) -> None: ...


Script = Generator[Sql, Result, T]


def run_script(script: Script[T], execute: Callable[[Sql], Result]) -> T:
    """Run ``script``, each statement through ``execute``; its return value."""
    try:
        statement = next(script)
        while True:
            statement = script.send(execute(statement))
    except StopIteration as done:
        result: T = done.value
        return result


class Store(Protocol):
    """Where the jobs are kept: runs scripts in transactions, reads by name."""

    shared: bool

    write_error: str | None
    write_error_at: float | None
    batches: int
    operations: int

    @property
    def where(self) -> str: ...

    def run(self, script: Script[T]) -> Awaitable[T]:
        """``script`` in one transaction; its value once committed."""
        ...

    def add(self, row: tuple[Any, ...], job: Job) -> Awaitable[Job]:
        """Insert a new job's ``row`` (its id is new: it cannot refuse); ``job`` once
        committed."""
        ...

    async def fetch(self, name: str, args: Any = ()) -> list[Any]: ...
    async def close(self) -> None: ...
    async def integrity_check(self) -> str: ...


@dataclass(frozen=True)
class Outcome:
    """How an attempt ends, decided once by the sweep and written once by
    :meth:`QueueCore.settle`.

    ``complete`` to ``state`` (done or partial); ``retry`` as
    :meth:`BackoffPolicy.decide` answers for a failure (``error``, ``permanent``,
    ``down``, ``retry_after_s``); ``park`` for an operator (``error`` is the reason);
    ``postpone`` to ``run_at``, giving back the claim's attempt. ``notes`` are trail
    rows (kind, outcome, detail) written first, in the same transaction.
    """

    kind: Literal["complete", "retry", "park", "postpone"]
    state: Literal["done", "partial"] = "done"
    detail: str | None = None
    error: str | None = None
    error_class: str | None = None
    retry_after_s: float | None = None
    permanent: bool = False
    down: bool = False
    run_at: float | None = None
    notes: tuple[tuple[str, str | None, Any], ...] = ()


def _text(detail: Any) -> str | None:
    return detail if isinstance(detail, str) or detail is None else json.dumps(detail)


S = TypeVar("S", bound=Store)


class QueueCore(Generic[S]):
    """The durable retry queue's operations over a store (see ``_store.JobQueue``)."""

    def __init__(self, store: S, *, backoff: BackoffPolicy, clock: Callable[[], float],
                 boot_id: str, rng: random.Random, on_enqueue: Callable[[], None]) -> None:
        self._store = store
        self.shared = store.shared
        self.backoff = backoff
        self._clock = clock
        self.boot_id = boot_id
        self._rng = rng
        self._on_enqueue = on_enqueue
        self._id_low = int.from_bytes(os.urandom(3), "big") << 24  # the id's random prefix
        self._id_counter = 0

    @property
    def where(self) -> str:
        """Where the jobs are, for people."""
        return self._store.where

    @property
    def write_error(self) -> str | None:
        """Why the last write failed, until one succeeds; None while writes succeed."""
        return self._store.write_error

    @property
    def write_error_at(self) -> float | None:
        """When (by the queue's clock) the last write failed; None while writes succeed."""
        return self._store.write_error_at

    @property
    def batches(self) -> int:
        """How many write transactions (group commits) have succeeded."""
        return self._store.batches

    @property
    def batched_jobs(self) -> int:
        """How many operations (jobs, for PostgreSQL) those held."""
        return self._store.operations

    async def close(self) -> None:
        """Stop accepting; what was handed in is committed, then the store is closed."""
        await self._store.close()

    def space(self) -> tuple[int, int] | None:
        """Free bytes and the reserve on the queue's disk; None when not ours to watch."""
        return None

    def _owe(self, params_bytes: int, jobs: int) -> None:
        """``jobs`` more (or fewer) unfinished jobs holding ``params_bytes``: what a
        backend watching its own disk counts."""

    def _check_room(self) -> None:
        """Refuse a new job (a :class:`QueueFull`) when the disk must keep its room."""

    def _audit(self, job_id: str, kind: str, fence: int | None, outcome: str | None,
               detail: str | None) -> Sql:
        return Sql("audit", (job_id, self._clock(), kind, fence, self.boot_id, outcome, detail))

    # ---------------------------------------------------------------- enqueue

    async def enqueue(self, request: EnqueueRequest) -> Job:
        """Store ``request`` durably and return its job once the COMMIT is done.

        With an idempotency key already used for the same capability and
        parameters, the existing job is returned; for other parameters,
        :class:`IdempotencyConflict` is raised. Raises :class:`QueueClosed`
        after :meth:`close`.
        """
        new, row = self._new_job(request)
        job = await self._store_job(request, new, row)
        if job is new:  # a row was stored (a key already used stores nothing)
            self._owe(len(row[2]), 1)
        self._on_enqueue()
        return job

    async def _store_job(self, request: EnqueueRequest, new: Job, row: tuple[Any, ...]) -> Job:
        if request.idempotency_key is None:
            self._check_room()
            return await self._store.add(row, new)
        # a retry of a stored call is answered its job, whatever the disk
        return await self._store.run(self._insert_keyed(request, new, row))

    def _insert_keyed(self, req: EnqueueRequest, job: Job, row: tuple[Any, ...]) -> Script[Job]:
        while True:
            found = next(iter((yield Sql("job_by_key", (req.idempotency_key,)))), None)
            if found is not None:
                existing = job_from_row(found)
                if existing.capability != req.capability or existing.params != req.params:
                    raise IdempotencyConflict(
                        f"idempotency key {req.idempotency_key!r} is already used by job "
                        f"{existing.id} for {existing.capability} with other parameters; "
                        "use a new key")
                return existing
            self._check_room()
            if (yield Sql("insert_keyed", row)).rowcount == 1:
                return job
            # stored meanwhile by another daemon, or purged in between: look again

    def _new_job(self, req: EnqueueRequest) -> tuple[Job, tuple[Any, ...]]:
        """The job ``req`` makes and its ``jobs`` row (built on the loop, before the batch)."""
        now = self._clock()
        # Time-ordered ids: new rows append to the primary-key B-tree instead of landing at
        # random places in it. 16 hex digits of time_ns, 6 of the queue's prefix, 6 of a count.
        self._id_counter = (self._id_counter + 1) % 0x1000000
        job_id = f"{time.time_ns() << 48 | self._id_low | self._id_counter:028x}"
        max_attempts = req.max_attempts or self.backoff.max_attempts
        run_at = now if req.run_at is None else req.run_at
        error, error_class = req.error, req.error_class
        # The enqueue itself is recorded in the job row (created_at, first_error): one
        # insert per job, and attempts() shows it as the trail's first entry. Every field
        # comes from a typed request: the job is built without re-validating.
        row = (job_id, req.capability, params_text(req.params), req.idempotency_key,
               req.policy, req.state, max_attempts, run_at, self.boot_id, req.first_sent_at,
               req.timeout_s, error, error_class, error, error_class, now, now)
        job = job_of({
            "id": job_id, "capability": req.capability, "params": req.params,
            "idempotency_key": req.idempotency_key, "policy": req.policy, "state": req.state,
            "attempts": 0, "max_attempts": max_attempts, "next_run_at": run_at,
            "lease_until": None, "fence": 0, "boot_id": self.boot_id,
            "first_sent_at": req.first_sent_at, "timeout_s": req.timeout_s,
            "last_error": error, "error_class": error_class, "first_error": error,
            "first_error_class": error_class, "created_at": now, "updated_at": now,
            "retried_at": None,
        })
        return job, row

    # ----------------------------------------------------------------- leases

    async def expire_previous_boot_leases(self) -> int:
        """At start-up: every lease held by another boot goes back to pending at once. In
        a shared queue nothing: another daemon's lease is live until it runs out."""
        if self.shared:
            return 0
        now = self._clock()
        count = await self._release(Sql("release_previous_boot", (now, now, self.boot_id)),
                                    "held by a previous boot")
        if count:
            log.warning("orphaned_leases_recovered", jobs=count)
        return count

    async def requeue_expired_leases(self) -> int:
        """Leases past their deadline go back to pending (their worker is presumed gone)."""
        now = self._clock()
        return await self._release(Sql("release_expired", (now, now)), "lease ran out")

    async def _release(self, release: Sql, why: str) -> int:
        def script() -> Script[int]:
            rows = list((yield release))
            for row in rows:
                yield self._audit(row["id"], "lease_expired", row["fence"], "pending", why)
            return len(rows)

        return await self._store.run(script())

    async def claim_due(self, limit: int, *, grace_s: float = 5.0,
                        only: Collection[str] | None = None) -> list[Job]:
        """Claim up to ``limit`` due jobs (of the capabilities in ``only``, when given), the
        earliest due first, in one transaction.

        Each claimed job's attempts are incremented *now* (a job that crashes the
        daemon every time still runs out of attempts), its fence bumped and its
        lease set to its timeout plus ``grace_s``. A due job that
        :meth:`BackoffPolicy.decide` gives up on (every attempt used, or too
        old) goes to ``dead`` instead, its ``last_error`` saying why. The scan
        stops once the batch is full: later due jobs wait for the next claim. A
        shared queue locks a bounded window of due rows and skips those another
        daemon holds.
        """
        now = self._clock()
        window = limit * 2 + 8 if self.shared else -1
        due = (Sql("due", (now, window)) if only is None else
               Sql("due_of", (now, json.dumps(sorted(only)), window)))
        settled: list[int] = []  # the parameters' sizes of the jobs given up on

        def script() -> Script[list[Job]]:
            runnable: list[Any] = []
            given_up: list[tuple[Any, RetryDecision]] = []
            rows = yield due
            for row in rows:
                if len(runnable) >= limit:
                    break
                decision = decide_for(self.backoff, row, now=now, rng=self._rng)
                if decision.state == "pending":
                    runnable.append(row)
                else:
                    given_up.append((row, decision))
            rows.close()
            for row, decision in given_up:
                error = f"{row['last_error'] or ''} [gave up: {decision.reason}]"
                yield Sql("give_up", (decision.state, now, error, row["id"]))
                yield self._audit(row["id"], "dead", row["fence"], decision.state, error)
                if decision.state not in OWED_STATES:
                    settled.append(len(row["params"]))
            # The rows were read (and locked) in this write transaction: each claimed job
            # is its row with the claim's changes, built here rather than read back.
            jobs: list[Job] = []
            for row in runnable:
                data = dict(row)
                data.update(params=json.loads(data["params"]), state="leased",
                            attempts=data["attempts"] + 1, fence=data["fence"] + 1,
                            lease_until=now + data["timeout_s"] + grace_s,
                            boot_id=self.boot_id, updated_at=now)
                jobs.append(job_of(data))
            if jobs:
                yield Sql("claim", [(j.attempts, j.fence, j.lease_until, self.boot_id, now, j.id)
                                    for j in jobs], many=True)
                yield Sql("audit", [(j.id, now, "claim", j.fence, self.boot_id, None,
                                     f"attempt {j.attempts}/{j.max_attempts}") for j in jobs],
                          many=True)
            return jobs

        claimed = await self._store.run(script())
        for size in settled:  # given up on: nothing more is owed for them
            self._owe(size, -1)
        return claimed

    async def extend_lease(self, job: Job, lease_s: float, *,
                           notes: tuple[tuple[str, str | None, Any], ...] = ()) -> bool:
        """Push ``job``'s lease to now + ``lease_s`` if this worker still holds it; the
        trail rows ``notes`` (kind, outcome, detail) are written with it, first."""
        now = self._clock()

        def script() -> Script[bool]:
            for kind, outcome, detail in notes:
                yield self._audit(job.id, kind, job.fence, outcome, _text(detail))
            return (yield Sql("extend_lease", (now + lease_s, now, job.id, job.fence))
                    ).rowcount == 1

        return await self._store.run(script())

    # ------------------------------------------------------------- completion

    async def record(self, job: Job, kind: str, outcome: str | None, detail: Any = None) -> None:
        """Append one row to ``job``'s audit trail (a call, a verification, …)."""
        def script() -> Script[None]:
            yield self._audit(job.id, kind, job.fence, outcome, _text(detail))

        await self._store.run(script())

    async def settle(self, job: Job, outcome: Outcome) -> Job | None:
        """Write ``outcome`` of ``job``'s attempt in one transaction, if this worker's fence
        still holds: ``job`` as it now is, or None (audited ``stale_worker``).

        A ``retry`` goes where :meth:`BackoffPolicy.decide` says: a permanent error
        to ``dead`` (``needs_operator`` for policy manual), and so does running out
        of attempts or age; else due again after the back-off delay, or
        ``retry_after_s`` if longer. ``down``: its capability's tool was down; the
        attempt is given back, it is due again on the recheck cooldown (only its
        age can end it). ``postpone`` gives back the claim's attempt (the fence stays
        bumped): an attempt never made.
        """
        now = self._clock()
        error, error_class, detail, run_at = outcome.error, outcome.error_class, \
            outcome.detail, outcome.run_at
        refund = outcome.kind == "postpone" or (outcome.down and not outcome.permanent)
        state: JobState = ("needs_operator" if outcome.kind == "park" else
                           "pending" if outcome.kind == "postpone" else outcome.state)
        if outcome.kind == "retry":
            decision = decide_for(self.backoff, vars(job), now=now, rng=self._rng,
                                  failure=failure_of(permanent=outcome.permanent,
                                                     down=outcome.down),
                                  retry_after_s=outcome.retry_after_s)
            state, run_at, detail = decision.state, decision.run_at, error
        elif outcome.kind == "park":
            detail = error
        kind = outcome.kind

        def script() -> Script[bool]:
            for note_kind, note, note_detail in outcome.notes:
                yield self._audit(job.id, note_kind, job.fence, note, _text(note_detail))
            finished = yield Sql("finish", (state, run_at, error, error_class, now, int(refund),
                                            job.id, job.fence))
            if finished.rowcount != 1:
                yield self._audit(job.id, "stale_worker", job.fence, "rejected",
                                  f"{kind} to {state} refused: fence {job.fence} no longer holds")
                return False
            yield self._audit(job.id, kind, job.fence, state, detail)
            return True

        if not await self._store.run(script()):
            log.warning("stale_worker_rejected", job=job.id, fence=job.fence, wanted=state)
            return None
        if state not in OWED_STATES:
            self._owe(len(params_text(job.params)), -1)
        return job.model_copy(update={
            "state": state, "next_run_at": job.next_run_at if run_at is None else run_at,
            "last_error": job.last_error if error is None else error,
            "error_class": job.error_class if error_class is None else error_class})

    async def complete(self, job: Job, *, state: Literal["done", "partial"] = "done",
                       detail: str | None = None) -> bool:
        """Finish ``job`` if this worker's fence still holds; False when it was taken over."""
        return await self.settle(job, Outcome("complete", state, detail)) is not None

    async def retry_later(self, job: Job, *, error: str, error_class: str,
                          retry_after_s: float | None = None, permanent: bool = False,
                          down: bool = False) -> Job | None:
        """Back ``job`` off, or give up on it (see :meth:`settle`); None when this worker's
        fence no longer holds."""
        return await self.settle(job, Outcome(
            "retry", error=error, error_class=error_class, retry_after_s=retry_after_s,
            permanent=permanent, down=down))

    async def park(self, job: Job, *, reason: str, error_class: str = "needs_operator") -> bool:
        """Hand ``job`` to an operator (``needs_operator``), if this worker still holds it."""
        return await self.settle(job, Outcome("park", error=reason,
                                              error_class=error_class)) is not None

    async def postpone(self, job: Job, *, run_at: float, detail: str) -> bool:
        """Put a claimed ``job`` back to pending until ``run_at``, refunding its claim's
        attempt (an earlier attempt still runs: it can be neither verified nor replayed).
        False (audited ``stale_worker``) when this worker's fence no longer holds."""
        return await self.settle(job, Outcome("postpone", detail=detail,
                                              run_at=run_at)) is not None

    # --------------------------------------------------------------- operator

    async def get(self, job_id: str) -> Job:
        """Return the job ``job_id``; raise :class:`UnknownJob`."""
        rows = await self._store.fetch("job", (job_id,))
        if not rows:
            raise UnknownJob(f"no job {job_id!r}; see `capd queue list`")
        return job_from_row(rows[0])

    async def attempts(self, job_id: str) -> list[Attempt]:
        """The audit trail of ``job_id``, oldest first, starting with its enqueue."""
        job = await self.get(job_id)
        rows = await self._store.fetch("trail", (job_id,))
        return [enqueue_entry(job), *(Attempt.model_validate(dict(r)) for r in rows)]

    async def list_jobs(self, state: str | None = None, limit: int = 100) -> list[Job]:
        """Jobs, newest first, optionally in one state."""
        check_listable(state)
        rows = await (self._store.fetch("jobs", (limit,)) if state is None else
                      self._store.fetch("jobs_in", (state, limit)))
        return [job_from_row(r) for r in rows]

    async def _operator(self, job: Job, change: Sql, to: str, note: str) -> None:
        def script() -> Script[None]:
            if (yield change).rowcount != 1:
                raise changed_meanwhile(job)
            yield self._audit(job.id, "operator", job.fence, to, note)

        await self._store.run(script())

    async def operator_retry(self, job_id: str, *, actor: str | None = None) -> Job:
        """Make a parked, dead, cancelled or partial job due now, with at least one more
        attempt; ``created_at`` stays. ``actor`` (who asked) goes to its audit trail."""
        job = await self.get(job_id)
        check_retryable(job)
        now = self._clock()
        await self._operator(job, Sql("operator_retry", (now, now, now, job_id, job.state)),
                             "pending", operator_note("retry requested", job, actor))
        if job.state not in OWED_STATES:  # a finished job owes again
            self._owe(len(params_text(job.params)), 1)
        self._on_enqueue()
        return await self.get(job_id)

    async def cancel(self, job_id: str, *, actor: str | None = None) -> Job:
        """Cancel a job that is not running or finished; ``actor`` goes to its audit trail."""
        job = await self.get(job_id)
        check_cancellable(job)
        await self._operator(job, Sql("cancel", (self._clock(), job_id, job.state)),
                             "cancelled", operator_note("cancelled", job, actor))
        if job.state in OWED_STATES:
            self._owe(len(params_text(job.params)), -1)
        return await self.get(job_id)

    async def _delete(self, delete: Sql) -> int:
        def script() -> Script[int]:
            return int((yield delete).rowcount)

        return await self._store.run(script())

    async def purge(self, state: str, older_than_s: float) -> int:
        """Delete finished jobs in ``state`` not touched for ``older_than_s``; return how many."""
        check_purgeable(state)
        return await self._delete(Sql("purge", (state, self._clock() - older_than_s)))

    async def expire_finished(self, older_than_s: float, *, batch: int = 500) -> int:
        """Remove done and cancelled jobs (and their trails) finished over ``older_than_s``
        ago, ``batch`` a transaction so that enqueues never wait long; how many."""
        cutoff = self._clock() - older_than_s
        removed = 0
        while True:
            count = await self._delete(Sql("expire", (cutoff, batch)))
            removed += count
            if count < batch:
                return removed
            await asyncio.sleep(0)  # a turn for the rest of the loop between batches

    async def stats(self, *, retained: bool = True) -> QueueStats:
        """Counts by state, the oldest unfinished job and the next due time; without
        ``retained``, done and cancelled jobs are not counted (a read of the index over
        the current jobs only: what health asks, however long the history kept)."""
        rows = await self._store.fetch("counts" if retained else "current_counts")
        oldest = await self._store.fetch("oldest")
        due = await self._store.fetch("next_due")
        return queue_stats([dict(r) for r in rows], dict(oldest[0]) if oldest else None,
                           due[0]["d"] if due else None, self._clock(), self.where,
                           retained=retained)

    async def next_wake_at(self, *, only: Collection[str] | None = None) -> float | None:
        """When the sweep must next look: the earliest due job (of the capabilities in
        ``only``, when given) or lease deadline."""
        rows = await (self._store.fetch("next_wake") if only is None else
                      self._store.fetch("next_wake_of", (json.dumps(sorted(only)),)))
        values = [v for v in (rows[0]["d"], rows[0]["l"]) if v is not None] if rows else []
        return min(values) if values else None

    async def integrity_check(self) -> str:
        """'ok' for a healthy store (SQLite's ``integrity_check``, PostgreSQL's schema)."""
        return await self._store.integrity_check()
