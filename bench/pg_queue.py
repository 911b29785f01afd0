"""capd's PostgreSQL queue beside procrastinate and PostgreSQL's own floor, on one server.

One PostgreSQL server is started for the run (tests/helpers/pg.py: initdb in a
temporary folder, a Unix socket only, ``fsync=on``, ``synchronous_commit`` at
its default, ``on``, read back through each system's own connection and
printed). Each system gets its own fresh database on it:

- capd: :class:`PgRetryQueue` (``pool_size`` 8: one to eight pooled
  connections, one transaction per enqueue);
- procrastinate: an ``App`` on its ``PsycopgConnector`` (psycopg 3 async pool,
  one to eight connections, with the checkout check procrastinate sets), its
  schema applied with ``SchemaManager.apply_schema_async``;
- the floor: plain psycopg 3 async, no pool, capd's own table and row, a plain
  ``INSERT`` (no RETURNING) in autocommit: one INSERT, one COMMIT. With P
  producers it is P connections, one producer on each.

Figures, in interleaved rounds (each round runs every system once per figure,
the order rotating from round to round), median with min-max over rounds:

- enqueue acknowledged (committed), P = 1, 8 and 64 concurrent producers
  (asyncio tasks in this process) calling back to back for ``--seconds``:
  capd ``enqueue``; procrastinate ``Task.defer_async`` of a trivial task; the
  floor's INSERTs as above;
- claim → complete, B = 8 and 64: ``--cycle-jobs`` jobs enqueued beforehand
  (not timed), then taken B at a time and each finished (B concurrent calls)
  until none is left. capd: ``claim_due(B)`` (one transaction) then
  ``complete`` each; procrastinate: B concurrent ``JobManager.fetch_job`` (it
  fetches one job per call, as its worker does) then ``finish_job(succeeded)``
  each. No floor row.

Before each figure the system's tables are emptied (TRUNCATE) and a CHECKPOINT
is taken (not timed), so that every figure starts from the same state and pays
the same full-page writes. The pools are warmed first (grown to their size,
statements prepared).

Placement: PostgreSQL (the postmaster, its running children, and so every
backend it forks later) on the bench's server core and this process on the
generator's (bench/_harness.py: the last core and the first), each at nice -10
unless ``--share-machine`` (keep the default priority while other work that
must not be starved shares the machine). The client's and the server's CPU
use during each figure go to ``--out``.

    python bench/pg_queue.py [--seconds 2] [--rounds 3] [--cycle-jobs 1024]
                             [--pool-size 8] [--out bench/pg-queue-result.json]
                             [--results FILE] [--share-machine]
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from importlib import metadata
from typing import Any, Protocol

import psycopg
import pytest
import structlog
import uvloop
from psycopg.rows import tuple_row

from bench._harness import (
    GENERATOR_CPUS,
    PRIORITY,
    SERVER_CPUS,
    Results,
    machine,
    pin,
    spread,
    tree_cpu_s,
)
from bench._queues import LINE
from capd.recovery import EnqueueRequest, PgRetryQueue
from capd.recovery._pg_queue import PG_MIGRATIONS
from tests.helpers.pg import PostgresServer, postgres_server

PRODUCERS = (1, 8, 64)
BATCHES = (8, 64)
FIGURE_TIMEOUT_S = 120.0  # a figure that takes longer has hung: fail the run, stop the server
SETTINGS = ("fsync", "synchronous_commit", "wal_sync_method", "commit_delay", "full_page_writes",
            "wal_level", "shared_buffers")

# The floor's row: capd's table and the columns capd's enqueue fills, values as capd's.
FLOOR_INSERT = (
    "INSERT INTO capd_jobs (id, capability, params, policy, state, attempts, max_attempts,"
    " next_run_at, fence, boot_id, first_sent_at, timeout_s, created_at, updated_at)"
    " VALUES (%s, 'bench.write', %s, 'replay', 'pending', 0, 8, %s, 0, 'bench', %s, 5, %s, %s)")


def request(n: int) -> EnqueueRequest:
    return EnqueueRequest(capability="bench.write", params={"n": n, "line": LINE},
                          policy="replay", timeout_s=5.0, first_sent_at=time.time())


def write(n: int, line: str) -> None:
    """procrastinate's trivial task (never run here: only deferred, fetched and finished)."""


class System(Protocol):
    """What the bench drives: one queue (or the floor) on its own database."""

    name: str
    admin: psycopg.AsyncConnection[Any]
    tables: str  # what TRUNCATE empties before each figure

    async def enqueue(self, producer: int, n: int) -> None: ...

    async def fill(self, jobs: int) -> None: ...

    async def cycle(self, batch: int) -> int: ...

    async def session(self, name: str) -> str: ...

    def pool(self) -> str: ...

    async def close(self) -> None: ...


async def connect(url: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(url, autocommit=True)


async def show(conn: psycopg.AsyncConnection[Any], name: str) -> str:
    """The setting ``name`` as the session of ``conn`` has it (whatever its row factory)."""
    async with conn.cursor(row_factory=tuple_row) as cursor:
        row = await (await cursor.execute(f"SHOW {name}")).fetchone()
    return str(row[0]) if row else "?"


async def gather_chunks(calls: Callable[[int], Awaitable[object]], jobs: int,
                        width: int = 64) -> None:
    """``calls(n)`` for n < ``jobs``, ``width`` at a time (not timed: filling and warming)."""
    for first in range(0, jobs, width):
        await asyncio.gather(*(calls(n) for n in range(first, min(jobs, first + width))))


class Capd:
    """capd's PgRetryQueue, as the daemon opens it."""

    name = "capd"
    tables = "capd_jobs, capd_attempts"

    def __init__(self, queue: PgRetryQueue, admin: psycopg.AsyncConnection[Any]) -> None:
        self.queue = queue
        self.admin = admin

    @classmethod
    async def open(cls, url: str, pool_size: int) -> Capd:
        return cls(await PgRetryQueue.open(url, pool_size=pool_size), await connect(url))

    async def enqueue(self, producer: int, n: int) -> None:
        await self.queue.enqueue(request(n))

    async def fill(self, jobs: int) -> None:
        await gather_chunks(lambda n: self.queue.enqueue(request(n)), jobs)

    async def cycle(self, batch: int) -> int:
        done = 0
        while claimed := await self.queue.claim_due(batch):
            done += sum(await asyncio.gather(*(self.queue.complete(j) for j in claimed)))
        return done

    async def session(self, name: str) -> str:
        # The queue's own pooled connection (a private attribute: the bench reads what
        # capd's sessions run with, not what a fresh connection would).
        async with self.queue._store._pool.connection() as conn:
            return await show(conn, name)

    def pool(self) -> str:
        stats = self.queue._store._pool.get_stats()
        return f"{stats.get('pool_size')} of {self.queue._store._pool.max_size} connections"

    async def close(self) -> None:
        await self.queue.close()
        await self.admin.close()


class Procrastinate:
    """procrastinate's App on its PsycopgConnector; one registered worker id for fetching."""

    name = "procrastinate"
    tables = "procrastinate_jobs CASCADE"  # and its events and periodic defers

    def __init__(self, app: Any, task: Any, worker_id: int,
                 admin: psycopg.AsyncConnection[Any]) -> None:
        self.app = app
        self.task = task
        self.worker_id = worker_id
        self.admin = admin

    @classmethod
    async def open(cls, url: str, pool_size: int) -> Procrastinate:
        import procrastinate

        app = procrastinate.App(connector=procrastinate.PsycopgConnector(
            conninfo=url, min_size=1, max_size=pool_size))
        await app.open_async()
        await app.schema_manager.apply_schema_async()
        task = app.task(name="bench_write")(write)
        worker_id = await app.job_manager.register_worker()
        return cls(app, task, worker_id, await connect(url))

    async def enqueue(self, producer: int, n: int) -> None:
        await self.task.defer_async(n=n, line=LINE)

    async def fill(self, jobs: int) -> None:
        await gather_chunks(lambda n: self.task.defer_async(n=n, line=LINE), jobs)

    async def cycle(self, batch: int) -> int:
        from procrastinate.jobs import Status

        manager = self.app.job_manager
        done = 0
        while True:
            fetched = [job for job in await asyncio.gather(
                *(manager.fetch_job(queues=None, worker_id=self.worker_id)
                  for _ in range(batch))) if job is not None]
            if not fetched:
                return done
            await asyncio.gather(*(manager.finish_job(job, Status.SUCCEEDED, delete_job=False)
                                   for job in fetched))
            done += len(fetched)

    async def session(self, name: str) -> str:
        async with self.app.connector.pool.connection() as conn:
            return await show(conn, name)

    def pool(self) -> str:
        pool = self.app.connector.pool
        return f"{pool.get_stats().get('pool_size')} of {pool.max_size} connections"

    async def close(self) -> None:
        await self.app.close_async()
        await self.admin.close()


class Floor:
    """Plain psycopg 3: one connection per producer, an autocommit INSERT of capd's row."""

    name = "floor"
    tables = "capd_jobs, capd_attempts"

    def __init__(self, conns: list[psycopg.AsyncConnection[Any]],
                 admin: psycopg.AsyncConnection[Any]) -> None:
        self.conns = conns
        self.admin = admin
        self.counter = 0

    @classmethod
    async def open(cls, url: str, connections: int) -> Floor:
        admin = await connect(url)
        await admin.execute(PG_MIGRATIONS[1])
        return cls([await connect(url) for _ in range(connections)], admin)

    async def enqueue(self, producer: int, n: int) -> None:
        self.counter += 1
        now = time.time()
        await self.conns[producer].execute(FLOOR_INSERT, (
            f"{time.time_ns():016x}{self.counter:012x}",
            json.dumps({"line": LINE, "n": n}, separators=(",", ":")), now, now, now, now))

    async def fill(self, jobs: int) -> None:
        raise NotImplementedError("the floor has no claim → complete figure")

    async def cycle(self, batch: int) -> int:
        raise NotImplementedError("the floor has no claim → complete figure")

    async def session(self, name: str) -> str:
        return await show(self.conns[0], name)

    def pool(self) -> str:
        return f"{len(self.conns)} connections, no pool"

    async def close(self) -> None:
        for conn in [*self.conns, self.admin]:
            await conn.close()


@dataclass
class Sample:
    """One figure of one system in one round."""

    rate: float  # jobs/s
    jobs: int
    seconds: float
    p50_ms: float | None  # per call (enqueue figures only)
    p99_ms: float | None
    client_cpu: float  # this process's CPU seconds per second of the figure
    server_cpu: float  # PostgreSQL's (every backend's) CPU seconds per second


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def prepare(system: System) -> None:
    """Empty the system's tables and checkpoint (not timed)."""
    await system.admin.execute(f"TRUNCATE {system.tables}")
    await system.admin.execute("CHECKPOINT")


async def measure(server_pid: int, work: Callable[[], Awaitable[int]],
                  latencies: list[float] | None = None) -> Sample:
    cpu, pg = time.process_time(), tree_cpu_s(server_pid)
    started = time.perf_counter()
    async with asyncio.timeout(FIGURE_TIMEOUT_S):
        jobs = await work()
    elapsed = time.perf_counter() - started
    cpu, pg = time.process_time() - cpu, tree_cpu_s(server_pid) - pg
    return Sample(jobs / elapsed, jobs, elapsed,
                  percentile(latencies, 0.5) * 1e3 if latencies else None,
                  percentile(latencies, 0.99) * 1e3 if latencies else None,
                  cpu / elapsed, pg / elapsed)


async def enqueue_figure(system: System, producers: int, seconds: float,
                         server_pid: int) -> Sample:
    """``producers`` tasks enqueueing back to back for ``seconds``; every call counted
    (the last ones finish after the deadline, and the time includes them)."""
    await prepare(system)
    latencies: list[float] = []
    deadline = 0.0

    async def producer(p: int) -> int:
        n = 0
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            await system.enqueue(p, p * 10_000_000 + n)
            latencies.append(time.perf_counter() - started)
            n += 1
        return n

    async def work() -> int:
        nonlocal deadline
        deadline = time.perf_counter() + seconds
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(producer(p)) for p in range(producers)]
        return sum(t.result() for t in tasks)

    return await measure(server_pid, work, latencies)


async def cycle_figure(system: System, batch: int, jobs: int, server_pid: int) -> Sample:
    """``jobs`` jobs enqueued (not timed), then claimed ``batch`` at a time and completed."""
    await system.admin.execute(f"TRUNCATE {system.tables}")
    await system.fill(jobs)
    await system.admin.execute("CHECKPOINT")

    async def work() -> int:
        done = await system.cycle(batch)
        assert done == jobs, (system.name, done, jobs)
        return done

    return await measure(server_pid, work)


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(child for child, parent in parents.items() if parent == current)
    return found


def place_server(server: PostgresServer, cpus: set[int] | None, raise_priority: bool) -> int:
    """Pin the postmaster and its children (backends forked later inherit it) to ``cpus``;
    return the postmaster's pid."""
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    for pid in descendants(postmaster):
        with contextlib.suppress(ProcessLookupError):
            if cpus is not None:
                os.sched_setaffinity(pid, cpus)
            if raise_priority:
                with contextlib.suppress(PermissionError):
                    os.setpriority(os.PRIO_PROCESS, pid, PRIORITY)
    return postmaster


async def backend_cpus(conn: psycopg.AsyncConnection[Any]) -> str:
    """The CPUs the backend behind ``conn`` may run on (to show that placement held)."""
    row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
    assert row is not None
    status = Path(f"/proc/{row[0]}/status").read_text()
    return next(line.split(":", 1)[1].strip() for line in status.splitlines()
                if line.startswith("Cpus_allowed_list"))


@dataclass
class Figure:
    label: str
    kind: str  # "enqueue" or "cycle"
    size: int  # producers or batch
    systems: tuple[str, ...]


def figures() -> Iterator[Figure]:
    for p in PRODUCERS:
        yield Figure(f"enqueue, {p} producer{'s' * (p > 1)}", "enqueue", p,
                     ("capd", "procrastinate", "floor"))
    for b in BATCHES:
        yield Figure(f"claim → complete, B={b}", "cycle", b, ("capd", "procrastinate"))


async def enqueue_any(system: System, n: int) -> None:
    await system.enqueue(n % max(PRODUCERS), n)


async def run(args: argparse.Namespace, urls: dict[str, str], server_pid: int) -> dict[str, Any]:
    systems: dict[str, System] = {}
    try:
        systems["capd"] = await Capd.open(urls["capd"], args.pool_size)
        systems["procrastinate"] = await Procrastinate.open(urls["procrastinate"],
                                                            args.pool_size)
        systems["floor"] = await Floor.open(urls["floor"], max(PRODUCERS))
        # Warm up: grow the pools, let psycopg prepare the statements (after 5 uses each).
        for name, system in systems.items():
            if name == "floor":
                for _ in range(6):
                    await asyncio.gather(*(system.enqueue(p, p) for p in range(max(PRODUCERS))))
            else:
                await gather_chunks(partial(enqueue_any, system), 512)
                await system.cycle(64)
            await system.admin.execute(f"TRUNCATE {system.tables}")

        server_settings = {name: await show(systems["floor"].admin, name) for name in SETTINGS}
        sessions = {name: {s: await system.session(s) for s in ("fsync", "synchronous_commit")}
                    for name, system in systems.items()}
        placement = {"server_cpus": await backend_cpus(systems["floor"].admin),
                     "client_cpus": ",".join(map(str, sorted(os.sched_getaffinity(0)))),
                     "priority_raised": not args.share_machine}
        pools = {name: system.pool() for name, system in systems.items()}
        print(f"PostgreSQL {server_settings}")
        for name in systems:
            print(f"  {name:<14} session {sessions[name]}; {pools[name]}")
        print(f"  PostgreSQL backends on CPU {placement['server_cpus']}, this process on CPU "
              f"{placement['client_cpus']}"
              + ("" if placement["priority_raised"] else " (default priority: --share-machine)"))

        samples: dict[tuple[str, str], list[Sample]] = {}
        order = list(systems)
        for round_no in range(args.rounds):
            rotated = order[round_no % len(order):] + order[:round_no % len(order)]
            for figure in figures():
                for name in (n for n in rotated if n in figure.systems):
                    if figure.kind == "enqueue":
                        sample = await enqueue_figure(systems[name], figure.size, args.seconds,
                                                      server_pid)
                    else:
                        sample = await cycle_figure(systems[name], figure.size,
                                                    args.cycle_jobs, server_pid)
                    samples.setdefault((figure.label, name), []).append(sample)
            print(f"  round {round_no + 1}/{args.rounds} done", flush=True)
    finally:
        for system in systems.values():
            await system.close()
    return {"settings": server_settings, "sessions": sessions, "placement": placement,
            "pools_after_warmup": pools, "samples": samples}


def summarize(samples: list[Sample]) -> dict[str, Any]:
    median, lo, hi = spread([s.rate for s in samples])

    def mid(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None

    return {"median": median, "lo": lo, "hi": hi,
            "ack_p50_ms": mid([s.p50_ms for s in samples]),
            "ack_p99_ms": mid([s.p99_ms for s in samples]),
            "client_cpu": mid([s.client_cpu for s in samples]),
            "server_cpu": mid([s.server_cpu for s in samples]),
            "rounds": [asdict(s) for s in samples]}


def cell(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return "—"
    return f"{summary['median']:,.0f} ({summary['lo']:,.0f}-{summary['hi']:,.0f})"


def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    return a["median"] / b["median"] if a and b and b["median"] else None


def report(args: argparse.Namespace, got: dict[str, Any]) -> dict[str, Any]:
    results = Results(args.results)
    rows: list[dict[str, Any]] = []
    print()
    print("| figure | capd | procrastinate | floor | capd/procrastinate | capd/floor |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for figure in figures():
        per = {name: summarize(got["samples"][(figure.label, name)]) for name in figure.systems}
        to_peer = ratio(per["capd"], per["procrastinate"])
        to_floor = ratio(per["capd"], per.get("floor"))
        print(f"| {figure.label} | {cell(per['capd'])} | {cell(per['procrastinate'])} | "
              f"{cell(per.get('floor'))} | {f'{to_peer:.2f}' if to_peer else '—'} | "
              f"{f'{to_floor:.2f}' if to_floor else '—'} |")
        rows.append({"figure": figure.label, "unit": "jobs/s", **per,
                     "capd/procrastinate": to_peer, "capd/floor": to_floor})
        area = f"pg queue {figure.kind}"
        for name in figure.systems:
            values = [s.rate for s in got["samples"][(figure.label, name)]]
            against = [s.rate for s in got["samples"][(figure.label, "procrastinate")]]
            results.add(area, f"{name}, {figure.label}", values, "jobs/s",
                        against="" if name != "capd" else "procrastinate",
                        against_values=against if name == "capd" else None,
                        note=(f"{to_floor:.2f} of the floor" if name == "capd" and to_floor
                              else ""))
    top = next(r for r in rows if r["figure"] == f"enqueue, {max(PRODUCERS)} producers")
    goals = {"capd/procrastinate enqueue at 64 producers >= 0.8": (top["capd/procrastinate"]
                                                                   or 0) >= 0.8,
             "capd/floor at 64 producers >= 0.5": (top["capd/floor"] or 0) >= 0.5}
    print()
    print("floor: plain psycopg 3 async, capd's table and row, one autocommit INSERT per COMMIT "
          "(no RETURNING), P connections with one producer each; capd and procrastinate: "
          f"pools of at most {args.pool_size} connections. Median (min-max) of "
          f"{args.rounds} interleaved rounds, jobs/s.")
    for goal, met in goals.items():
        print(f"goal {goal}: {'met' if met else 'NOT met'}")
    return {"rows": rows, "goals": goals}


def versions() -> dict[str, str]:
    found = {}
    for name in ("procrastinate", "psycopg", "psycopg-pool", "psycopg-binary", "uvloop"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def stop_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM as SystemExit, so that the server is stopped on the way out."""
    raise SystemExit(f"stopped by signal {signum}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=2.0,
                        help="length of each enqueue figure (per system, per round)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cycle-jobs", type=int, default=1024,
                        help="jobs claimed and completed per cycle figure (a multiple of 64)")
    parser.add_argument("--pool-size", type=int, default=16,
                        help="capd's pool_size and procrastinate's max_size, alike")
    parser.add_argument("--out", type=Path, default=_HERE / "pg-queue-result.json")
    parser.add_argument("--results", type=Path, default=None,
                        help="JSON lines for bench/run_all.sh (bench/_report.py)")
    parser.add_argument("--share-machine", action="store_true",
                        help="keep the default priority (other work shares the machine)")
    args = parser.parse_args()
    args.cycle_jobs = max(64, args.cycle_jobs // 64 * 64)
    if versions()["procrastinate"] == "not installed":
        raise SystemExit("procrastinate is not installed: pip install -e '.[bench]'")
    # capd's queue logs each migration at info: keep the table readable.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    # procrastinate warns that its App is made in __main__ (it matters to its workers'
    # task imports, not here).
    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    if args.share_machine:
        if GENERATOR_CPUS is not None:
            os.sched_setaffinity(0, GENERATOR_CPUS)
    else:
        pin(GENERATOR_CPUS)
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    started = time.monotonic()
    print(f"PostgreSQL queue bench: capd, procrastinate and the floor, {args.rounds} interleaved "
          f"rounds, {args.seconds:g} s per enqueue figure, {args.cycle_jobs} jobs per cycle "
          "figure")
    try:
        with postgres_server() as server:
            server_pid = place_server(server, SERVER_CPUS, not args.share_machine)
            urls = {name: server.new_database() for name in ("capd", "procrastinate", "floor")}
            got = uvloop.run(run(args, urls, server_pid))
    except (pytest.skip.Exception, pytest.fail.Exception) as exc:
        raise SystemExit(f"the PostgreSQL server could not be started: {exc}") from exc
    summary = report(args, got)
    out = {"bench": "bench/pg_queue.py", "date": time.strftime("%Y-%m-%d %H:%M %Z"),
           "machine": machine(), "versions": versions(),
           "postgres": got["settings"], "sessions": got["sessions"],
           "placement": got["placement"], "pools_after_warmup": got["pools_after_warmup"],
           "rounds": args.rounds, "seconds_per_enqueue_figure": args.seconds,
           "cycle_jobs": args.cycle_jobs, "pool_size": args.pool_size,
           "floor": "plain psycopg 3 async, capd's table and row, one autocommit INSERT per "
                    "COMMIT (no RETURNING), P connections with one producer each",
           **summary, "run_s": time.monotonic() - started}
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out} ({out['run_s']:.0f} s)")


if __name__ == "__main__":
    main()
