"""The retry sweep: claims due jobs and finishes them exactly once.

It sleeps until the next due job or lease deadline, or until
:meth:`RetrySweep.wake` (the queue's ``on_enqueue``) wakes it; with nothing due it
looks again after a minute, or after ``SHARED_IDLE_S`` for a queue shared by a fleet
(another host's enqueue wakes nothing here). Per job and policy:

- ``replay``: call again.
- ``verify_first``: walk the declared effects first. ``verified`` → done
  without calling (the write had landed); ``absent`` → call; ``partial`` →
  call if the capability declares ``partial_replay = "safe"``, else hand to an
  operator; ``unknown`` → back off and verify later.
- a disabled capability is rechecked first; if still disabled its callable is
  invoked anyway, and an untyped failure then counts as transient, so the job
  re-queues (never "capability not found").

Before any of that, a job with an earlier attempt still running in this
process (a plain op's thread its call gave up on) is neither verified nor
replayed: it is postponed, without counting an attempt, until that thread
ends; past ``attempt_running_max_s`` it goes to ``needs_operator``.

Each attempt's outcome (:class:`Outcome`) is decided once and written once, with
the trail of its verification, in one transaction.

A queue that cannot be written (a full disk) never stops the sweep: it logs,
backs off and tries again, and resumes by itself when space returns.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import structlog
from pydantic import ValidationError

from capd.registry import Registry, UnknownCapability

from . import _tracing as tracing
from ._attempts import RunningAttempts
from ._calls import apply_passive_health, call_capability
from ._effects import verify_post_write_effects
from ._errors import QueueClosed, QueueStorageError
from ._job_queue import Outcome
from ._jobs import Job
from ._recheck import Rechecker
from ._store import JobQueue

log = structlog.get_logger("capd.sweep")


IDLE_S = 60.0
SHARED_IDLE_S = 5.0
"""How long the sweep sleeps at most with nothing due: its own queue wakes it on every
enqueue; a queue shared by a fleet is looked at every ``SHARED_IDLE_S``."""


class RetrySweep:
    """Finishes queued jobs. Owned by the daemon; ``run`` until ``stop`` is set."""

    def __init__(
        self,
        queue: JobQueue,
        registry: Callable[[], Registry],
        rechecker: Rechecker,
        *,
        batch: int = 32,
        grace_s: float = 5.0,
        idle_max_s: float | None = None,
        clock: Callable[[], float] = time.time,
        executor: Executor | None = None,
        verify_executor: Executor | None = None,
        running: RunningAttempts | None = None,
        attempt_running_max_s: float = 600.0,
        storage_retry_max_s: float = 30.0,
        vanished: Callable[[str], float | None] = lambda _name: None,
        vanished_wait_s: float = 60.0,
    ) -> None:
        self._queue = queue
        self._registry = registry
        self._rechecker = rechecker
        self._batch = batch
        self.grace_s = grace_s
        # the longest sleep with nothing due: another host's job in a shared queue (or one
        # a lost host leased) wakes nothing here, so a shared queue is looked at more often
        self._idle_max_s = idle_max_s or (SHARED_IDLE_S if queue.shared else IDLE_S)
        self._clock = clock
        self._executor = executor
        self._verify_executor = verify_executor
        self.running = running or RunningAttempts()
        self.attempt_running_max_s = attempt_running_max_s
        self._storage_retry_max_s = storage_retry_max_s
        self._vanished = vanished
        self.vanished_wait_s = vanished_wait_s
        self._wake = asyncio.Event()
        self.outcomes: Counter[str] = Counter()
        self.busy = 0
        # The last time the queue could not be read or written, and why (None once it can).
        self.storage_error: str | None = None

    def wake(self) -> None:
        """Look at the queue now: something was enqueued or made due.

        Give it to the queue as its ``on_enqueue`` (:meth:`RetryQueue.open`).
        """
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Recover orphaned leases, then sweep until ``stop`` is set.

        A queue that cannot be used (a full disk, an I/O error) is retried with
        back-off up to ``storage_retry_max_s``, never raised: the daemon keeps
        serving and the sweep resumes by itself.
        """
        recovered = False
        failures = 0
        while not stop.is_set():
            self._wake.clear()
            try:
                if not recovered:
                    await self._queue.expire_previous_boot_leases()
                    recovered = True
                await self.sweep_once()
                wake_at = await self._queue.next_wake_at(only=self._known())
            except QueueClosed:
                return
            except QueueStorageError as exc:
                failures += 1
                delay = min(self._storage_retry_max_s, 0.5 * 2 ** min(failures, 10))
                if self.storage_error != str(exc):
                    log.error("sweep_storage_failed", error=str(exc), retry_in_s=delay)
                self.storage_error = str(exc)
            else:
                if self.storage_error is not None:
                    log.info("sweep_storage_recovered", after_failures=failures)
                failures, self.storage_error = 0, None
                delay = self._idle_max_s if wake_at is None else max(0.0, wake_at - self._clock())
            stopper = asyncio.ensure_future(stop.wait())
            waker = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({stopper, waker}, timeout=min(delay, self._idle_max_s),
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopper.cancel()
                waker.cancel()

    def _known(self) -> set[str] | None:
        """What this daemon claims from a shared queue, which holds jobs of capabilities
        other daemons run: the capabilities it declares (None: every job, its own queue)."""
        if not self._queue.shared:
            return None
        snap = self._registry().snapshot()
        return {*snap.live, *snap.disabled}

    async def sweep_once(self) -> int:
        """Requeue expired leases, claim due jobs and process them; return how many."""
        await self._queue.requeue_expired_leases()
        jobs = await self._queue.claim_due(self._batch, grace_s=self.grace_s,
                                           only=self._known())
        if jobs:
            self.busy += len(jobs)
            try:
                outcomes = await asyncio.gather(*(self.process(job) for job in jobs),
                                                return_exceptions=True)
            finally:
                self.busy -= len(jobs)
            # Every job of the batch ran to its end; then the first failure is raised.
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
        return len(jobs)

    def _count(self, outcome: str, job: Job) -> None:
        self.outcomes[outcome] += 1
        log.info("job_" + outcome, job=job.id, capability=job.capability, attempt=job.attempts)

    async def process(self, job: Job) -> None:
        """Take one claimed job to its next state: its outcome is decided once, then written
        in one transaction (with the trail of its verification)."""
        decided = await self._decide(job)
        if decided is None:
            self._count("lost_lease", job)
            return
        outcome, label = decided
        settled = await self._queue.settle(job, outcome)
        # a completion counts once written; a retry by where it went; the rest as decided
        if settled is not None and label is None:
            label = {"dead": "dead", "needs_operator": "parked"}.get(settled.state, "retry")
        if label is not None and (settled is not None or outcome.kind != "complete"):
            self._count(label, job)

    def _running_attempt(self, job: Job) -> tuple[Outcome, str] | None:
        """Postpone or park ``job`` while an earlier attempt of it still runs; None if none does.

        Its write may still land: verifying now could find it absent and replay
        it, and replaying now could do it twice.
        """
        running_s = self.running.running_for_s(job.id)
        if running_s is None:
            return None
        if running_s >= self.attempt_running_max_s:
            return Outcome(
                "park", error=f"an earlier attempt has been running for {running_s:.0f}s after "
                "its call gave up on it and may still land its write; check the effect, then "
                f"`capd queue retry {job.id}` or `capd queue cancel {job.id}`",
                error_class="attempt_still_running"), "parked"
        wait_s = min(max(1.0, running_s / 2), self.attempt_running_max_s - running_s)
        return Outcome(
            "postpone", run_at=self._clock() + wait_s,
            detail=f"an earlier attempt is still running ({running_s:.1f}s); not verified or "
            f"replayed until it ends; looking again in {wait_s:.1f}s"), "postponed"

    async def _decide(self, job: Job) -> tuple[Outcome, str | None] | None:
        """What ``job``'s attempt comes to (verifying, calling), and the outcome's name for
        the counts (None: by the state it goes to); None when the lease was lost."""
        registry = self._registry()
        try:
            cap = registry.get(job.capability)
        except UnknownCapability:
            since = self._vanished(job.capability)
            if since is not None:  # the latest reload took it away: a fix brings it back
                when = time.strftime("%H:%M:%S", time.localtime(since))
                return Outcome(
                    "postpone", run_at=self._clock() + self.vanished_wait_s,
                    detail=f"capability {job.capability!r} left the registry at the reload of "
                    f"{when}; waiting for a reload to bring it back (looking again in "
                    f"{self.vanished_wait_s:g}s; `capd queue cancel {job.id}` to drop it)"
                ), "postponed"
            return Outcome("park", error=f"capability {job.capability!r} no longer exists "
                           "(removed by a reload?); fix it and `capd queue retry`",
                           error_class="needs_operator"), "parked"
        try:
            params = cap.parameters.model_validate(job.params)
        except (ValidationError, SystemExit, KeyboardInterrupt) as exc:  # a validator exited
            return Outcome("retry", error=f"parameters no longer valid: {exc}",
                           error_class="invalid_params", permanent=True), "dead"
        running = self._running_attempt(job)
        if running is not None:
            return running
        disabled = registry.disabled_entry(cap.name) is not None
        if disabled:
            disabled = not (await self._rechecker.recheck_disabled_capability(cap.name)).live
        if disabled and not cap.replay_while_disabled:  # its operator says: tools first
            entry = registry.disabled_entry(cap.name)
            missing = ", ".join(entry.missing) if entry is not None else "its tools"
            return Outcome(
                "postpone", run_at=self._clock() + self._queue.backoff.down_wait_s,
                detail=f"{cap.name} is disabled (missing {missing}) and declares "
                "replay_while_disabled = false: waiting for its tools, no attempt spent"
            ), "postponed"

        notes: tuple[tuple[str, str | None, Any], ...] = ()
        if job.policy == "verify_first":
            with tracing.optional_span(f"queue.verify {cap.name}", {
                    "gen_ai.tool.name": cap.name, "capd.job.id": job.id}) as current:
                verification = await verify_post_write_effects(cap, params, registry.ops,
                                                               executor=self._verify_executor)
                if current is not None:
                    current.set_attribute("capd.verify.verdict", verification.verdict)
            notes = (("verify", verification.verdict, verification.as_dict()),)
            if verification.verdict == "verified":
                return Outcome("complete", detail="effects verified: the write had landed; "
                               "not called again", notes=notes), "verified"
            if verification.verdict == "unknown":
                detail = "; ".join(c.detail for c in verification.checks if c.status == "unknown")
                return Outcome("retry", error=f"verification could not decide: {detail}",
                               error_class="verify_unknown", notes=notes), "verify_unknown"
            if verification.verdict == "partial" and cap.partial_replay != "safe":
                return Outcome("park", error="effects are partly present and replay is not "
                               "declared safe (partial_replay = 'safe')",
                               error_class="partial_effects", notes=notes), "parked"

        # The call may outlive the lease taken at claim time (verification took a while).
        if not await self._queue.extend_lease(job, cap.timeout_s + self.grace_s, notes=notes):
            return None
        with tracing.optional_span(f"queue.replay {cap.name}", {
                "gen_ai.tool.name": cap.name, "capd.job.id": job.id}) as current:
            outcome = await call_capability(cap, params, unknown_errors_are_transient=disabled,
                                            executor=self._executor)
            if current is not None and outcome.kind not in ("success", "partial"):
                tracing.set_error(current, outcome.error_type or outcome.kind, outcome.message)
        if outcome.abandoned is not None:
            self.running.add(job.id, outcome.abandoned)
        detail = f"{outcome.kind}: {outcome.error_type or ''} {outcome.message or ''}".strip()
        if outcome.kind in ("success", "partial"):
            return Outcome("complete", "done" if outcome.kind == "success" else "partial",
                           detail=detail), "replayed"
        apply_passive_health(registry, cap, outcome)
        if outcome.kind == "blocked":
            return Outcome("park", error=detail, error_class="blocked"), "parked"
        # Known down (disabled before the call, or disabled now that the call found its
        # tool down): the failure is the tool's, not the write's, and spends no attempt.
        # A failure of a capability still live counts, whatever it was.
        down = outcome.kind == "transient" and (
            disabled or registry.disabled_entry(cap.name) is not None)
        return Outcome("retry", error=outcome.message or outcome.kind,
                       error_class=outcome.error_type or "error",
                       retry_after_s=outcome.retry_after_s,
                       permanent=outcome.kind == "permanent", down=down), None
