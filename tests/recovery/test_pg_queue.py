"""What a queue shared by several daemons adds, on a real PostgreSQL server: claims that never
overlap, each daemon claiming only what it knows, leases that outlive a restart elsewhere,
and a database that is away at the start or later."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import pytest

from capd.recovery import (
    BackoffPolicy,
    EnqueueRequest,
    PgRetryQueue,
    QueueStorageError,
)
from tests.helpers.fakes import Clock
from tests.helpers.pg import postgres_server

pytestmark = pytest.mark.slow  # a real PostgreSQL server

T = TypeVar("T")


def request(n: int = 0, capability: str = "notes.append") -> EnqueueRequest:
    return EnqueueRequest(capability=capability, params={"n": n}, policy="replay",
                          timeout_s=5.0, first_sent_at=990.0)


@pytest.fixture
async def two(pg_url: str) -> AsyncIterator[tuple[PgRetryQueue, PgRetryQueue]]:
    """Two daemons' queues on one database."""
    a = await PgRetryQueue.open(pg_url, boot_id="host-a", rng=random.Random(1))
    b = await PgRetryQueue.open(pg_url, boot_id="host-b", rng=random.Random(2))
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def test_two_daemons_claim_every_job_once(two: tuple[PgRetryQueue, PgRetryQueue]
                                                ) -> None:
    """Claims taken at once by two daemons (FOR UPDATE SKIP LOCKED) never overlap, and
    together they take every due job."""
    a, b = two
    jobs = await asyncio.gather(*(a.enqueue(request(i)) for i in range(120)))
    claimed: list[str] = []
    for _ in range(30):
        batches = await asyncio.gather(a.claim_due(7), b.claim_due(7))
        claimed += [job.id for batch in batches for job in batch]
        if len(claimed) >= len(jobs):
            break
    assert sorted(claimed) == sorted(job.id for job in jobs)
    assert {job.boot_id for job in await a.list_jobs(limit=200)} == {"host-a", "host-b"}


async def test_a_daemon_claims_only_the_capabilities_it_knows(
        two: tuple[PgRetryQueue, PgRetryQueue]) -> None:
    a, b = two
    notes = await a.enqueue(request(1, "notes.append"))
    # another daemon's due job does not wake this one (its sweep would spin on it)
    assert await b.next_wake_at(only={"mail.send"}) is None
    assert await b.next_wake_at(only={"notes.append"}) == notes.next_run_at
    mail = await a.enqueue(request(2, "mail.send"))
    assert [j.id for j in await b.claim_due(10, only={"mail.send"})] == [mail.id]
    assert await b.claim_due(10, only={"mail.send"}) == []
    assert [j.id for j in await a.claim_due(10, only={"notes.append", "x"})] == [notes.id]


async def test_another_daemons_lease_outlives_this_ones_start(pg_url: str) -> None:
    """At a daemon's start nothing of another's is released: its lease runs out first."""
    clock = Clock()
    a = await PgRetryQueue.open(pg_url, boot_id="host-a", clock=clock)
    b = await PgRetryQueue.open(pg_url, boot_id="host-b", clock=clock)
    try:
        await a.enqueue(request())
        (held,) = await a.claim_due(1, grace_s=1)
        assert await b.expire_previous_boot_leases() == 0
        assert await b.claim_due(1) == []
        clock.advance(held.timeout_s + 2)  # host a is gone: its lease runs out
        assert await b.requeue_expired_leases() == 1
        (taken,) = await b.claim_due(1)
        assert (taken.id, taken.fence) == (held.id, held.fence + 1)
        assert await a.complete(held) is False  # the fence: a's late answer is refused
        assert await b.complete(taken) is True
    finally:
        await a.close()
        await b.close()


async def eventually(attempt: Callable[[], Awaitable[T]], within_s: float = 60) -> T:
    """``attempt()`` once it stops raising QueueStorageError (the pool reconnecting)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await attempt()
        except QueueStorageError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def test_a_database_away_at_the_start_and_later_degrades_then_resumes() -> None:
    """The queue opens while the server is down; an enqueue is refused with why (no
    password in it) and kept as the write error; once the server answers, the schema is
    made and jobs are accepted; a server lost later is the same, and so is its return."""
    with postgres_server() as server:
        url = server.url("postgres").replace("postgres@", "postgres:s3cret@")
        server.stop()
        queue = await PgRetryQueue.open(url, backoff=BackoffPolicy(), connect_timeout_s=1)
        try:
            with pytest.raises(QueueStorageError, match="cannot be used") as refused:
                await queue.enqueue(request())
            assert "s3cret" not in str(refused.value)
            assert queue.write_error is not None
            server.start_again()
            job = await eventually(lambda: queue.enqueue(request(1)))
            assert queue.write_error is None
            assert (await queue.get(job.id)).state == "pending"
            server.stop()
            with pytest.raises(QueueStorageError):
                await queue.enqueue(request(2))
            with pytest.raises(QueueStorageError):
                await queue.stats()
            server.start_again()
            assert (await eventually(queue.stats)).by_state["pending"] == 1
            await queue.enqueue(request(3))
            assert (await queue.stats()).by_state["pending"] == 2
        finally:
            await queue.close()
