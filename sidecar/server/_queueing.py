"""The gateway's seam to the durable retry queue."""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog
from pydantic import BaseModel

from capd.recovery import (
    EnqueueRequest,
    IdempotencyConflict,
    JobQueue,
    QueueError,
    RunningAttempts,
)
from capd.registry import Capability, ThreadHandle

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
