"""The one retry decision: first run time, back-off, the verify wait and the give-up rule."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Literal

import pytest

from capd.recovery import BackoffPolicy, EnqueueRequest, RetryQueue
from capd.registry import RetryPolicy
from tests.helpers.fakes import Clock

NOW = 1000.0
POLICY = BackoffPolicy(base_s=2.0, factor=2.0, cap_s=60.0, max_attempts=3, max_age_s=3600.0)


def decide_later(
    policy: RetryPolicy,
    *,
    attempts: int = 1,
    max_attempts: int = 3,
    created_at: float = NOW - 60,
    failure: Literal["transient", "permanent"] | None = None,
    retry_after_s: float | None = None,
    rng: random.Random | None = None,
) -> Any:
    """decide() for a job already claimed: sent 10 s ago, 5 s timeout, made a minute ago."""
    return POLICY.decide(policy, now=NOW, first_sent_at=NOW - 10, timeout_s=5.0,
                         attempts=attempts, max_attempts=max_attempts, created_at=created_at,
                         failure=failure, retry_after_s=retry_after_s, rng=rng)


# ---------------------------------------------------------------- enqueued


def test_a_replay_job_first_runs_after_the_base_delay() -> None:
    """Enqueued replay: due after base_s, not the jittered back-off."""
    first = POLICY.decide("replay", now=NOW, first_sent_at=NOW - 1, timeout_s=5.0,
                          failure="transient")
    assert (first.state, first.run_at, first.reason) == ("pending", NOW + 2.0, None)


def test_a_replay_job_first_runs_after_retry_after_when_longer() -> None:
    """Enqueued replay: the tool's retry_after_s wins over a shorter base delay."""
    first = POLICY.decide("replay", now=NOW, first_sent_at=NOW - 1, timeout_s=5.0,
                          failure="transient", retry_after_s=30.0)
    assert first.run_at == NOW + 30.0


def test_a_verify_first_job_waits_until_its_first_call_can_no_longer_land() -> None:
    """Enqueued verify_first: due at first sent + timeout + verify_grace_s, whatever retry_after."""
    first = POLICY.decide("verify_first", now=NOW, first_sent_at=NOW - 1, timeout_s=5.0,
                          failure="transient", retry_after_s=300.0, verify_grace_s=2.0)
    assert (first.state, first.run_at) == ("pending", NOW - 1 + 5.0 + 2.0)


def test_a_manual_job_waits_for_an_operator_from_the_start() -> None:
    """Enqueued manual: needs_operator at once."""
    first = POLICY.decide("manual", now=NOW, first_sent_at=NOW - 1, timeout_s=5.0,
                          failure="transient")
    assert (first.state, first.run_at) == ("needs_operator", NOW)


def test_an_enqueued_job_defaults_to_the_policy_attempts_and_to_age_zero() -> None:
    """Without attempts, max_attempts or created_at a new job is never given up."""
    first = BackoffPolicy(max_age_s=0.001).decide("replay", now=NOW, first_sent_at=0.0,
                                                  timeout_s=5.0, failure="transient")
    assert first.state == "pending"


# --------------------------------------------------------------------- due


def test_a_due_job_with_attempts_left_runs_now() -> None:
    """Due, young, attempts left: pending at now."""
    decision = decide_later("replay", attempts=2)
    assert (decision.state, decision.run_at, decision.reason) == ("pending", NOW, None)


def test_a_due_job_that_used_every_attempt_is_given_up() -> None:
    """attempts == max_attempts: dead, 'no attempts left' (a job that crashed every claim)."""
    decision = decide_later("replay", attempts=3)
    assert (decision.state, decision.reason) == ("dead", "no attempts left")


def test_a_due_job_older_than_max_age_is_given_up() -> None:
    """Older than max_age_s: dead, 'too old', even with attempts left."""
    decision = decide_later("replay", created_at=NOW - 3601)
    assert (decision.state, decision.reason) == ("dead", "too old")


def test_a_job_exactly_max_age_old_still_runs() -> None:
    """The age limit is strict: exactly max_age_s old is not too old."""
    decision = decide_later("replay", created_at=NOW - 3600)
    assert decision.state == "pending"


def test_running_out_of_attempts_is_said_before_age() -> None:
    """Both limits passed: the reason names the attempts."""
    decision = decide_later("replay", attempts=3, created_at=0.0)
    assert decision.reason == "no attempts left"


def test_the_job_max_attempts_overrides_the_policy() -> None:
    """A job's own max_attempts (raised by an operator retry) is the limit that counts."""
    decision = decide_later("replay", attempts=3, max_attempts=4)
    assert decision.state == "pending"


# ------------------------------------------------------------------ failed


def test_a_transient_failure_backs_off_within_the_jittered_ceiling() -> None:
    """After attempt n: due within [now, now + min(cap, base * factor**(n-1))]."""
    rng = random.Random(5)
    for attempts, ceiling in [(1, 2.0), (2, 4.0)]:
        runs = [decide_later("replay", failure="transient", rng=rng, attempts=attempts).run_at
                for _ in range(100)]
        assert all(NOW <= r <= NOW + ceiling for r in runs)
        assert max(runs) > NOW + ceiling * 0.8


def test_a_transient_failure_waits_for_retry_after_when_longer() -> None:
    """retry_after_s longer than any back-off: due exactly then."""
    decision = decide_later("verify_first", failure="transient", retry_after_s=120.0,
                            rng=random.Random(1))
    assert (decision.state, decision.run_at) == ("pending", NOW + 120.0)


def test_the_back_off_draws_from_the_rng_it_is_given() -> None:
    """Two rngs with one seed give one answer: the decision reads no other randomness."""
    first, second = (decide_later("replay", failure="transient", attempts=2,
                                  rng=random.Random(9)) for _ in range(2))
    assert first == second


@pytest.mark.parametrize(("policy", "state"), [
    ("replay", "dead"), ("verify_first", "dead"), ("manual", "needs_operator")])
def test_a_permanent_failure_ends_the_job(policy: RetryPolicy, state: str) -> None:
    """Permanent: dead, or needs_operator for manual, with attempts and age to spare."""
    decision = decide_later(policy, failure="permanent")
    assert (decision.state, decision.run_at, decision.reason) == (state, NOW, "permanent error")


def test_a_transient_failure_of_the_last_attempt_is_given_up() -> None:
    """Transient but out of attempts: dead, never another back-off, whatever the policy."""
    decision = decide_later("manual", failure="transient", attempts=3)
    assert (decision.state, decision.reason) == ("dead", "no attempts left")


def test_a_transient_failure_of_a_job_too_old_is_given_up() -> None:
    """Transient but past max_age_s: dead."""
    decision = decide_later("replay", failure="transient", created_at=NOW - 4000)
    assert (decision.state, decision.reason) == ("dead", "too old")


# ------------------------------------------------------ the queue applies it


async def test_the_queue_gives_up_a_job_too_old_at_claim_saying_so(tmp_path: Path) -> None:
    """A due job past max_age_s is never claimed: dead, its last_error says 'too old'."""
    clock = Clock()
    queue = await RetryQueue.open(tmp_path / "q.db", clock=clock, backoff=POLICY)
    try:
        job = await queue.enqueue(EnqueueRequest(
            capability="t.x", params={}, policy="replay", timeout_s=5, first_sent_at=0,
            error="timeout"))
        clock.advance(3601)
        assert await queue.claim_due(10) == []
        dead = await queue.get(job.id)
        assert (dead.state, dead.attempts, dead.last_error) == (
            "dead", 0, "timeout [gave up: too old]")
        assert (await queue.attempts(job.id))[-1].kind == "dead"
    finally:
        await queue.close()


async def test_the_queue_claims_the_earliest_due_and_skips_those_given_up(tmp_path: Path) -> None:
    """claim_due(1) with a too-old job due first: that one dies, the next one is claimed."""
    clock = Clock()
    queue = await RetryQueue.open(tmp_path / "q.db", clock=clock, backoff=POLICY)

    async def enqueue(n: int, run_at: float) -> str:
        job = await queue.enqueue(EnqueueRequest(
            capability="t.x", params={"n": n}, policy="replay", timeout_s=5, first_sent_at=0,
            run_at=run_at))
        return job.id

    try:
        old = await enqueue(1, clock.now - 20)
        clock.advance(3601)
        due_next = await enqueue(2, clock.now - 10)
        due_last = await enqueue(3, clock.now - 5)
        (claimed,) = await queue.claim_due(1)
        assert claimed.id == due_next
        assert (await queue.get(old)).state == "dead"
        assert (await queue.get(due_last)).state == "pending"
    finally:
        await queue.close()


async def test_on_enqueue_is_called_after_each_enqueue_and_operator_retry(tmp_path: Path) -> None:
    """The queue calls the on_enqueue it was opened with once the job is committed."""
    woken: list[str] = []
    queue = await RetryQueue.open(tmp_path / "q.db", on_enqueue=lambda: woken.append("wake"))
    try:
        job = await queue.enqueue(EnqueueRequest(
            capability="t.x", params={}, policy="manual", timeout_s=5, first_sent_at=0,
            state="needs_operator"))
        assert woken == ["wake"]
        await queue.operator_retry(job.id)
        assert woken == ["wake", "wake"]
    finally:
        await queue.close()


def test_a_failure_while_down_spends_no_attempt_and_only_age_ends_it() -> None:
    """failure="down" (its tool known down): due again after down_wait_s whatever the
    attempts used; past max_age_s it is dead, "too old"."""
    policy = BackoffPolicy(max_attempts=3, max_age_s=60.0, down_wait_s=5.0)
    waiting = policy.decide("replay", now=100.0, first_sent_at=0.0, timeout_s=1.0,
                            attempts=3, created_at=50.0, failure="down")
    assert (waiting.state, waiting.run_at) == ("pending", 105.0)
    asked = policy.decide("replay", now=100.0, first_sent_at=0.0, timeout_s=1.0,
                          attempts=3, created_at=50.0, failure="down", retry_after_s=9.0)
    assert asked.run_at == 109.0
    ended = policy.decide("replay", now=200.0, first_sent_at=0.0, timeout_s=1.0,
                          attempts=1, created_at=50.0, failure="down")
    assert (ended.state, ended.reason) == ("dead", "too old")


def test_a_long_outage_is_looked_at_less_often_and_never_in_a_spin() -> None:
    """down: a cooldown of 0 still waits 1 s; a job down an hour waits 3 minutes; never
    longer than cap_s."""
    spin = BackoffPolicy(down_wait_s=0.0, cap_s=300.0)
    assert spin.decide("replay", now=10.0, first_sent_at=0.0, timeout_s=1.0,
                       created_at=10.0, failure="down").run_at == 11.0
    hour = spin.decide("replay", now=3600.0, first_sent_at=0.0, timeout_s=1.0,
                       created_at=0.0, failure="down")
    assert hour.run_at == 3600.0 + 180.0
    week = spin.decide("replay", now=86400.0, first_sent_at=0.0, timeout_s=1.0,
                       created_at=0.0, failure="down")
    assert week.run_at == 86400.0 + 300.0
