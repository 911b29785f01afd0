"""The retry decision: when a job runs next, or that it never runs again.

:meth:`BackoffPolicy.decide` is the one place that answers it, at each of the
three moments a job meets it:

- **enqueued** (``attempts`` is 0: the caller's own call failed). ``manual``
  waits for an operator; ``verify_first`` waits until that call can no longer
  land — first sent + its timeout + ``verify_grace_s``; ``replay`` waits the
  base delay, or ``retry_after_s`` when that is longer.
- **due** (no ``failure``: the sweep is about to claim it). It runs now.
- **failed** (an attempt by the sweep failed). It waits a back-off delay with
  full jitter, or ``retry_after_s`` when that is longer.
- **failed while down** (``failure="down"``: a transient failure while the job's
  capability is known down: its tool is what failed, not the write). It spends no
  attempt and is looked at again after ``down_wait_s`` (the recheck cooldown, 1 s at
  least), and less often as the outage lasts: a twentieth of the job's age, up to
  ``cap_s`` (a job down for an hour is tried every three minutes, its trail kept short).

At every moment a permanent failure ends it (``needs_operator`` for policy
``manual``, else ``dead``), and so does having used ``max_attempts`` (failures
against a live capability) or being older than ``max_age_s`` (``dead``): the age
is what ends a job whose tools never return. The queue stores the answer; its SQL takes
the values decided here and restates none of the rules.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from capd.registry import RetryPolicy

Failure = Literal["transient", "permanent", "down"]

DOWN_WAIT_FLOOR_S = 1.0
"""The shortest wait of a job whose tool is down (a cooldown of 0 must not spin it)."""


@dataclass(frozen=True)
class RetryDecision:
    """The state a job goes to and when it is due; ``reason`` says why it stops, if it does."""

    state: Literal["pending", "needs_operator", "dead"]
    run_at: float
    reason: str | None = None


@dataclass(frozen=True)
class BackoffPolicy:
    """Exponential back-off with full jitter, a cap, a maximum of attempts and of age."""

    base_s: float = 1.0
    factor: float = 2.0
    cap_s: float = 300.0
    max_attempts: int = 8
    max_age_s: float = 7 * 86400.0
    down_wait_s: float = 30.0

    def delay_s(self, attempts: int, rng: random.Random) -> float:
        """Seconds to wait after the ``attempts``-th attempt failed (full jitter)."""
        ceiling = min(self.cap_s, self.base_s * self.factor ** max(0, attempts - 1))
        return rng.uniform(0.0, ceiling)

    def decide(self, policy: RetryPolicy, *, now: float, first_sent_at: float, timeout_s: float,
               attempts: int = 0, max_attempts: int | None = None,
               created_at: float | None = None, failure: Failure | None = None,
               retry_after_s: float | None = None, verify_grace_s: float = 0.0,
               rng: random.Random | None = None) -> RetryDecision:
        """When a job runs next, or that it never runs again (the rules: the module docstring).

        The job is described by its ``policy``, when its first call was sent
        (``first_sent_at``) and its ``timeout_s``, the ``attempts`` it has used
        of ``max_attempts`` (default: this policy's) and when it was
        ``created_at`` (default: ``now``). ``failure`` is how its last attempt
        ended, None when it is due now; ``retry_after_s`` the delay its tool
        asked for. ``rng`` draws the jitter. Reads no clock, writes nothing.
        """
        if failure == "permanent":
            return RetryDecision("needs_operator" if policy == "manual" else "dead", now,
                                 "permanent error")
        if failure != "down" and \
                attempts >= (self.max_attempts if max_attempts is None else max_attempts):
            return RetryDecision("dead", now, "no attempts left")
        if created_at is not None and now - created_at > self.max_age_s:
            return RetryDecision("dead", now, "too old")
        if failure is None:
            return RetryDecision("pending", now)
        asked_s = retry_after_s or 0.0
        if failure == "down":  # its tool is down: no attempt spent, a look on the cooldown
            age_s = now - created_at if created_at is not None else 0.0
            wait_s = max(self.down_wait_s, DOWN_WAIT_FLOOR_S, min(self.cap_s, age_s / 20))
            return RetryDecision("pending", now + max(wait_s, asked_s))
        if attempts == 0:
            if policy == "manual":
                return RetryDecision("needs_operator", now, "policy manual")
            if policy == "verify_first":  # the first call may still land until then
                return RetryDecision("pending", first_sent_at + timeout_s + verify_grace_s)
            return RetryDecision("pending", now + max(self.base_s, asked_s))
        delay_s = self.delay_s(attempts, rng or random.Random())
        return RetryDecision("pending", now + max(delay_s, asked_s))
