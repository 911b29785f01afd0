"""What the retry queue holds: jobs, their states, their audit trail, and a snapshot.

Job states::

    pending ──claim──► leased ──complete──► done | partial
       ▲                 │
       └──retry_later────┤──permanent / exhausted──► dead | needs_operator
                         └──lease expired / daemon restart──► pending
    operator: retry (→ pending), cancel (→ cancelled), purge (terminal → gone)
"""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict

from capd.registry import RetryPolicy, model_assembler

from ._decision import BackoffPolicy, Failure, RetryDecision
from ._errors import InvalidTransition

JobState = Literal["pending", "leased", "done", "partial", "needs_operator", "dead", "cancelled"]
JOB_STATES: tuple[JobState, ...] = (
    "pending", "leased", "done", "partial", "needs_operator", "dead", "cancelled")
TERMINAL: frozenset[str] = frozenset({"done", "partial", "dead", "cancelled"})
RETAINED: tuple[JobState, ...] = ("done", "cancelled")
"""Finished jobs kept only for ``queue_retention_s``, then removed in the background
(dead and partial jobs wait for an operator); they are history, not news."""
OWED_STATES: frozenset[str] = frozenset({"pending", "leased", "needs_operator"})
"""The states of a job acknowledged and not finished: what the disk must still have room
to finish."""
OWED_STATES_SQL = "(" + ", ".join(f"'{s}'" for s in sorted(OWED_STATES)) + ")"
CURRENT_STATES_SQL = "(" + ", ".join(f"'{s}'" for s in JOB_STATES if s not in RETAINED) + ")"
RETAINED_STATES_SQL = "(" + ", ".join(f"'{s}'" for s in RETAINED) + ")"
"""The states as SQL lists (the same text for both dialects): what a cheap count reads."""

_set_attribute = object.__setattr__


class Job(BaseModel):
    """One durable job, as stored."""

    model_config = ConfigDict(frozen=True)

    id: str
    capability: str
    params: dict[str, Any]
    idempotency_key: str | None
    policy: RetryPolicy
    state: JobState
    attempts: int
    max_attempts: int
    next_run_at: float
    lease_until: float | None
    fence: int
    boot_id: str | None
    first_sent_at: float
    timeout_s: float
    last_error: str | None
    error_class: str | None
    first_error: str | None = None
    first_error_class: str | None = None
    created_at: float
    updated_at: float
    retried_at: float | None = None
    """When an operator last asked for a retry (its age for ``max_age_s`` counts from
    then); ``created_at`` stays when the job was accepted."""


class Attempt(BaseModel):
    """One row of a job's audit trail."""

    model_config = ConfigDict(frozen=True)

    id: int
    job_id: str
    at: float
    kind: str
    fence: int | None
    boot_id: str | None
    outcome: str | None
    detail: str | None


class QueueStats(BaseModel):
    """A snapshot of the queue's counts."""

    model_config = ConfigDict(frozen=True)

    by_state: dict[str, int]
    oldest_pending_age_s: float | None
    oldest_pending: dict[str, Any] | None = None
    """The oldest job not yet finished (pending or running): its id, capability and
    ``created_at``."""
    next_due_at: float | None
    path: str


@dataclass(frozen=True)
class EnqueueRequest:
    """What the gateway asks the queue to keep.

    ``state`` and ``run_at`` are where the job starts and when it is first
    due (now when None); the gateway takes both from :meth:`BackoffPolicy.decide`.
    """

    capability: str
    params: dict[str, Any]
    policy: RetryPolicy
    timeout_s: float
    first_sent_at: float
    idempotency_key: str | None = None
    state: Literal["pending", "needs_operator", "dead"] = "pending"
    run_at: float | None = None
    error: str | None = None
    error_class: str | None = None
    max_attempts: int | None = None

    def __init__(self, capability: str, params: dict[str, Any], policy: RetryPolicy,
                 timeout_s: float, first_sent_at: float, idempotency_key: str | None = None,
                 state: Literal["pending", "needs_operator", "dead"] = "pending",
                 run_at: float | None = None, error: str | None = None,
                 error_class: str | None = None, max_attempts: int | None = None) -> None:
        # The __init__ a frozen dataclass would generate sets each field through
        # object.__setattr__; one request is built per enqueue, so it is set in one
        # step (half the time). A test (tests/recovery/test_queue.py) keeps it in step
        # with the fields.
        _set_attribute(self, "__dict__", {
            "capability": capability, "params": params, "policy": policy,
            "timeout_s": timeout_s, "first_sent_at": first_sent_at,
            "idempotency_key": idempotency_key, "state": state, "run_at": run_at,
            "error": error, "error_class": error_class, "max_attempts": max_attempts})


def job_from_row(row: sqlite3.Row | Mapping[str, Any]) -> Job:
    """The :class:`Job` stored in one ``jobs`` row (SQLite's or PostgreSQL's), validated
    (what an operator reads)."""
    data = dict(row)
    data["params"] = json.loads(data["params"])
    return Job.model_validate(data)


_SAMPLE: dict[str, Any] = dict.fromkeys(Job.model_fields)
_SAMPLE.update(params={"n": 1}, policy="replay", state="pending")

job_of = model_assembler(Job, _SAMPLE)
"""A :class:`Job` from ``values`` (every field, in field order), none of them re-validated.

For values the queue made itself, or read back in the transaction that
writes them (SQLite's CHECK and NOT NULL constraints and column types hold
them): what ``Job.model_construct`` builds, a sixth of the time it takes
(it was a sixth of the database thread's time per enqueue). ``values``
becomes the job's own: the caller must not keep using it (see ``model_assembler``).
"""


def params_text(params: dict[str, Any]) -> str:
    """``params`` as the JSON text stored in the ``jobs`` row (keys sorted)."""
    try:
        return orjson.dumps(params, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # what orjson cannot hold (an int past 64 bits) the json module can
        return json.dumps(params, sort_keys=True, separators=(",", ":"))


# The rules both backends share (``_queue`` and ``_pg_queue``): what an operator may do to a
# job, and what the trail and the stats say, apart from how each stores it.

RETRYABLE: frozenset[str] = frozenset({"needs_operator", "dead", "cancelled", "partial"})
CANCELLABLE: frozenset[str] = frozenset({"pending", "needs_operator", "dead"})


def check_retryable(job: Job) -> None:
    """Raise :class:`InvalidTransition` unless an operator may retry ``job``."""
    if job.state not in RETRYABLE:
        raise InvalidTransition(f"job {job.id} is {job.state}; only needs_operator, dead, "
                                "cancelled or partial jobs can be retried")


def check_cancellable(job: Job) -> None:
    """Raise :class:`InvalidTransition` unless an operator may cancel ``job``."""
    if job.state not in CANCELLABLE:
        raise InvalidTransition(
            f"job {job.id} is {job.state}; only pending, needs_operator or dead jobs can be "
            "cancelled" + (" (it is running now: try again when it settles)"
                           if job.state == "leased" else ""))


def check_purgeable(state: str) -> None:
    """Raise :class:`InvalidTransition` unless ``state`` is one jobs are purged from."""
    if state not in TERMINAL:
        raise InvalidTransition(
            f"only finished jobs can be purged ({', '.join(sorted(TERMINAL))}), not {state!r}")


def check_listable(state: str | None) -> None:
    """Raise :class:`InvalidTransition` for a state no job can be in."""
    if state is not None and state not in JOB_STATES:
        raise InvalidTransition(f"unknown state {state!r}; one of {', '.join(JOB_STATES)}")


def changed_meanwhile(job: Job) -> InvalidTransition:
    """The refusal of an operator's action on ``job`` when it left ``job.state`` between the
    look and the change (the sweep or another operator): nothing is written."""
    return InvalidTransition(f"job {job.id} changed while this was asked (it was {job.state}); "
                             f"look again: capd queue show {job.id}")


def operator_note(verb: str, job: Job, actor: str | None) -> str:
    """The trail's words for an operator's ``verb`` (retry requested, cancelled) of ``job``."""
    return f"{verb} (was {job.state})" + (f" by {actor}" if actor else "")


def enqueue_entry(job: Job) -> Attempt:
    """The first entry of ``job``'s trail: its enqueue, as the job row records it."""
    return Attempt(id=0, job_id=job.id, at=job.created_at, kind="enqueue", fence=0,
                   boot_id=None, outcome=job.first_error_class, detail=job.first_error)


def queue_stats(counts: Iterable[Mapping[str, Any]], oldest: Mapping[str, Any] | None,
                due: float | None, now: float, where: str, *,
                retained: bool = True) -> QueueStats:
    """The stats from the counts by state, the oldest unfinished job's row and the next
    due time; without ``retained``, the done and cancelled jobs were not counted (and
    ``by_state`` does not name them)."""
    by_state = dict.fromkeys(JOB_STATES if retained else
                             [s for s in JOB_STATES if s not in RETAINED], 0)
    by_state.update({r["state"]: int(r["n"]) for r in counts})
    # an operator's retry makes a job young again (its created_at stays)
    since = (oldest.get("since") or oldest["created_at"]) if oldest else None
    shown = {k: v for k, v in oldest.items() if k != "since"} if oldest else None
    return QueueStats(
        by_state=by_state, oldest_pending_age_s=None if since is None else now - since,
        oldest_pending=shown, next_due_at=due, path=where)


def failure_of(*, permanent: bool, down: bool) -> Failure:
    """How a sweep's failed attempt counts: permanent, its tool down (no attempt spent),
    or transient."""
    return "permanent" if permanent else "down" if down else "transient"


def decide_for(backoff: BackoffPolicy, fields: Any, *, now: float, rng: random.Random,
               failure: Failure | None = None,
               retry_after_s: float | None = None) -> RetryDecision:
    """:meth:`BackoffPolicy.decide` for a job's stored fields (a row read by key, or a
    :class:`Job`'s ``vars``): its age counts from an operator's retry when there was one."""
    return backoff.decide(
        fields["policy"], now=now, first_sent_at=fields["first_sent_at"],
        timeout_s=fields["timeout_s"], attempts=fields["attempts"],
        max_attempts=fields["max_attempts"], failure=failure, retry_after_s=retry_after_s,
        created_at=fields["retried_at"] or fields["created_at"], rng=rng)
