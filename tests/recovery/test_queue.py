"""The durable retry queue on a real SQLite file: states, fencing, back-off, idempotency."""

from __future__ import annotations

import asyncio
import random
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from capd.recovery import (
    BackoffPolicy,
    EnqueueRequest,
    IdempotencyConflict,
    InvalidTransition,
    JobQueue,
    PgRetryQueue,
    QueueClosed,
    QueueCorrupt,
    QueueFull,
    QueueStorageError,
    RetryQueue,
    UnknownJob,
)
from capd.recovery._queue_file import SCHEMA_VERSION
from tests.helpers.fakes import Clock


def request(n: int = 0, **extra: object) -> EnqueueRequest:
    fields: dict[str, object] = {"capability": "notes.append", "params": {"n": n},
                                 "policy": "replay", "timeout_s": 5.0, "first_sent_at": 990.0}
    fields.update(extra)
    return EnqueueRequest(**fields)  # type: ignore[arg-type]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def sqlite_queue(tmp_path: Path, clock: Clock) -> AsyncIterator[RetryQueue]:
    q = await RetryQueue.open(tmp_path / "q.db", clock=clock, rng=random.Random(7),
                              backoff=BackoffPolicy(max_attempts=3), boot_id="boot-a")
    yield q
    await q.close()


@pytest.fixture(params=["sqlite", "postgresql"])
async def queue(request: pytest.FixtureRequest, tmp_path: Path,
                clock: Clock) -> AsyncIterator[JobQueue]:
    """The queue's semantics hold on both backends: the SQLite file and PostgreSQL."""
    settings: dict[str, Any] = {"clock": clock, "rng": random.Random(7),
                                "backoff": BackoffPolicy(max_attempts=3), "boot_id": "boot-a"}
    q: JobQueue
    if request.param == "sqlite":
        q = await RetryQueue.open(tmp_path / "q.db", **settings)
    else:
        q = await PgRetryQueue.open(request.getfixturevalue("pg_url"), **settings)
    yield q
    await q.close()


async def test_pragmas_and_schema_version(tmp_path: Path, sqlite_queue: JobQueue) -> None:
    """The file is WAL with user_version set; another connection sees it so."""
    with sqlite3.connect(tmp_path / "q.db") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


async def test_enqueue_is_committed_before_it_returns(tmp_path: Path,
                                                     sqlite_queue: JobQueue) -> None:
    """When enqueue returns, another connection already sees the job with its first error."""
    queue = sqlite_queue
    job = await queue.enqueue(request(error="timeout", error_class="timeout"))
    with sqlite3.connect(tmp_path / "q.db") as raw:
        assert raw.execute("SELECT state, first_error FROM jobs WHERE id = ?",
                           (job.id,)).fetchone() == ("pending", "timeout")
    (first,) = await queue.attempts(job.id)
    assert (first.kind, first.outcome, first.detail) == ("enqueue", "timeout", "timeout")


async def test_job_ids_are_unique_and_time_ordered(queue: JobQueue) -> None:
    """Ids sort in creation order, and never repeat."""
    jobs = [await queue.enqueue(request(i)) for i in range(50)]
    ids = [j.id for j in jobs]
    assert ids == sorted(ids)
    assert len(set(ids)) == 50


async def test_concurrent_enqueues_are_group_committed(sqlite_queue: JobQueue) -> None:
    """200 concurrent enqueues land in far fewer transactions than jobs."""
    queue = sqlite_queue
    jobs = await asyncio.gather(*(queue.enqueue(request(i)) for i in range(200)))
    assert len({j.id for j in jobs}) == 200
    assert queue.batched_jobs == 200
    assert queue.batches < 20


async def test_claim_leases_increments_attempts_and_fences(queue: JobQueue,
                                                           clock: Clock) -> None:
    """A claim takes due jobs only, bumps attempts and fence, and sets lease = timeout + grace."""
    due = await queue.enqueue(request(1))
    later = await queue.enqueue(request(2, run_at=clock.now + 100))
    (claimed,) = await queue.claim_due(10, grace_s=5)
    assert claimed.id == due.id
    assert (claimed.state, claimed.attempts, claimed.fence) == ("leased", 1, 1)
    assert claimed.lease_until == clock.now + 5.0 + 5
    assert (await queue.get(later.id)).state == "pending"


async def test_complete_is_conditional_on_the_fence(queue: JobQueue, clock: Clock) -> None:
    """A stale worker whose lease was taken over cannot complete; the new holder can."""
    await queue.enqueue(request())
    (first,) = await queue.claim_due(1, grace_s=1)
    clock.advance(60)
    assert await queue.requeue_expired_leases() == 1
    (second,) = await queue.claim_due(1, grace_s=1)
    assert second.fence == first.fence + 1
    assert await queue.complete(first) is False
    assert await queue.complete(second) is True
    trail = [(a.kind, a.outcome) for a in await queue.attempts(first.id)]
    assert ("stale_worker", "rejected") in trail
    assert trail[-1] == ("complete", "done")


async def test_retry_later_backs_off_with_jitter_and_honours_retry_after(
        queue: JobQueue, clock: Clock) -> None:
    """A transient failure is due again within the jittered delay, or after retry_after."""
    await queue.enqueue(request())
    (job,) = await queue.claim_due(1)
    again = await queue.retry_later(job, error="busy", error_class="transient")
    assert again is not None
    assert again.state == "pending"
    assert clock.now <= again.next_run_at <= clock.now + 1.0
    clock.advance(2)
    (job,) = await queue.claim_due(1)
    hinted = await queue.retry_later(job, error="slow down", error_class="transient",
                                     retry_after_s=120)
    assert hinted is not None
    assert hinted.next_run_at == pytest.approx(clock.now + 120)


async def test_a_failure_while_down_gives_the_attempt_back(queue: JobQueue,
                                                          clock: Clock) -> None:
    """retry_later(down=True) on both backends: the claim's attempt is refunded, the job is
    due after down_wait_s, and ten such failures never use up max_attempts (3)."""
    job = await queue.enqueue(request())
    for _ in range(10):
        clock.advance(60)
        (claimed,) = await queue.claim_due(1, grace_s=1)
        assert claimed.attempts == 1
        again = await queue.retry_later(claimed, error="down", error_class="tool_unavailable",
                                        down=True)
        assert again is not None
        assert again.state == "pending"
        assert again.next_run_at == clock.now + queue.backoff.down_wait_s
    stored = await queue.get(job.id)
    assert (stored.state, stored.attempts) == ("pending", 0)


async def test_finished_jobs_expire_after_the_retention(queue: JobQueue,
                                                         clock: Clock) -> None:
    """expire_finished removes done and cancelled jobs (with their trails) finished before
    the cutoff, in batches; dead, pending and newer ones stay. stats(retained=False)
    counts the current jobs only."""
    done_ids = []
    for i in range(7):
        await queue.enqueue(request(i))
    claimed = await queue.claim_due(7, grace_s=1)
    for job in claimed[:5]:
        assert await queue.complete(job)
        done_ids.append(job.id)
    await queue.retry_later(claimed[5], error="x", error_class="p", permanent=True)  # dead
    waiting = await queue.enqueue(request(99, run_at=clock.now + 1000))
    cancelled = await queue.cancel(waiting.id)
    clock.advance(100)
    (young,) = [j for j in claimed[6:]]
    assert await queue.complete(young)  # done just now: kept
    assert await queue.expire_finished(50, batch=2) == 6  # 5 done + 1 cancelled
    assert {j.id for j in await queue.list_jobs(limit=100)}.isdisjoint(
        {*done_ids, cancelled.id})
    for job_id in done_ids:
        with pytest.raises(UnknownJob):
            await queue.attempts(job_id)
    current = await queue.stats(retained=False)
    assert "done" not in current.by_state
    assert current.by_state["dead"] == 1
    assert await queue.expire_finished(50) == 0


async def test_backoff_policy_full_jitter_and_cap() -> None:
    """Delays stay within [0, min(cap, base * factor**(n-1))]."""
    policy = BackoffPolicy(base_s=1, factor=2, cap_s=10)
    rng = random.Random(1)
    for attempts, ceiling in [(1, 1), (2, 2), (3, 4), (4, 8), (5, 10), (20, 10)]:
        delays = [policy.delay_s(attempts, rng) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.8


async def test_permanent_errors_go_dead_or_to_an_operator(queue: JobQueue) -> None:
    """Permanent: replay jobs die; manual jobs wait for an operator."""
    await queue.enqueue(request(1))
    await queue.enqueue(request(2, policy="manual"))
    jobs = {j.params["n"]: j for j in await queue.claim_due(10)}
    dead = await queue.retry_later(jobs[1], error="404", error_class="permanent", permanent=True)
    parked = await queue.retry_later(jobs[2], error="404", error_class="permanent",
                                     permanent=True)
    assert (dead and dead.state, parked and parked.state) == ("dead", "needs_operator")


async def test_a_poison_job_ends_dead_even_if_it_crashes_every_attempt(
        queue: JobQueue, clock: Clock) -> None:
    """Attempts count at claim: a job whose worker always dies is dead after max_attempts."""
    job = await queue.enqueue(request())
    for _ in range(3):
        assert len(await queue.claim_due(1, grace_s=0)) == 1
        clock.advance(10)  # the worker died: its lease runs out
        await queue.requeue_expired_leases()
    assert await queue.claim_due(1) == []
    dead = await queue.get(job.id)
    assert dead.state == "dead"
    assert dead.attempts == 3
    assert "no attempts left" in (dead.last_error or "")


async def test_idempotency_keys(queue: JobQueue) -> None:
    """Same key and params: the same job; same key, other params: a conflict."""
    first = await queue.enqueue(request(1, idempotency_key="k1"))
    again = await queue.enqueue(request(1, idempotency_key="k1"))
    assert again.id == first.id
    twins = await asyncio.gather(queue.enqueue(request(5, idempotency_key="k2")),
                                 queue.enqueue(request(5, idempotency_key="k2")))
    assert twins[0].id == twins[1].id
    with pytest.raises(IdempotencyConflict, match="already used by job"):
        await queue.enqueue(request(2, idempotency_key="k1"))
    assert len(await queue.list_jobs()) == 2


async def test_previous_boot_leases_are_expired_at_start(tmp_path: Path, clock: Clock) -> None:
    """A job leased by a boot that died goes back to pending as soon as the next boot opens."""
    path = tmp_path / "q.db"
    old = await RetryQueue.open(path, clock=clock, boot_id="old")
    job = await old.enqueue(request())
    await old.claim_due(1)
    await old.close()
    new = await RetryQueue.open(path, clock=clock, boot_id="new")
    try:
        assert await new.expire_previous_boot_leases() == 1
        assert (await new.get(job.id)).state == "pending"
        (again,) = await new.claim_due(1)
        assert again.attempts == 2
    finally:
        await new.close()


async def test_operator_retry_cancel_and_purge(queue: JobQueue, clock: Clock) -> None:
    """Operators revive dead jobs, cancel waiting ones and purge finished ones."""
    job = await queue.enqueue(request())
    (claimed,) = await queue.claim_due(1)
    await queue.retry_later(claimed, error="x", error_class="permanent", permanent=True)
    revived = await queue.operator_retry(job.id)
    assert (revived.state, revived.max_attempts) == ("pending", 3)
    with pytest.raises(InvalidTransition, match="only needs_operator, dead"):
        await queue.operator_retry(job.id)
    cancelled = await queue.cancel(job.id)
    assert cancelled.state == "cancelled"
    with pytest.raises(InvalidTransition, match="only finished jobs can be purged"):
        await queue.purge("pending", 0)
    clock.advance(100)
    assert await queue.purge("cancelled", 50) == 1
    with pytest.raises(UnknownJob):
        await queue.get(job.id)


async def test_leased_jobs_cannot_be_cancelled(queue: JobQueue) -> None:
    """A running job is not cancelled under its worker."""
    job = await queue.enqueue(request())
    await queue.claim_due(1)
    with pytest.raises(InvalidTransition, match="it is running now"):
        await queue.cancel(job.id)


async def test_stats_and_next_wake(queue: JobQueue, clock: Clock) -> None:
    """stats counts by state; next_wake_at is the earliest due time or lease deadline."""
    await queue.enqueue(request(1, run_at=clock.now + 30))
    await queue.enqueue(request(2, run_at=clock.now + 10))
    stats = await queue.stats()
    assert stats.by_state["pending"] == 2
    assert stats.next_due_at == clock.now + 10
    assert await queue.next_wake_at() == clock.now + 10


async def test_closed_queue_refuses(queue: JobQueue) -> None:
    """After close, enqueue raises QueueClosed."""
    await queue.close()
    with pytest.raises(QueueClosed):
        await queue.enqueue(request())


async def test_a_corrupt_file_is_reported_and_never_replaced(tmp_path: Path) -> None:
    """Garbage in the queue file: a clear QueueCorrupt, and the bytes are left as they were."""
    path = tmp_path / "q.db"
    garbage = b"this is not a database" * 100
    path.write_bytes(garbage)
    with pytest.raises(QueueCorrupt, match=r"is not a readable capd queue.*never replaces it"):
        await RetryQueue.open(path)
    assert path.read_bytes() == garbage


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    """A queue written by a newer capd is not touched."""
    path = tmp_path / "q.db"
    with sqlite3.connect(path) as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(QueueStorageError, match="newer than this capd understands"):
        await RetryQueue.open(path)


async def test_a_sqlite_file_without_the_capd_schema_is_refused_untouched(
        tmp_path: Path) -> None:
    """A version-0 SQLite file capd did not create is refused, never migrated in place."""
    path = tmp_path / "q.db"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE keep_me (x)")
        raw.execute("INSERT INTO keep_me VALUES (42)")
    before = path.read_bytes()
    with pytest.raises(QueueCorrupt, match=r"not a capd queue.*move it aside \(capd never"):
        await RetryQueue.open(path)
    assert path.read_bytes() == before
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 0
        assert raw.execute("SELECT name FROM sqlite_master WHERE name = 'jobs'").fetchone() is None


async def test_partial_completion_and_its_operator_retry(queue: JobQueue) -> None:
    """leased → partial (the op did part of the work); an operator can make it due again."""
    job = await queue.enqueue(request())
    (claimed,) = await queue.claim_due(1)
    assert await queue.complete(claimed, state="partial", detail="1 of 2 rows written")
    partial = await queue.get(job.id)
    assert (partial.state, partial.lease_until) == ("partial", None)
    trail = await queue.attempts(job.id)
    assert (trail[-1].kind, trail[-1].outcome, trail[-1].detail) == (
        "complete", "partial", "1 of 2 rows written")
    assert (await queue.operator_retry(job.id)).state == "pending"


async def test_an_operator_retry_keeps_created_at_and_appends_to_the_trail(
        tmp_path: Path, clock: Clock) -> None:
    """A retry never rewrites history: created_at and the enqueue entry keep their time, the
    retry is a new audit entry, and the job's age (for max_age_s) counts from the retry."""
    queue = await RetryQueue.open(tmp_path / "q.db", clock=clock, rng=random.Random(7),
                                  backoff=BackoffPolicy(max_attempts=3, max_age_s=100),
                                  boot_id="boot-a")
    try:
        job = await queue.enqueue(request())
        accepted = job.created_at
        clock.advance(150)  # older than max_age_s: the claim gives it up
        assert await queue.claim_due(1) == []
        assert (await queue.get(job.id)).state == "dead"
        clock.advance(10)
        revived = await queue.operator_retry(job.id, actor="uid 0")
        assert revived.created_at == accepted
        assert revived.retried_at == clock()
        (claimed,) = await queue.claim_due(1)  # young again from the retry: it runs
        assert claimed.id == job.id
        assert claimed.created_at == accepted
        trail = await queue.attempts(job.id)
        assert (trail[0].kind, trail[0].at) == ("enqueue", accepted)
        assert [a.kind for a in trail] == ["enqueue", "dead", "operator", "claim"]
        assert "retry requested (was dead) by uid 0" in (trail[2].detail or "")
    finally:
        await queue.close()


async def test_a_version_1_queue_is_migrated_with_its_jobs(tmp_path: Path) -> None:
    """A queue file written by the schema before retried_at opens, migrated in place, its
    jobs as they were."""
    from capd.recovery._queue_file import MIGRATIONS

    path = tmp_path / "q.db"
    accepted = time.time() - 60
    with sqlite3.connect(path) as raw:
        raw.execute("PRAGMA journal_mode = WAL")
        raw.executescript(MIGRATIONS[1])
        raw.execute("PRAGMA user_version = 1")
        raw.execute(
            "INSERT INTO jobs (id, capability, params, policy, state, max_attempts,"
            " next_run_at, first_sent_at, timeout_s, created_at, updated_at) VALUES"
            " ('j1', 'notes.append', '{\"n\":1}', 'replay', 'pending', 3, 0, ?, 5, ?, ?)",
            (accepted, accepted, accepted))
    raw.close()
    queue = await RetryQueue.open(path, boot_id="boot-a")
    try:
        job = await queue.get("j1")
        assert (job.created_at, job.retried_at, job.params) == (accepted, None, {"n": 1})
        (claimed,) = await queue.claim_due(1)
        assert claimed.id == "j1"
    finally:
        await queue.close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
        indexes = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = "
                                             "'index'")}
        assert "jobs_finished" in indexes  # what the retention pass reads by
    raw.close()


async def test_a_new_queue_file_is_the_daemon_users_alone(tmp_path: Path) -> None:
    """The jobs hold callers' parameters: a new queue.db is 0600, and so are the WAL and
    shared-memory files SQLite makes beside it."""
    path = tmp_path / "q.db"
    queue = await RetryQueue.open(path, boot_id="boot-a")
    try:
        await queue.enqueue(request())
        for name in ("q.db", "q.db-wal", "q.db-shm"):
            if (tmp_path / name).exists():
                assert (tmp_path / name).stat().st_mode & 0o777 == 0o600, name
    finally:
        await queue.close()


async def test_a_retried_job_is_young_again_in_the_stats(queue: JobQueue, clock: Clock) -> None:
    """The oldest unfinished job's age counts from an operator's retry (its created_at
    stays): a week-old parked job retried now does not make /health warn of its age."""
    job = await queue.enqueue(request(policy="manual", state="needs_operator"))
    clock.advance(7 * 86400)
    await queue.operator_retry(job.id)
    stats = await queue.stats()
    assert stats.oldest_pending_age_s == 0
    assert stats.oldest_pending is not None
    assert stats.oldest_pending["created_at"] == job.created_at


async def test_an_operator_action_on_a_job_that_moved_meanwhile_writes_nothing(
        queue: JobQueue) -> None:
    """Between the look and the change the job left its state: refused, no trail entry."""
    job = await queue.enqueue(request())
    seen = await queue.get(job.id)
    (claimed,) = await queue.claim_due(1)  # the sweep took it after the operator looked
    assert claimed.id == job.id
    trail = await queue.attempts(job.id)
    stale = seen.model_copy(update={"state": "pending"})
    get = queue.get

    async def looked_before(job_id: str) -> Any:  # the operator's earlier look
        return stale if job_id == job.id else await get(job_id)

    queue.get = looked_before  # type: ignore[method-assign]
    with pytest.raises(InvalidTransition, match="changed while this was asked"):
        await queue.cancel(job.id)
    queue.get = get  # type: ignore[method-assign]
    assert await queue.attempts(job.id) == trail
    assert (await queue.get(job.id)).state == "leased"


async def test_a_keyed_retry_under_the_reserve_is_answered_its_job(
        sqlite_queue: RetryQueue) -> None:
    """A caller retrying a stored call (same idempotency key) under the disk reserve gets
    its job, not NOT queued; a new call is refused."""
    first = await sqlite_queue.enqueue(request(1, idempotency_key="k"))
    sqlite_queue._reserve_setting = 1 << 62  # every file system is under it now
    sqlite_queue._space = None
    again = await sqlite_queue.enqueue(request(1, idempotency_key="k"))
    assert again.id == first.id
    with pytest.raises(QueueFull, match="disk nearly full"):
        await sqlite_queue.enqueue(request(2, idempotency_key="other"))
    assert sqlite_queue.write_error is None


def test_enqueue_request_init_takes_and_sets_every_field() -> None:
    """EnqueueRequest's hand-written __init__ (it sets the fields in one step, for speed)
    takes every field, in order, with its default, and sets each of them."""
    import dataclasses
    import inspect

    taken = list(inspect.signature(EnqueueRequest.__init__).parameters.values())[1:]
    assert [(p.name, dataclasses.MISSING if p.default is p.empty else p.default)
            for p in taken] == [(f.name, f.default) for f in dataclasses.fields(EnqueueRequest)]
    made = EnqueueRequest("c", {}, "replay", 1.0, 0.0)
    assert vars(made) == {f.name: getattr(made, f.name) for f in dataclasses.fields(made)}
