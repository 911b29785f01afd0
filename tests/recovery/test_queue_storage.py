"""The queue's file on real storage: creation without replacing, a full disk, postponing a job."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capd.recovery import (
    BackoffPolicy,
    EnqueueRequest,
    Job,
    QueueCorrupt,
    QueueFull,
    QueueStorageError,
    RetryQueue,
)
from capd.recovery._queue_file import SCHEMA_VERSION
from tests.helpers.disks import fill, tmpfs
from tests.helpers.fakes import Clock


def request(n: int = 0) -> EnqueueRequest:
    return EnqueueRequest(capability="notes.append", params={"n": n}, policy="replay",
                          timeout_s=5.0, first_sent_at=990.0)


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def open_queue(path: Path, clock: Clock, reserve_bytes: int = 0) -> RetryQueue:
    """A queue on ``path``; with no reserve by default, so that the tests of a full disk
    reach the disk's own limit (the reserve has tests of its own)."""
    return await RetryQueue.open(path, clock=clock, backoff=BackoffPolicy(max_attempts=3),
                                 boot_id="boot-a", reserve_bytes=reserve_bytes)


# ----------------------------------------------------------------- creation


async def test_a_new_queue_is_built_aside_and_linked_into_place(tmp_path: Path) -> None:
    """A missing queue is created whole: one link to it, the schema current, no temporary left."""
    path = tmp_path / "state" / "q.db"
    q = await RetryQueue.open(path)
    await q.enqueue(request())
    await q.close()
    assert sorted(os.listdir(path.parent)) == ["q.db"]
    assert os.stat(path).st_nlink == 1
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert raw.execute("SELECT count(*) FROM jobs").fetchone() == (1,)


async def test_an_empty_file_is_refused_and_left_alone(tmp_path: Path) -> None:
    """A zero-length queue.db is refused with what to do, and nothing is written beside it."""
    path = tmp_path / "q.db"
    path.touch()
    with pytest.raises(QueueCorrupt, match=r"is empty: not a capd queue; move it aside "
                                           r"\(capd never replaces it\)"):
        await RetryQueue.open(path)
    assert path.stat().st_size == 0
    assert os.listdir(tmp_path) == ["q.db"]


async def test_an_empty_file_with_a_wal_beside_it_says_the_wal_may_hold_jobs(
        tmp_path: Path) -> None:
    """A zero-length queue.db next to a non-empty -wal is refused, naming the -wal to keep."""
    path = tmp_path / "q.db"
    path.touch()
    wal = tmp_path / "q.db-wal"
    wal.write_bytes(b"\x37\x7f\x06\x82" + b"\0" * 28)
    with pytest.raises(QueueCorrupt, match=r"is empty.*q\.db-wal beside it is not empty"):
        await RetryQueue.open(path)
    assert (path.stat().st_size, wal.stat().st_size) == (0, 32)


async def test_a_directory_at_the_queue_path_is_refused(tmp_path: Path) -> None:
    """A folder where the queue file should be is refused, not worked around."""
    (tmp_path / "q.db").mkdir()
    with pytest.raises(QueueCorrupt, match="is not a regular file: not a capd queue"):
        await RetryQueue.open(tmp_path / "q.db")


async def test_a_file_claiming_the_schema_without_its_tables_is_refused(tmp_path: Path) -> None:
    """user_version says capd, but there is no jobs table: refused and left byte for byte."""
    path = tmp_path / "q.db"
    with sqlite3.connect(path) as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        raw.execute("CREATE TABLE other (x)")
    before = path.read_bytes()
    with pytest.raises(QueueCorrupt, match="lacks its tables; move it aside"):
        await RetryQueue.open(path)
    assert path.read_bytes() == before


async def test_two_openers_racing_to_create_share_one_queue(tmp_path: Path) -> None:
    """Two queues opened at once on a missing path end on the same file; no temporary is left."""
    path = tmp_path / "q.db"
    first, second = await asyncio.gather(RetryQueue.open(path), RetryQueue.open(path))
    try:
        job = await first.enqueue(request())
        assert (await second.get(job.id)).id == job.id
    finally:
        await first.close()
        await second.close()
    assert sorted(os.listdir(tmp_path)) == ["q.db"]


async def test_a_queue_linked_first_by_another_process_is_opened_not_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When another capd links its queue between our check and our link, we open theirs."""
    path = tmp_path / "q.db"
    real_link = os.link
    theirs: list[Job] = []

    async def other_capd() -> None:
        other = await RetryQueue.open(path, boot_id="other")
        theirs.append(await other.enqueue(request(7)))
        await other.close()

    def link_after_another_process(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        monkeypatch.setattr(os, "link", real_link)  # the other capd links for real
        asyncio.run(other_capd())  # on the worker thread our link runs in: no loop there
        real_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", link_after_another_process)
    q = await RetryQueue.open(path)
    try:
        (job,) = await q.list_jobs()
        assert job.id == theirs[0].id
    finally:
        await q.close()
    assert sorted(os.listdir(tmp_path)) == ["q.db"]


async def test_an_empty_file_that_appears_during_creation_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file someone else put at the path before our link goes through the same checks."""
    path = tmp_path / "q.db"
    real_link = os.link

    def link_after_someone_touches(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        path.touch()
        real_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", link_after_someone_touches)
    with pytest.raises(QueueCorrupt, match="is empty: not a capd queue"):
        await RetryQueue.open(path)
    assert os.listdir(tmp_path) == ["q.db"]
    assert path.stat().st_size == 0


# ---------------------------------------------------------------- full disk


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB tmpfs, unmounted afterwards."""
    with tmpfs(tmp_path / "small", "2m") as target:
        yield target


def fill_disk(folder: Path) -> Path:
    """Write a filler file until the filesystem has no block left."""
    filler = fill(folder)
    assert os.statvfs(folder).f_bavail == 0
    return filler


async def test_a_full_disk_refuses_writes_keeps_reads_and_recovers(
        small_disk: Path, clock: Clock) -> None:
    """Disk full: enqueue raises QueueFull (the cause, not 'cannot rollback'), reads work, and
    once space returns writes succeed again with every acknowledged job kept."""
    path = small_disk / "q.db"
    q = await open_queue(path, clock)
    try:
        acknowledged = {(await q.enqueue(request(i))).id for i in range(25)}
        filler = fill_disk(small_disk)

        with pytest.raises(QueueFull) as refused:
            await q.enqueue(request(100))
        message = str(refused.value)
        assert message.startswith("disk full:")
        assert str(path) in message
        assert "free space" in message
        assert "cannot rollback" not in message
        assert isinstance(refused.value.__cause__, sqlite3.OperationalError)
        assert q.write_error is not None
        assert q.write_error.startswith("disk full:")
        assert q.write_error_at == clock.now

        batch = await asyncio.gather(*(q.enqueue(request(200 + i)) for i in range(5)),
                                     return_exceptions=True)
        assert all(isinstance(outcome, QueueFull) for outcome in batch)
        assert (await q.stats()).by_state["pending"] == 25
        assert {j.id for j in await q.list_jobs(limit=1000)} == acknowledged

        filler.unlink()
        clock.advance(1)
        late = await q.enqueue(request(300))
        assert (q.write_error, q.write_error_at) == (None, None)
        assert {j.id for j in await q.list_jobs(limit=1000)} == acknowledged | {late.id}
        (claimed,) = await q.claim_due(1)
        assert await q.complete(claimed)
    finally:
        await q.close()
    again = await open_queue(path, clock)
    try:
        assert await again.integrity_check() == "ok"
        stats = await again.stats()
        assert (stats.by_state["pending"], stats.by_state["done"]) == (25, 1)
    finally:
        await again.close()


async def test_a_refused_enqueue_is_reported_until_an_enqueue_succeeds(
        small_disk: Path, clock: Clock) -> None:
    """Another write committing after a refused enqueue (the sweep's claim, which a nearly
    full disk may still take, or a keyed enqueue answered with its stored job) does not
    hide that new jobs were refused; an enqueue that stores a job, or a minute without
    one, does."""
    q = await open_queue(small_disk / "q.db", clock)
    try:
        for i in range(3):
            await q.enqueue(request(i))
        keyed = dataclasses.replace(request(50), idempotency_key="k1")
        await q.enqueue(keyed)
        filler = fill_disk(small_disk)
        with pytest.raises(QueueFull):
            await q.enqueue(request(100))
        await q.enqueue(keyed)  # its key is stored: the same job back, nothing written
        assert q.write_error is not None
        filler.unlink()
        clock.advance(1)
        (claimed,) = await q.claim_due(1)  # commits: the store's own error is cleared
        assert q.write_error_at is None
        assert q.write_error is not None
        assert q.write_error.startswith("disk full:")
        clock.advance(q.REFUSAL_REPORTED_S)
        assert q.write_error is None  # a minute with no enqueue: no longer reported
        filler = fill_disk(small_disk)
        with pytest.raises(QueueFull):
            await q.enqueue(request(101))
        filler.unlink()
        assert await q.complete(claimed)
        assert q.write_error is not None
        await q.enqueue(request(102))
        assert q.write_error is None
    finally:
        await q.close()


async def test_a_claim_on_a_full_disk_changes_nothing(small_disk: Path, clock: Clock) -> None:
    """A sweep write that hits a full disk raises QueueFull and leaves the job as it was."""
    q = await open_queue(small_disk / "q.db", clock)
    try:
        job = await q.enqueue(request())
        filler = fill_disk(small_disk)
        with pytest.raises(QueueFull, match=r"^disk full: could not commit to the queue"):
            await q.claim_due(10)
        unchanged = await q.get(job.id)
        assert (unchanged.state, unchanged.attempts, unchanged.fence) == ("pending", 0, 0)
        filler.unlink()
        (claimed,) = await q.claim_due(10)
        assert (claimed.id, claimed.attempts) == (job.id, 1)
    finally:
        await q.close()


async def test_creating_a_queue_on_a_full_disk_leaves_nothing_behind(small_disk: Path) -> None:
    """No room to create the queue: QueueFull, and neither the queue nor a temporary remains."""
    fill_disk(small_disk)
    with pytest.raises(QueueFull, match=r"^disk full: .*q\.db.*free space"):
        await RetryQueue.open(small_disk / "q.db")
    assert os.listdir(small_disk) == ["filler"]


async def test_a_storage_error_that_is_not_a_full_disk_is_not_queue_full(tmp_path: Path) -> None:
    """A state folder that cannot be made is a QueueStorageError naming it, never 'disk full'."""
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state folder should be")
    with pytest.raises(QueueStorageError, match="cannot create the folder of the queue") as refused:
        await RetryQueue.open(blocker / "q.db")
    assert not isinstance(refused.value, QueueFull)
    assert isinstance(refused.value.__cause__, OSError)


# ------------------------------------------------------------------ postpone


async def test_postpone_returns_a_claimed_job_to_pending_and_refunds_its_attempt(
        tmp_path: Path, clock: Clock) -> None:
    """postpone: pending until run_at, lease cleared, attempts back down, audited with detail."""
    q = await open_queue(tmp_path / "q.db", clock)
    try:
        job = await q.enqueue(request())
        (claimed,) = await q.claim_due(1)
        assert await q.postpone(claimed, run_at=clock.now + 30,
                                detail="an earlier attempt is still running") is True
        waiting = await q.get(job.id)
        assert (waiting.state, waiting.attempts, waiting.lease_until, waiting.next_run_at,
                waiting.fence) == ("pending", 0, None, clock.now + 30, 1)
        last = (await q.attempts(job.id))[-1]
        assert (last.kind, last.outcome, last.detail) == (
            "postpone", "pending", "an earlier attempt is still running")
        assert await q.claim_due(1) == []
        clock.advance(30)
        (again,) = await q.claim_due(1)
        assert (again.attempts, again.fence) == (1, 2)
    finally:
        await q.close()


async def test_postpone_by_a_worker_whose_lease_was_taken_over_is_refused(
        tmp_path: Path, clock: Clock) -> None:
    """A stale worker cannot postpone: False, stale_worker audited, the new holder untouched."""
    q = await open_queue(tmp_path / "q.db", clock)
    try:
        job = await q.enqueue(request())
        (first,) = await q.claim_due(1, grace_s=1)
        clock.advance(60)
        await q.requeue_expired_leases()
        (second,) = await q.claim_due(1, grace_s=1)
        assert await q.postpone(first, run_at=clock.now + 30, detail="still running") is False
        held = await q.get(job.id)
        assert (held.state, held.attempts, held.fence) == ("leased", 2, second.fence)
        trail = await q.attempts(job.id)
        assert (trail[-1].kind, trail[-1].outcome) == ("stale_worker", "rejected")
        assert "postpone to pending refused" in (trail[-1].detail or "")
    finally:
        await q.close()


async def test_postpone_of_a_finished_job_is_refused(tmp_path: Path, clock: Clock) -> None:
    """A job already completed is not brought back to pending by postpone."""
    q = await open_queue(tmp_path / "q.db", clock)
    try:
        job = await q.enqueue(request())
        (claimed,) = await q.claim_due(1)
        assert await q.complete(claimed)
        assert await q.postpone(claimed, run_at=clock.now, detail="late") is False
        done = await q.get(job.id)
        assert (done.state, done.attempts) == ("done", 1)
    finally:
        await q.close()


# ---------------------------------------------------------------- the reserve


async def test_new_jobs_are_refused_under_the_reserve_and_queued_ones_still_finish(
        tmp_path: Path, clock: Clock) -> None:
    """Under the reserve an enqueue is refused (`disk nearly full`, QueueFull) before it
    writes, the refusal is not a write error, and claims and completions still commit in
    the room kept for them; with space back, enqueues succeed again."""
    with tmpfs(tmp_path / "disk", "8m") as disk:
        q = await open_queue(disk / "q.db", clock, reserve_bytes=3 << 20)
        try:
            acknowledged = [await q.enqueue(request(i)) for i in range(40)]
            filler = fill(disk, leave_bytes=2 << 20)  # under the reserve, not full
            q.SPACE_READ_S = 0.0  # read the free space at every enqueue
            with pytest.raises(QueueFull, match="disk nearly full") as refused:
                await q.enqueue(request(999))
            assert "queue_reserve_bytes" in str(refused.value)
            assert q.write_error is None  # a refusal of ours, not a failed write
            free, kept = q.space()  # the reserve, and what the 40 jobs may need to finish
            assert free < 3 << 20 < kept == (3 << 20) + q.owed_bytes
            assert q.owed_bytes >= 40 * q.FINISH_BYTES_PER_JOB
            claimed = await q.claim_due(40)
            assert len(claimed) == 40
            assert all([await q.complete(job) for job in claimed])
            assert (await q.stats()).by_state["done"] == len(acknowledged)
            filler.unlink()
            assert (await q.enqueue(request(1000))).state == "pending"
        finally:
            await q.close()


async def test_an_idle_checkpoint_empties_the_write_ahead_log(tmp_path: Path,
                                                              clock: Clock) -> None:
    path = tmp_path / "q.db"
    q = await open_queue(path, clock)
    try:
        for i in range(200):
            await q.enqueue(request(i))
        wal = path.with_name("q.db-wal")
        assert wal.stat().st_size > 0
        await q.checkpoint("TRUNCATE")
        assert wal.stat().st_size == 0
        assert (await q.stats()).by_state["pending"] == 200
    finally:
        await q.close()


# ---------------------------------------------------------------- a damaged WAL

CRASHER = """
import asyncio, os, sys
from capd.recovery import EnqueueRequest, RetryQueue

async def main():
    q = await RetryQueue.open(__import__("pathlib").Path(sys.argv[1]), reserve_bytes=0)
    for i in range(300):
        await q.enqueue(EnqueueRequest(capability="notes.append", params={"n": i},
                                       policy="replay", timeout_s=5.0, first_sent_at=0.0))
    os._exit(0)  # as kill -9 would: the WAL keeps the 300 acknowledged jobs

asyncio.run(main())
"""


def _crash_with_jobs_in_the_wal(path: Path) -> None:
    import subprocess

    subprocess.run([sys.executable, "-c", CRASHER, str(path)], check=True, timeout=60)
    assert path.with_name(path.name + "-wal").stat().st_size > 0


async def test_a_crash_leaves_a_wal_that_opens_with_every_job(tmp_path: Path,
                                                              clock: Clock) -> None:
    path = tmp_path / "q.db"
    _crash_with_jobs_in_the_wal(path)
    q = await open_queue(path, clock)
    try:
        assert (await q.stats()).by_state["pending"] == 300
    finally:
        await q.close()


@pytest.mark.parametrize("damage", ["magic", "checksum", "page_size", "short", "frame"])
async def test_a_damaged_wal_stops_the_start_and_is_left_as_it_was(
        tmp_path: Path, clock: Clock, damage: str) -> None:
    """A WAL whose header is scribbled (SQLite would read it as empty and drop the 300
    acknowledged jobs it holds) is refused with the advice for a damaged queue, and
    neither file is touched."""
    path = tmp_path / "q.db"
    _crash_with_jobs_in_the_wal(path)
    wal = path.with_name("q.db-wal")
    data = bytearray(wal.read_bytes())
    if damage == "magic":
        data[0:4] = b"\0\0\0\0"
    elif damage == "checksum":
        data[16] ^= 0xFF  # a salt: the header's checksum no longer matches
    elif damage == "page_size":
        data[8:12] = (512).to_bytes(4, "big")
    elif damage == "frame":  # a byte of the second frame's page: SQLite would stop there
        page = int.from_bytes(data[8:12], "big")
        data[32 + (24 + page) + 24 + 100] ^= 0xFF
    else:
        del data[20:]
    wal.write_bytes(bytes(data))
    before = (path.read_bytes(), wal.read_bytes())
    with pytest.raises(QueueCorrupt, match=r"write-ahead log .* is damaged") as refused:
        await open_queue(path, clock)
    assert "move it and q.db aside together" in str(refused.value)
    assert (path.read_bytes(), wal.read_bytes()) == before


async def test_a_wal_torn_at_its_last_frame_opens(tmp_path: Path, clock: Clock) -> None:
    """A crash in the middle of writing the last frame (never committed, never acknowledged)
    is not damage: the queue opens with every job before it."""
    path = tmp_path / "q.db"
    _crash_with_jobs_in_the_wal(path)
    wal = path.with_name("q.db-wal")
    data = bytearray(wal.read_bytes())
    page = int.from_bytes(data[8:12], "big")
    frames = (len(data) - 32) // (24 + page)
    data[32 + (frames - 1) * (24 + page) + 24 + 10] ^= 0xFF
    wal.write_bytes(bytes(data))
    q = await open_queue(path, clock)
    try:
        assert (await q.stats()).by_state["pending"] >= 299
    finally:
        await q.close()


async def test_what_finishing_the_acknowledged_jobs_needs_is_kept(tmp_path: Path,
                                                                   clock: Clock) -> None:
    """owed_bytes grows with each acknowledged job (and its parameters' size), shrinks as
    jobs finish or are cancelled, grows again for an operator's retry, and is read back
    from the file when it is opened again."""
    q = await open_queue(tmp_path / "q.db", clock)
    try:
        assert q.owed_bytes == 0
        jobs = [await q.enqueue(request(i)) for i in range(3)]
        three = q.owed_bytes
        assert three >= 3 * q.FINISH_BYTES_PER_JOB
        (claimed,) = await q.claim_due(1)
        assert await q.complete(claimed)
        await q.cancel(jobs[1].id)
        assert q.owed_bytes == three // 3
        await q.operator_retry(jobs[1].id)
        assert q.owed_bytes == 2 * three // 3
    finally:
        await q.close()
    again = await open_queue(tmp_path / "q.db", clock)
    try:
        assert again.owed_bytes == 2 * three // 3
    finally:
        await again.close()


async def test_jobs_given_up_at_claim_owe_nothing_more(tmp_path: Path, clock: Clock) -> None:
    """Jobs the claim sends to dead (too old) are no longer counted as owed."""
    q = await RetryQueue.open(tmp_path / "q.db", clock=clock, boot_id="boot-a",
                              backoff=BackoffPolicy(max_attempts=3, max_age_s=10),
                              reserve_bytes=0)
    try:
        for i in range(5):
            await q.enqueue(request(i))
        assert q.owed_bytes > 0
        clock.advance(60)
        assert await q.claim_due(10) == []
        assert q.owed_bytes == 0
    finally:
        await q.close()
