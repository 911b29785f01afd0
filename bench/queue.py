"""capd's durable queue beside huey, persist-queue, litequeue and plain sqlite3, all fsyncing.

Every queue runs in this process, pinned to the bench core (see _harness.py),
on SQLite in WAL mode at ``synchronous=FULL`` (set where the library does not,
then read back from the library's own connection and printed), its file in a
fresh temporary folder on the repository's disk.

Figures, in interleaved rounds (each queue once per round, rounds repeated),
median with min-max over rounds:

- the disk's floor: capd's schema and INSERT, 1, 8 and 64 rows per COMMIT in a
  tight loop, no Python between commits: no queue acknowledging jobs that each
  wait for their own commit can beat it;
- enqueue acknowledged (committed) with 1, 8 and 64 concurrent producers:
  throughput and ack latency p50/p99. capd's producers are coroutines (one
  group-committing writer); the others' are threads, as their APIs are
  synchronous. The plain-sqlite3 baseline is one serialized writer thread,
  one transaction per job, that the producer threads hand their jobs to;
- the enqueue → claim → complete cycle batch for batch: B jobs enqueued, B
  claimed, B completed, repeated, for B = 1, 8 and 64, each queue using the
  batching its API offers (capd: B concurrent calls group-committed; plain
  sqlite3: one transaction per step; litequeue: put and done inside its
  ``transaction()``; huey and persist-queue: none, one commit per call);
- capd only: orphaned leases back to pending after a restart, and how late the
  sweep picks up a job after its due time.

    python bench/queue.py [--jobs 1024] [--rounds 3] [--results FILE]
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
import json
import os
import queue
import shutil
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
import uvloop
from pydantic import BaseModel

from bench._harness import REPO, SERVER_CPUS, Results, pin, spread
from bench._queues import LINE, PEERS, SYNC_NAMES, Huey, LiteQueue, PersistQueue, PlainSqlite
from bench._servers import installed
from capd.recovery import EnqueueRequest, Rechecker, RetryQueue, RetrySweep
from capd.recovery._queue_file import MIGRATIONS
from capd.registry import Capability, Registry


def request(n: int) -> EnqueueRequest:
    return EnqueueRequest(capability="bench.write", params={"n": n, "line": LINE},
                          policy="replay", timeout_s=5.0, first_sent_at=time.time())


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


CAPD = "capd RetryQueue"


def thread_enqueue(make: Callable[[], Any], producers: int, jobs: int
                   ) -> tuple[float, list[float]]:
    """``producers`` threads each enqueue jobs // producers; (jobs/s, ack latencies)."""
    target = make()
    latencies: list[float] = []
    lock = threading.Lock()
    per = jobs // producers
    gate = threading.Barrier(producers + 1)

    def producer(offset: int) -> None:
        mine = []
        gate.wait()
        for i in range(per):
            started = time.perf_counter()
            target.enqueue(offset + i)
            mine.append(time.perf_counter() - started)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=producer, args=(p * per,)) for p in range(producers)]
    for t in threads:
        t.start()
    gate.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    target.close()
    return per * producers / elapsed, latencies


async def capd_enqueue(path: Path, producers: int, jobs: int) -> tuple[float, list[float]]:
    q = await RetryQueue.open(path)
    latencies: list[float] = []
    per = jobs // producers

    async def producer(offset: int) -> None:
        for i in range(per):
            started = time.perf_counter()
            await q.enqueue(request(offset + i))
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(producer(p * per) for p in range(producers)))
    elapsed = time.perf_counter() - started
    await q.close()
    return per * producers / elapsed, latencies


async def capd_cycle(path: Path, batch: int, jobs: int) -> tuple[float, float]:
    """(jobs/s, commits per batch) of enqueue → claim → complete, ``batch`` jobs at a time."""
    q = await RetryQueue.open(path)
    before = q.batches
    started = time.perf_counter()
    for first in range(0, jobs, batch):
        await asyncio.gather(*(q.enqueue(request(first + i)) for i in range(batch)))
        claimed = await q.claim_due(batch)
        assert len(claimed) == batch
        await asyncio.gather(*(q.complete(j) for j in claimed))
    elapsed = time.perf_counter() - started
    commits = (q.batches - before) / (jobs // batch)
    await q.close()
    return jobs / elapsed, commits


async def capd_pragmas(path: Path) -> str:
    q = await RetryQueue.open(path)
    rows = [await q._store.read(f"PRAGMA {name}") for name in ("journal_mode", "synchronous")]
    await q.close()
    return f"journal_mode={rows[0][0][0]} synchronous={SYNC_NAMES.get(rows[1][0][0])}"


def commit_floor(path: Path, rows_per_commit: int, seconds: float = 1.0
                 ) -> tuple[float, float]:
    """What the disk allows: capd's own schema and INSERT, ``rows_per_commit`` rows per
    WAL+FULL COMMIT, in a tight loop with no Python between commits and no thread hop.

    Returns (rows/s, commit p50 seconds).
    """
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.executescript(MIGRATIONS[1])
    params = json.dumps({"line": LINE, "n": 1})
    n = 0
    commits: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        now = time.time()
        rows = [(f"{time.time_ns():016x}{n + i:012x}", params, now, now, now, now)
                for i in range(rows_per_commit)]
        started = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(PlainSqlite.insert, rows)
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
    q = await RetryQueue.open(path, on_enqueue=lambda: sweep.wake() if sweep else None)
    seen: dict[int, float] = {}

    class P(BaseModel):
        n: int
        line: str

    async def write(params: P) -> None:
        seen[params.n] = time.time()

    registry = Registry([Capability(name="bench.write", summary="w", parameters=P, func=write,
                                    mutates_state=True, retry_policy="replay")], {}, {})
    sweep = RetrySweep(q, lambda: registry, Rechecker(lambda: registry))
    stop = asyncio.Event()
    task = asyncio.create_task(sweep.run(stop))
    due: dict[int, float] = {}
    for n in range(samples):
        at = time.time() + 0.2 + (n % 5) * 0.1
        due[n] = at
        await q.enqueue(EnqueueRequest(capability="bench.write", params={"n": n, "line": ""},
                                       policy="replay", timeout_s=1, first_sent_at=0,
                                       run_at=at))
        await asyncio.sleep(0.05)
    async with asyncio.timeout(30):
        while len(seen) < samples:
            await asyncio.sleep(0.05)
    stop.set()
    await task
    await q.close()
    return [seen[n] - due[n] for n in range(samples)]


def scratch_root() -> Path:
    """A folder on the repository's disk: /tmp when it is the same device, else the repo."""
    tmp = Path(tempfile.gettempdir())
    base = tmp if tmp.stat().st_dev == REPO.stat().st_dev else REPO
    return Path(tempfile.mkdtemp(prefix="capd-qbench-", dir=base))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1024, help="jobs per figure (per round)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", type=Path, default=None)
    args = parser.parse_args()
    # capd's queue logs each migration and replay at info: keep the table readable.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    pin(SERVER_CPUS)  # every queue and its threads on the bench core, as the servers are
    jobs = max(64, args.jobs // 64 * 64)
    results = Results(args.results)
    root = scratch_root()
    peers = [(label, cls) for label, cls in PEERS if installed(label)]
    missing = [label for label, _ in PEERS if not installed(label)]
    counter = 0

    def fresh() -> Path:
        nonlocal counter
        counter += 1
        folder = root / f"run{counter}"
        folder.mkdir()
        return folder

    def discard(folder: Path) -> None:
        shutil.rmtree(folder, ignore_errors=True)

    queues: list[tuple[str, Any]] = [(PlainSqlite.name, PlainSqlite)] + [
        (cls.name, cls) for _, cls in peers]
    try:
        print(f"queue bench, {os.cpu_count()} cores, {jobs} jobs per figure, {args.rounds} "
              f"interleaved rounds, files under {root}")
        if missing:
            print(f"not installed, skipped: {', '.join(missing)} (pip install -e '.[bench]')")
        print("pragmas read back from each library's own connection:")
        folder = fresh()
        print(f"  {CAPD:<40} {uvloop.run(capd_pragmas(folder / 'capd.db'))}")
        discard(folder)
        for name, cls in queues:
            folder = fresh()
            target = cls(folder)
            default = getattr(target, "default", None)
            print(f"  {name:<40} {target.pragmas()}"
                  + (f" (library default: {default}; raised)" if default else ""))
            target.close()
            discard(folder)

        # ---- the disk's floor
        floors: dict[int, list[tuple[float, float]]] = {}
        for _ in range(args.rounds):
            for rows in (1, 8, 64):
                folder = fresh()
                floors.setdefault(rows, []).append(commit_floor(folder / "floor.db", rows))
                discard(folder)
        print("the disk's floor (capd's schema, sqlite3 alone, no Python between commits):")
        for rows, got in floors.items():
            median, lo, hi = spread([r for r, _ in got])
            commit = statistics.median(c for _, c in got)
            print(f"  {rows:>2} rows per commit: {median:>8.0f} rows/s ({lo:.0f}-{hi:.0f}), "
                  f"commit p50 {commit * 1e3:.2f} ms")
            results.add("queue floor", f"{rows} row{'s' * (rows > 1)} per FULL commit",
                        [r for r, _ in got], "rows/s", note=f"commit p50 {commit * 1e3:.2f} ms")
        hop = uvloop.run(thread_round_trip())

        # ---- enqueue acknowledged
        enq: dict[tuple[str, int], list[tuple[float, list[float]]]] = {}
        for _ in range(args.rounds):
            for producers in (1, 8, 64):
                folder = fresh()
                enq.setdefault((CAPD, producers), []).append(
                    uvloop.run(capd_enqueue(folder / "capd.db", producers, jobs)))
                discard(folder)
                for name, cls in queues:
                    folder = fresh()
                    enq.setdefault((name, producers), []).append(
                        thread_enqueue(lambda cls=cls, folder=folder: cls(folder), producers,
                                       jobs))
                    discard(folder)
        print("enqueue acknowledged (committed), concurrent producers:")
        print(f"  {'queue':<40}{'producers':>10}{'jobs/s':>9}{'min-max':>14}{'p50 ms':>8}"
              f"{'p99 ms':>8}  vs plain sqlite3")
        for producers in (1, 8, 64):
            base = [r for r, _ in enq[(PlainSqlite.name, producers)]]
            floor = [r for r, _ in floors[producers]]
            capd_rates = [r for r, _ in enq[(CAPD, producers)]]
            to_floor = statistics.median(capd_rates) / statistics.median(floor)
            for name in [CAPD] + [n for n, _ in queues]:
                got = enq[(name, producers)]
                rates = [r for r, _ in got]
                median, lo, hi = spread(rates)
                mid = sorted(got, key=lambda r: r[0])[len(got) // 2][1]
                ratio = median / statistics.median(base)
                print(f"  {name:<40}{producers:>10}{median:>9.0f}{f'{lo:.0f}-{hi:.0f}':>14}"
                      f"{pct(mid, .5) * 1e3:>8.2f}{pct(mid, .99) * 1e3:>8.2f}  {ratio:.2f}x")
                results.add("queue enqueue", f"{name}, {producers} producers", rates, "jobs/s",
                            against="" if name == PlainSqlite.name else PlainSqlite.name,
                            against_values=None if name == PlainSqlite.name else base,
                            note=f"ack p50 {pct(mid, .5) * 1e3:.2f} ms, "
                                 f"p99 {pct(mid, .99) * 1e3:.2f} ms"
                                 + (f"; {to_floor:.2f} of the floor at {producers} rows per "
                                    "commit" if name == CAPD else ""))
            print(f"  capd / floor at {producers} rows per commit: {to_floor:.2f}")
        commit1 = statistics.median(c for _, c in floors[1])
        capd1 = sorted(enq[(CAPD, 1)], key=lambda r: r[0])[len(enq[(CAPD, 1)]) // 2][1]
        print(f"  one producer: capd ack p50 {pct(capd1, .5) * 1e3:.2f} ms against one commit "
              f"+ a loop-thread round trip {(commit1 + hop) * 1e3:.2f} ms")

        # ---- the cycle, batch for batch
        cyc: dict[tuple[str, int], list[float]] = {}
        capd_commits: dict[int, list[float]] = {}
        for _ in range(args.rounds):
            for batch in (1, 8, 64):
                folder = fresh()
                rate, commits = uvloop.run(capd_cycle(folder / "capd.db", batch, jobs))
                cyc.setdefault((CAPD, batch), []).append(rate)
                capd_commits.setdefault(batch, []).append(commits)
                discard(folder)
                for name, cls in queues:
                    folder = fresh()
                    target = cls(folder)
                    cyc.setdefault((name, batch), []).append(target.cycle(batch, jobs))
                    target.close()
                    discard(folder)
        commits_per_batch = {CAPD: "measured {:.1f}", PlainSqlite.name: "3",
                             Huey.name: "4B", PersistQueue.name: "3B", LiteQueue.name: "2 + B"}
        print("enqueue → claim → complete, batch for batch (B jobs per step):")
        print(f"  {'queue':<40}{'B':>4}{'jobs/s':>9}{'min-max':>14}  commits/batch  "
              "vs plain sqlite3")
        for batch in (1, 8, 64):
            base = cyc[(PlainSqlite.name, batch)]
            for name in [CAPD] + [n for n, _ in queues]:
                rates = cyc[(name, batch)]
                median, lo, hi = spread(rates)
                commits = commits_per_batch[name].format(statistics.median(
                    capd_commits[batch]))
                print(f"  {name:<40}{batch:>4}{median:>9.0f}{f'{lo:.0f}-{hi:.0f}':>14}  "
                      f"{commits:<13}  {median / statistics.median(base):.2f}x")
                results.add("queue cycle", f"{name}, B={batch}", rates, "jobs/s",
                            against="" if name == PlainSqlite.name else PlainSqlite.name,
                            against_values=None if name == PlainSqlite.name else base,
                            note=f"commits per batch: {commits}")

        # ---- capd alone
        orphans = []
        lateness: list[float] = []
        for _ in range(args.rounds):
            folder = fresh()
            orphans.append(uvloop.run(orphan_recovery(folder / "orphan.db", 1000)))
            discard(folder)
        folder = fresh()
        lateness = uvloop.run(pickup_lateness(folder / "late.db", 40))
        discard(folder)
        median, lo, hi = spread(orphans)
        print(f"orphaned leases (1000 jobs) back to pending {median * 1e3:.1f} ms after reopen "
              f"({lo * 1e3:.1f}-{hi * 1e3:.1f})")
        results.add("queue recovery", "1000 orphaned leases back to pending after reopen",
                    [o * 1e3 for o in orphans], "ms")
        print(f"sweep pick-up after due time: p50 {statistics.median(lateness) * 1e3:.1f} ms, "
              f"max {max(lateness) * 1e3:.1f} ms (40 jobs)")
        results.add("queue recovery", "sweep pick-up after due time, p50 of 40 jobs",
                    [statistics.median(lateness) * 1e3], "ms",
                    note=f"max {max(lateness) * 1e3:.1f} ms")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
