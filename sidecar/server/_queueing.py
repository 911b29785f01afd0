"""The daemon's retry queue: opened and closed, counted, kept small; the gateway's seam.

:func:`open_queue` is the queue as a part of the daemon (the SQLite file, or a fleet's
PostgreSQL database); :class:`QueueCounts` answers health's counts without waiting;
:func:`expire_finished_jobs` and :func:`checkpoint_when_idle` are its upkeep;
:class:`QueueSink` turns a failed mutating call into a committed job.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import structlog
from pydantic import BaseModel

from capd.recovery import (
    EnqueueRequest,
    IdempotencyConflict,
    JobQueue,
    PgRetryQueue,
    QueueError,
    QueueStats,
    RecoveryError,
    RetryQueue,
    RunningAttempts,
)
from capd.registry import Capability, ThreadHandle

from ._config import LoadedConfig
from ._result import ToolResult

log = structlog.get_logger("capd.queueing")


class QueueSink:
    """Turns a transient failure of a mutating call into a committed retry job.

    ``replay`` jobs are due after the first back-off delay; ``verify_first``
    jobs only once the original call can no longer land (first sent + its
    timeout + ``verify_grace_s``, and never while its thread still runs: that
    thread is handed to ``running``); ``manual`` jobs are parked for an
    operator. The result says ``queued: <job id>`` only after the job is
    committed; if the queue cannot take it, the result says so and nothing is
    queued.
    """

    def __init__(self, queue: Callable[[], JobQueue | None], running: RunningAttempts, *,
                 verify_grace_s: float = 2.0, clock: Callable[[], float] = time.time) -> None:
        self._queue = queue  # the daemon opens it after building this
        self._running = running
        self._verify_grace_s = verify_grace_s
        self._clock = clock

    async def accept(self, capability: Capability, params: BaseModel, result: ToolResult,
                     *, idempotency_key: str | None = None,
                     running: ThreadHandle | None = None) -> ToolResult:
        """Enqueue the failed call; return the result with its job id."""
        queue = self._queue()
        if queue is None:  # only before the daemon has opened it
            return result.model_copy(update={
                "message": f"{result.message}; NOT queued: the retry queue is not open yet"})
        now = self._clock()
        first_sent_at = now - result.duration_s
        policy = capability.retry_policy
        first = queue.backoff.decide(
            policy, now=now, first_sent_at=first_sent_at, timeout_s=capability.timeout_s,
            failure="transient", retry_after_s=result.retry_after_s,
            verify_grace_s=self._verify_grace_s)
        request = EnqueueRequest(
            capability=capability.name, params=params.model_dump(mode="json"), policy=policy,
            timeout_s=capability.timeout_s, first_sent_at=first_sent_at,
            idempotency_key=idempotency_key, state=first.state, run_at=first.run_at,
            error=result.message, error_class=result.error_type,
        )
        try:
            job = await queue.enqueue(request)
        except IdempotencyConflict:
            raise
        except QueueError as exc:
            log.error("enqueue_failed", capability=capability.name, error=str(exc))
            return result.model_copy(update={
                "message": f"{result.message}; NOT queued: {exc}"})
        if running is not None:
            self._running.add(job.id, running)
        where = ("parked for an operator (policy manual)" if policy == "manual"
                 else f"will be retried (policy {policy})")
        return result.model_copy(update={
            "queued": job.id,
            "message": f"{result.message}; queued as job {job.id}, {where}",
        })


STATS_TIMEOUT_S = 5.0
"""How long a read of the queue's counts may take before health reports the queue failing."""
STATS_STALE_S = 5.0
"""How old the last counts may be and still be answered while a new read runs."""
EXPIRE_EVERY_S = 60.0
"""How often finished jobs past ``queue_retention_s`` are looked for."""
CHECKPOINT_EVERY_S = 5.0
"""How often an idle queue's write-ahead log is folded back and emptied."""


@contextlib.asynccontextmanager
async def open_queue(loaded: LoadedConfig, on_enqueue: Callable[[], None]
                     ) -> AsyncIterator[JobQueue]:
    """The retry queue capd.toml names, open until the block ends. Refuses a damaged
    file or pragmas that did not take; ``on_enqueue`` runs after each committed job."""
    config = loaded.config
    queue: JobQueue
    if config.queue_url:  # a fleet's queue: serves even while the database is away
        queue = await PgRetryQueue.open(config.queue_url, backoff=loaded.backoff(),
                                        on_enqueue=on_enqueue, pool_size=config.queue_pool_size)
        log.info("queue_shared", database=queue.where)
    else:
        queue = await RetryQueue.open(
            loaded.state_dir() / "queue.db", synchronous=config.queue_synchronous,
            reserve_bytes=config.queue_reserve_bytes, backoff=loaded.backoff(),
            on_enqueue=on_enqueue)
    try:
        yield queue
    finally:
        await queue.close()


async def stopped_within(stop: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds``, or less if ``stop`` is set meanwhile; whether it was."""
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        return False
    return True


class QueueCounts:
    """The queue's counts of its current jobs, read once and then refreshed in the
    background once older than asked (a health request never waits on a count)."""

    def __init__(self, queue: Callable[[], JobQueue | None],
                 spawn: Callable[[Awaitable[None]], asyncio.Task[None]]) -> None:
        self._queue = queue
        self._spawn = spawn
        self._last: tuple[float, QueueStats | str] | None = None  # str: the error
        self._refresh: asyncio.Task[None] | None = None

    async def read(self, max_age_s: float = 1.0) -> QueueStats:
        """The counts, at most ``max_age_s`` old (older ones while a new read runs, up to
        ``STATS_STALE_S``). Raises the queue's error when it could not be read."""
        age_s = time.monotonic() - self._last[0] if self._last is not None else math.inf
        if age_s > max_age_s:
            refreshing = self._refresh
            if refreshing is None or refreshing.done():
                refreshing = self._refresh = self._spawn(self._read())
            if age_s > STATS_STALE_S:  # none recent (idle, or a read that hangs): wait for
                # this one, bounded (it times out itself): health never says pass on old counts
                await asyncio.shield(refreshing)
        assert self._last is not None
        value = self._last[1]
        if isinstance(value, str):  # a new exception each time: a kept one gathers frames
            raise RecoveryError(value)
        return value

    async def waiting(self) -> int | None:
        """Jobs pending or leased now, for the status line (None: the queue is not open or
        could not be read; the health check reports that)."""
        queue = self._queue()
        if queue is None:
            return None
        try:
            stats = await queue.stats()
        except Exception as exc:  # the health check reports the queue; this only waits
            log.debug("status_queue_unreadable", error=str(exc))
            return None
        return stats.by_state["pending"] + stats.by_state["leased"]

    async def _read(self) -> None:
        queue = self._queue()
        assert queue is not None
        try:  # the current jobs only: an index read, however much history is kept
            async with asyncio.timeout(STATS_TIMEOUT_S):
                value: QueueStats | str = await queue.stats(retained=False)
        except RecoveryError as exc:
            value = str(exc)
        except TimeoutError:
            value = f"the queue did not answer its counts within {STATS_TIMEOUT_S:g}s"
        self._last = (time.monotonic(), value)


async def expire_finished_jobs(queue: JobQueue, retention_s: float, stop: asyncio.Event) -> None:
    """Remove done and cancelled jobs past ``retention_s``, at start and then every
    ``EXPIRE_EVERY_S`` (half the retention when that is shorter) until ``stop``: the queue
    stays the size of what is current. A pass that fails (a full disk, the database
    away) is logged and tried again next time."""
    every_s = min(EXPIRE_EVERY_S, max(0.5, retention_s / 2))
    while True:
        try:
            removed = await queue.expire_finished(retention_s)
        except RecoveryError as exc:
            log.warning("queue_expire_failed", error=str(exc))
        else:
            if removed:
                log.info("queue_expired", removed=removed, retention_s=retention_s)
        if await stopped_within(stop, every_s):
            return


async def checkpoint_when_idle(queue: RetryQueue, stop: asyncio.Event) -> None:
    """Empty the queue's WAL (a TRUNCATE checkpoint) once no group commit has run for a
    while, until ``stop``: SQLite's own PASSIVE checkpoints after batches fold it back but
    keep the file's size, and a WAL that only grows takes the room the sweep needs."""
    wal = queue.path.with_name(queue.path.name + "-wal")
    while not await stopped_within(stop, CHECKPOINT_EVERY_S):
        try:
            size = wal.stat().st_size
        except OSError:
            continue
        if size and queue.idle_s >= CHECKPOINT_EVERY_S:
            await queue.checkpoint("TRUNCATE")
