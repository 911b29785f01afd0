"""Durable queue figures beside plain sqlite3 (WAL + synchronous=FULL, one transaction per job).

Prints, for 1, 8 and 64 concurrent producers: enqueue-acknowledge latency p50/p99
and throughput (every acknowledged job is committed); the full
enqueue → claim → complete cycle throughput; how long after a restart
orphaned leases are back to pending; and how late the sweep picks up a job
after its due time. Files live in a temporary folder on the same disk as the
repository.

    python bench/queue.py [--jobs 4000]
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named queue.py: keep its folder off sys.path so that the standard
# library's `queue` (imported by asyncio and sqlite helpers) is the one found.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse
import asyncio
import os
import queue
import sqlite3
import statistics
import tempfile
import threading
import time

import uvloop
from pydantic import BaseModel

from capd.recovery import EnqueueRequest, Rechecker, RetryQueue, RetrySweep
from capd.recovery._queue_file import MIGRATIONS
from capd.registry import Capability, Registry


def request(n: int) -> EnqueueRequest:
    return EnqueueRequest(capability="bench.write", params={"n": n, "line": "x" * 64},
                          policy="replay", timeout_s=5.0, first_sent_at=time.time())


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def capd_enqueue(path: Path, producers: int, jobs: int) -> tuple[float, list[float]]:
    queue = await RetryQueue.open(path)
    latencies: list[float] = []
    per = jobs // producers

    async def producer(offset: int) -> None:
        for i in range(per):
            started = time.perf_counter()
            await queue.enqueue(request(offset + i))
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(producer(p * per) for p in range(producers)))
    elapsed = time.perf_counter() - started
    await queue.close()
    return per * producers / elapsed, latencies


def sqlite_enqueue(path: Path, producers: int, jobs: int) -> tuple[float, list[float]]:
    """The baseline: each producer thread commits one transaction per job."""
    setup = sqlite3.connect(path)
    setup.execute("PRAGMA journal_mode = WAL")
    setup.execute("CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY, params TEXT)")
    setup.close()
    latencies: list[float] = []
    lock = threading.Lock()
    per = jobs // producers

    def producer() -> None:
        conn = sqlite3.connect(path, isolation_level=None, timeout=30)
        conn.execute("PRAGMA synchronous = FULL")
        mine = []
        for _ in range(per):
            started = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO jobs (params) VALUES (?)", ('{"line": "' + "x" * 64 + '"}',))
            conn.execute("COMMIT")
            mine.append(time.perf_counter() - started)
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=producer) for _ in range(producers)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return per * producers / (time.perf_counter() - started), latencies


def commit_floor(path: Path, rows_per_commit: int, seconds: float = 2.0
                 ) -> tuple[float, float]:
    """What the disk allows: capd's own schema and INSERT, ``rows_per_commit`` rows per
    WAL+FULL COMMIT, in a tight loop with no Python between commits and no thread hop.

    Returns (rows/s, commit p50 seconds). No queue on this disk can acknowledge
    jobs from N producers that each wait for their commit faster than this.
    """
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.executescript(MIGRATIONS[1])
    insert = ("INSERT INTO jobs (id, capability, params, policy, state, attempts, max_attempts,"
              " next_run_at, fence, boot_id, first_sent_at, timeout_s, created_at, updated_at)"
              " VALUES (?, 'bench.write', ?, 'replay', 'pending', 0, 8, ?, 0, 'b', ?, 5, ?, ?)")
    params = '{"line":"' + "x" * 64 + '","n":1}'
    n = 0
    commits: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        now = time.time()
        rows = [(f"{time.time_ns():016x}{n + i:012x}", params, now, now, now, now)
                for i in range(rows_per_commit)]
        started = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(insert, rows)
        conn.execute("COMMIT")
        commits.append(time.perf_counter() - started)
        n += rows_per_commit
    conn.close()
    return n / sum(commits), statistics.median(commits)


async def thread_round_trip(samples: int = 3000) -> float:
    """p50 seconds for event loop → worker thread → event loop, as a queue hop costs."""
    loop = asyncio.get_running_loop()
    inbox: queue.SimpleQueue[asyncio.Future[None] | None] = queue.SimpleQueue()

    def worker() -> None:
        while (future := inbox.get()) is not None:
            loop.call_soon_threadsafe(future.set_result, None)

    thread = threading.Thread(target=worker)
    thread.start()
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        future = loop.create_future()
        inbox.put(future)
        await future
        times.append(time.perf_counter() - started)
    inbox.put(None)
    thread.join()
    return statistics.median(times)


async def capd_cycle(path: Path, jobs: int) -> float:
    queue = await RetryQueue.open(path)
    started = time.perf_counter()
    await asyncio.gather(*(queue.enqueue(request(i)) for i in range(jobs)))
    done = 0
    while done < jobs:
        batch = await queue.claim_due(256)
        await asyncio.gather(*(queue.complete(j) for j in batch))
        done += len(batch)
    elapsed = time.perf_counter() - started
    await queue.close()
    return jobs / elapsed


def sqlite_cycle(path: Path, jobs: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, state TEXT, params TEXT)")
    started = time.perf_counter()
    for _ in range(jobs):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO jobs (state, params) VALUES ('pending', '{}')")
        conn.execute("COMMIT")
    for _ in range(jobs):
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute("UPDATE jobs SET state = 'leased' WHERE id = (SELECT id FROM jobs"
                           " WHERE state = 'pending' LIMIT 1) RETURNING id").fetchone()
        conn.execute("COMMIT")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE jobs SET state = 'done' WHERE id = ?", (row[0],))
        conn.execute("COMMIT")
    conn.close()
    return jobs / (time.perf_counter() - started)


async def orphan_recovery(path: Path, jobs: int) -> float:
    old = await RetryQueue.open(path, boot_id="old")
    await asyncio.gather(*(old.enqueue(request(i)) for i in range(jobs)))
    await old.claim_due(jobs)  # leased by a boot that is about to "die"
    await old.close()
    started = time.perf_counter()
    new = await RetryQueue.open(path, boot_id="new")
    await new.expire_previous_boot_leases()
    elapsed = time.perf_counter() - started
    assert (await new.stats()).by_state["pending"] == jobs
    await new.close()
    return elapsed


async def pickup_lateness(path: Path, samples: int) -> list[float]:
    sweep: RetrySweep | None = None
    queue = await RetryQueue.open(path, on_enqueue=lambda: sweep.wake() if sweep else None)
    seen: dict[int, float] = {}

    class P(BaseModel):
        n: int
        line: str

    async def write(params: P) -> None:
        seen[params.n] = time.time()

    registry = Registry([Capability(name="bench.write", summary="w", parameters=P, func=write,
                                    mutates_state=True, retry_policy="replay")], {}, {})
    sweep = RetrySweep(queue, lambda: registry, Rechecker(lambda: registry))
    stop = asyncio.Event()
    task = asyncio.create_task(sweep.run(stop))
    due: dict[int, float] = {}
    for n in range(samples):
        at = time.time() + 0.2 + (n % 5) * 0.1
        due[n] = at
        await queue.enqueue(EnqueueRequest(capability="bench.write", params={"n": n, "line": ""},
                                           policy="replay", timeout_s=1, first_sent_at=0,
                                           run_at=at))
        await asyncio.sleep(0.05)
    async with asyncio.timeout(30):
        while len(seen) < samples:
            await asyncio.sleep(0.05)
    stop.set()
    await task
    await queue.close()
    return [seen[n] - due[n] for n in range(samples)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=4000)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="capd-qbench-", dir=Path(__file__).resolve().parent.parent))
    print(f"queue bench, {os.cpu_count()} cores, {args.jobs} jobs per figure, files in {root}")
    print("baseline: plain sqlite3, WAL + synchronous=FULL, one transaction per job")
    print(f"{'producers':>9}  {'capd jobs/s':>11} {'p50 ms':>7} {'p99 ms':>7}   "
          f"{'sqlite3 jobs/s':>14} {'p50 ms':>7} {'p99 ms':>7}   ratio")
    try:
        rates = {}
        for producers in (1, 8, 64):
            jobs = args.jobs if producers > 1 else min(args.jobs, 1500)
            rate, lat = uvloop.run(capd_enqueue(root / f"capd-{producers}.db", producers, jobs))
            base, blat = sqlite_enqueue(root / f"base-{producers}.db", producers, jobs)
            rates[producers] = (rate, pct(lat, .5))
            print(f"{producers:>9}  {rate:>11.0f} {pct(lat, .5) * 1e3:>7.2f}"
                  f" {pct(lat, .99) * 1e3:>7.2f}"
                  f"   {base:>14.0f} {pct(blat, .5)*1e3:>7.2f} {pct(blat, .99)*1e3:>7.2f}"
                  f"   {rate / base:5.1f}x")
        floor_rate, floor_commit = commit_floor(root / "floor.db", 8)
        hop = uvloop.run(thread_round_trip())
        rate8, p50_8 = rates[8]
        print(f"floor for 8 producers on this disk: sqlite3 alone, 8 rows per FULL commit, "
              f"no Python between commits: {floor_rate:.0f} rows/s (commit p50 "
              f"{floor_commit * 1e3:.2f} ms); event loop ↔ thread round trip p50 "
              f"{hop * 1e3:.3f} ms")
        print(f"capd with 8 producers: {rate8 / floor_rate:.2f} of the floor's throughput; "
              f"ack p50 {p50_8 * 1e3:.2f} ms against commit + round trip "
              f"{(floor_commit + hop) * 1e3:.2f} ms")
        cycle = uvloop.run(capd_cycle(root / "cycle.db", args.jobs))
        base_cycle = sqlite_cycle(root / "cycle-base.db", min(args.jobs, 1500))
        print(f"enqueue→claim→complete: capd {cycle:.0f} jobs/s, sqlite3 one txn per step "
              f"{base_cycle:.0f} jobs/s, ratio {cycle / base_cycle:.1f}x")
        orphan = uvloop.run(orphan_recovery(root / "orphan.db", 1000))
        print(f"orphaned leases (1000 jobs) back to pending {orphan * 1e3:.1f} ms after reopen")
        late = uvloop.run(pickup_lateness(root / "late.db", 40))
        print(f"sweep pick-up after due time: p50 {statistics.median(late)*1e3:.1f} ms, "
              f"max {max(late)*1e3:.1f} ms (40 jobs)")
    finally:
        for file in root.iterdir():
            file.unlink()
        root.rmdir()


if __name__ == "__main__":
    main()
