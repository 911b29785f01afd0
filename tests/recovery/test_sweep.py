"""The retry sweep against a real queue file: replay, verify-first, disabled capabilities."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from capd.recovery import EnqueueRequest, Rechecker, RetryQueue, RetrySweep, RunningAttempts
from capd.registry import (
    Capability,
    CommandProbe,
    PermanentToolError,
    ProbeResult,
    Registry,
    TransientToolError,
)
from tests.helpers.fakes import Clock, FlipProbe


class Line(BaseModel):
    line: str


class Harness:
    def __init__(self, tmp: Path, queue: RetryQueue) -> None:
        self.tmp = tmp
        self.file = tmp / "out.txt"
        self.file.write_text("")
        self.queue = queue
        self.calls = 0
        self.fail_with: list[BaseException] = []
        self.probe = FlipProbe(disk=True)
        self.registry = self.make_registry()
        self.rechecker = Rechecker(lambda: self.registry, probe=self.probe, clock=Clock(),
                                   cooldown_s=0)
        self.sweep = RetrySweep(queue, lambda: self.registry, self.rechecker, grace_s=0)

    def write(self, params: Line) -> str:
        self.calls += 1
        if self.fail_with:
            raise self.fail_with.pop(0)
        with self.file.open("a") as handle:
            handle.write(params.line + "\n")
        return "written"

    def make_registry(self, *, up: bool = True, **extra: Any) -> Registry:
        effect = {"kind": "file_contains", "path": str(self.file), "line": "{line}"}
        fields: dict[str, Any] = {
            "name": "t.write", "summary": "write", "parameters": Line, "func": self.write,
            "requires": ("disk",), "mutates_state": True, "retry_policy": "verify_first",
            "effects": [effect], "timeout_s": 5}
        fields.update(extra)
        probes = {"disk": ProbeResult(tool="disk", ok=up, latency_s=0, checked_at=0,
                                      error=None if up else "disk is down")}
        return Registry([Capability(**fields)], {"disk": CommandProbe(which="sh")}, probes)

    async def enqueue(self, line: str, policy: str = "verify_first") -> str:
        job = await self.queue.enqueue(EnqueueRequest(
            capability="t.write", params={"line": line}, policy=policy,  # type: ignore[arg-type]
            timeout_s=5, first_sent_at=0, run_at=0))
        return job.id

    async def state(self, job_id: str) -> str:
        return (await self.queue.get(job_id)).state

    async def make_due(self) -> None:
        """Pull every pending job's due time to now (skip the back-off in a test)."""
        await self.queue._store.transaction(
            lambda db: db.execute("UPDATE jobs SET next_run_at = 0 WHERE state = 'pending'"))


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    # Wired as the daemon wires it: an enqueue wakes the sweep, which is made just after.
    harness: Harness | None = None
    queue = await RetryQueue.open(tmp_path / "q.db", rng=random.Random(3),
                                  on_enqueue=lambda: harness.sweep.wake() if harness else None)
    harness = Harness(tmp_path, queue)
    yield harness
    await queue.close()


async def test_verify_first_skips_the_call_when_the_write_landed(harness: Harness) -> None:
    """The effect is already there: done, and the op is not called again."""
    harness.file.write_text("hello\n")
    job = await harness.enqueue("hello")
    assert await harness.sweep.sweep_once() == 1
    assert await harness.state(job) == "done"
    assert harness.calls == 0
    kinds = [(a.kind, a.outcome) for a in await harness.queue.attempts(job)]
    assert ("verify", "verified") in kinds


async def test_verify_first_replays_when_absent(harness: Harness) -> None:
    """No effect: the call is made once, and the line is there exactly once."""
    job = await harness.enqueue("hello")
    await harness.sweep.sweep_once()
    assert await harness.state(job) == "done"
    assert harness.file.read_text() == "hello\n"


async def test_replay_retries_transient_failures_until_success(harness: Harness) -> None:
    """replay: a transient failure backs off; the next sweep succeeds."""
    harness.fail_with = [TransientToolError("busy")]
    job = await harness.enqueue("x", policy="replay")
    await harness.sweep.sweep_once()
    assert await harness.state(job) == "pending"
    await harness.make_due()
    await harness.sweep.sweep_once()
    assert await harness.state(job) == "done"
    assert harness.calls == 2


async def test_permanent_failure_is_dead_and_inspectable(harness: Harness) -> None:
    """A permanent error ends the job in dead with the error kept."""
    harness.fail_with = [PermanentToolError("no such note")]
    job = await harness.enqueue("x", policy="replay")
    await harness.sweep.sweep_once()
    dead = await harness.queue.get(job)
    assert (dead.state, dead.last_error, dead.error_class) == ("dead", "no such note",
                                                               "permanent")


async def test_partial_effects_need_an_operator_unless_replay_is_safe(harness: Harness) -> None:
    """Some effects present: parked by default, replayed when partial_replay is safe."""
    harness.file.write_text("a\n")
    both = [{"kind": "file_contains", "path": str(harness.file), "line": "a"},
            {"kind": "file_contains", "path": str(harness.file), "line": "{line}"}]
    harness.registry = harness.make_registry(effects=both)
    parked = await harness.enqueue("b")
    await harness.sweep.sweep_once()
    assert await harness.state(parked) == "needs_operator"
    harness.registry = harness.make_registry(effects=both, partial_replay="safe")
    replayed = await harness.enqueue("c")
    await harness.sweep.sweep_once()
    assert await harness.state(replayed) == "done"
    assert harness.file.read_text() == "a\nc\n"


async def test_unknown_verification_backs_off(harness: Harness) -> None:
    """A verification that cannot decide leaves the job pending with the reason."""
    harness.registry = harness.make_registry(
        effects=[{"kind": "command", "argv": ["sh", "-c", "exit 3"]}])
    job = await harness.enqueue("x")
    await harness.sweep.sweep_once()
    pending = await harness.queue.get(job)
    assert (pending.state, pending.error_class) == ("pending", "verify_unknown")
    assert harness.calls == 0


async def test_disabled_capability_is_rechecked_then_invoked_anyway(harness: Harness) -> None:
    """Still disabled: the callable runs, its untyped failure re-queues the job; healed: done."""
    harness.registry = harness.make_registry(up=False, retry_policy="replay", effects=[])
    harness.probe.up["disk"] = False
    harness.fail_with = [OSError("disk unreachable")]
    job = await harness.enqueue("x", policy="replay")
    await harness.sweep.sweep_once()
    pending = await harness.queue.get(job)
    assert pending.state == "pending"
    assert pending.error_class == "OSError"
    assert harness.probe.calls["disk"] == 1
    harness.probe.up["disk"] = True
    await harness.make_due()
    await harness.sweep.sweep_once()
    assert await harness.state(job) == "done"


async def test_a_disabled_job_waits_for_its_tools_when_its_capability_says_so(
        harness: Harness) -> None:
    """replay_while_disabled = false: still disabled after the recheck, the job is
    postponed (no attempt spent) and its callable never runs until the tools are back."""
    harness.registry = harness.make_registry(up=False, retry_policy="replay", effects=[],
                                             replay_while_disabled=False)
    harness.probe.up["disk"] = False
    job = await harness.enqueue("x", policy="replay")
    await harness.sweep.sweep_once()
    waiting = await harness.queue.get(job)
    assert (waiting.state, waiting.attempts, harness.calls) == ("pending", 0, 0)
    trail = [a.detail or "" for a in await harness.queue.attempts(job)]
    assert any("replay_while_disabled = false" in d for d in trail)
    harness.probe.up["disk"] = True
    await harness.make_due()
    await harness.sweep.sweep_once()
    assert (await harness.state(job), harness.calls) == ("done", 1)


async def test_a_removed_capability_parks_the_job(harness: Harness) -> None:
    """A job whose capability vanished in a reload waits for an operator, never crashes."""
    job = await harness.queue.enqueue(EnqueueRequest(
        capability="t.gone", params={}, policy="replay", timeout_s=1, first_sent_at=0))
    await harness.sweep.sweep_once()
    parked = await harness.queue.get(job.id)
    assert parked.state == "needs_operator"
    assert "no longer exists" in (parked.last_error or "")


async def test_the_sweep_wakes_for_a_due_job_without_a_caller(harness: Harness) -> None:
    """run() sleeps until the next due time and processes the job then."""
    stop = asyncio.Event()
    task = asyncio.create_task(harness.sweep.run(stop))
    job = await harness.queue.enqueue(EnqueueRequest(
        capability="t.write", params={"line": "later"}, policy="verify_first", timeout_s=5,
        first_sent_at=0, run_at=__import__("time").time() + 0.3))
    async with asyncio.timeout(10):
        while await harness.state(job.id) != "done":
            await asyncio.sleep(0.05)
    stop.set()
    await task
    assert harness.file.read_text() == "later\n"


async def test_a_job_whose_earlier_attempt_still_runs_is_postponed_then_verified(
    harness: Harness,
) -> None:
    """An abandoned thread still running: no verify, no call, no attempt used; when it lands,
    the write is verified and never done again."""
    release = threading.Event()

    def late_write() -> None:
        release.wait(10)
        with harness.file.open("a") as handle:
            handle.write("late\n")

    pool = ThreadPoolExecutor(max_workers=1)
    try:
        job = await harness.enqueue("late")
        harness.sweep.running.add(job, pool.submit(late_write))
        await harness.sweep.sweep_once()
        waiting = await harness.queue.get(job)
        assert (waiting.state, waiting.attempts) == ("pending", 0)
        trail = [(a.kind, a.outcome) for a in await harness.queue.attempts(job)]
        assert ("postpone", "pending") in trail
        assert ("verify", "absent") not in trail
        release.set()
        async with asyncio.timeout(10):
            while harness.sweep.running.running_for_s(job) is not None:
                await asyncio.sleep(0.01)
        await harness.make_due()
        await harness.sweep.sweep_once()
        assert await harness.state(job) == "done"
        assert harness.calls == 0
        assert harness.file.read_text() == "late\n"
    finally:
        release.set()
        pool.shutdown(wait=True)


async def test_an_attempt_that_outlives_the_hard_bound_parks_the_job(tmp_path: Path) -> None:
    """Past attempt_running_max_s the job goes to needs_operator, saying why."""
    queue = await RetryQueue.open(tmp_path / "q.db", rng=random.Random(3))
    release = threading.Event()
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        harness = Harness(tmp_path, queue)
        clock = Clock()
        harness.sweep = RetrySweep(queue, lambda: harness.registry, harness.rechecker,
                                   grace_s=0, running=RunningAttempts(clock=clock),
                                   attempt_running_max_s=60)
        job = await harness.enqueue("stuck")
        harness.sweep.running.add(job, pool.submit(release.wait, 10))
        clock.advance(61)
        await harness.sweep.sweep_once()
        parked = await queue.get(job)
        assert (parked.state, parked.error_class) == ("needs_operator", "attempt_still_running")
        assert "may still land" in (parked.last_error or "")
        assert harness.calls == 0
    finally:
        release.set()
        pool.shutdown(wait=True)
        await queue.close()
