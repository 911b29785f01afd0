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
import sqlite3
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict

from capd.registry import RetryPolicy

JobState = Literal["pending", "leased", "done", "partial", "needs_operator", "dead", "cancelled"]
JOB_STATES: tuple[JobState, ...] = (
    "pending", "leased", "done", "partial", "needs_operator", "dead", "cancelled")
TERMINAL: frozenset[str] = frozenset({"done", "partial", "dead", "cancelled"})


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


def job_from_row(row: sqlite3.Row) -> Job:
    """The :class:`Job` stored in one ``jobs`` row."""
    data = dict(row)
    data["params"] = json.loads(data["params"])
    return Job.model_validate(data)


def params_text(params: dict[str, Any]) -> str:
    """``params`` as the JSON text stored in the ``jobs`` row (keys sorted)."""
    try:
        return orjson.dumps(params, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # what orjson cannot hold (an int past 64 bits) the json module can
        return json.dumps(params, sort_keys=True, separators=(",", ":"))
