"""The queue's SQL, one named statement per operation, in each dialect.

:data:`SHARED` is written once for both: ``{jobs}`` and ``{attempts}`` are the
tables, ``?`` a parameter and ``greatest`` the larger of two values;
:func:`queries` renders it for a dialect (SQLite's ``jobs``, ``?`` and ``max``;
PostgreSQL's ``capd_jobs``, ``%s`` and ``greatest``) and adds that dialect's own
statements, where the two differ: what a claim locks, what an enqueue does with an
id or a key already stored. A filter by capability (``_of``) takes a JSON array.
"""

from __future__ import annotations

from typing import Literal

from ._jobs import CURRENT_STATES_SQL, OWED_STATES_SQL, RETAINED_STATES_SQL, Job

Dialect = Literal["sqlite", "postgresql"]

COLUMNS = ", ".join(Job.model_fields)  # in field order: job_of takes a row of them as it is

_INSERT_JOB = (
    "INSERT INTO {jobs} (id, capability, params, idempotency_key, policy, state,"
    " attempts, max_attempts, next_run_at, lease_until, fence, boot_id,"
    " first_sent_at, timeout_s, last_error, error_class, first_error,"
    " first_error_class, created_at, updated_at)"
    " VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?, NULL, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_DUE = f"SELECT {COLUMNS} FROM {{jobs}} WHERE state = 'pending' AND next_run_at <= ?"
_WAKE = ("SELECT min(CASE WHEN state = 'pending' THEN next_run_at END) AS d,"
         " min(CASE WHEN state = 'leased' THEN lease_until END) AS l FROM {jobs}"
         " WHERE state IN ('pending', 'leased')")

SHARED: dict[str, str] = {
    "job": f"SELECT {COLUMNS} FROM {{jobs}} WHERE id = ?",
    "job_by_key": f"SELECT {COLUMNS} FROM {{jobs}} WHERE idempotency_key = ?",
    "jobs": f"SELECT {COLUMNS} FROM {{jobs}} ORDER BY created_at DESC LIMIT ?",
    "jobs_in": f"SELECT {COLUMNS} FROM {{jobs}} WHERE state = ? ORDER BY created_at DESC"
               " LIMIT ?",
    "trail": "SELECT id, job_id, at, kind, fence, boot_id, outcome, detail FROM {attempts}"
             " WHERE job_id = ? ORDER BY id",
    "audit": "INSERT INTO {attempts} (job_id, at, kind, fence, boot_id, outcome, detail)"
             " VALUES (?, ?, ?, ?, ?, ?, ?)",
    "insert_keyed": _INSERT_JOB,
    "release_previous_boot": (
        "UPDATE {jobs} SET state = 'pending', lease_until = NULL, next_run_at = ?,"
        " updated_at = ? WHERE state = 'leased' AND (boot_id IS NULL OR boot_id != ?)"
        " RETURNING id, fence"),
    "release_expired": ("UPDATE {jobs} SET state = 'pending', lease_until = NULL,"
                        " updated_at = ? WHERE state = 'leased' AND lease_until < ?"
                        " RETURNING id, fence"),
    "give_up": "UPDATE {jobs} SET state = ?, updated_at = ?, last_error = ? WHERE id = ?",
    "claim": ("UPDATE {jobs} SET state = 'leased', attempts = ?, fence = ?, lease_until = ?,"
              " boot_id = ?, updated_at = ? WHERE id = ?"),
    "extend_lease": ("UPDATE {jobs} SET lease_until = ?, updated_at = ? WHERE id = ?"
                     " AND fence = ? AND state = 'leased'"),
    "finish": ("UPDATE {jobs} SET state = ?, lease_until = NULL,"
               " next_run_at = coalesce(?, next_run_at), last_error = coalesce(?, last_error),"
               " error_class = coalesce(?, error_class), updated_at = ?,"
               " attempts = greatest(attempts - ?, 0)"
               " WHERE id = ? AND fence = ? AND state = 'leased'"),
    "operator_retry": ("UPDATE {jobs} SET state = 'pending', next_run_at = ?, updated_at = ?,"
                       " max_attempts = greatest(max_attempts, attempts + 1), retried_at = ?"
                       " WHERE id = ? AND state = ?"),
    "cancel": "UPDATE {jobs} SET state = 'cancelled', updated_at = ? WHERE id = ? AND state = ?",
    "purge": "DELETE FROM {jobs} WHERE state = ? AND updated_at < ?",
    "counts": "SELECT state, count(*) AS n FROM {jobs} GROUP BY state",
    # by the index over the current jobs only: what health asks, however long the history
    "current_counts": (f"SELECT state, count(*) AS n FROM {{jobs}} WHERE state IN "
                       f"{CURRENT_STATES_SQL} GROUP BY state"),
    "oldest": ("SELECT id, capability, created_at, coalesce(retried_at, created_at) AS since"
               " FROM {jobs} WHERE state IN ('pending', 'leased') ORDER BY since LIMIT 1"),
    "next_due": "SELECT min(next_run_at) AS d FROM {jobs} WHERE state = 'pending'",
    "next_wake": _WAKE,
}

_SQLITE_OF = " AND capability IN (SELECT value FROM json_each(?))"
SQLITE_ONLY: dict[str, str] = {
    "insert": _INSERT_JOB,  # a new id cannot collide: batched with its neighbours
    # scanned until the batch is full (the limit is -1: none)
    "due": _DUE + " ORDER BY next_run_at LIMIT ?",
    "due_of": _DUE + _SQLITE_OF + " ORDER BY next_run_at LIMIT ?",
    "next_wake_of": _WAKE + _SQLITE_OF,
    "expire": (f"DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE state IN "
               f"{RETAINED_STATES_SQL} AND updated_at < ? LIMIT ?)"),
    "owed": (f"SELECT count(*) AS n, total(length(params)) AS b FROM jobs WHERE state IN "
             f"{OWED_STATES_SQL}"),
}

_PG_OF = " AND capability IN (SELECT jsonb_array_elements_text(?::jsonb))"
POSTGRES_ONLY: dict[str, str] = {
    # the id is ours: sent again after a connection dropped, it lands once
    "insert": _INSERT_JOB + " ON CONFLICT (id) DO NOTHING",
    # a key stored meanwhile by another daemon (the insert waits for it): look again
    "insert_keyed": _INSERT_JOB + " ON CONFLICT (idempotency_key) DO NOTHING",
    # two daemons never claim the same job, and neither waits for the other's rows
    "due": _DUE + " ORDER BY next_run_at LIMIT ? FOR UPDATE SKIP LOCKED",
    "due_of": _DUE + _PG_OF + " ORDER BY next_run_at LIMIT ? FOR UPDATE SKIP LOCKED",
    # another daemon's due job must not wake this one again and again
    "next_wake_of": _WAKE + _PG_OF,
    "expire": (f"DELETE FROM capd_jobs WHERE id IN (SELECT id FROM capd_jobs WHERE state IN "
               f"{RETAINED_STATES_SQL} AND updated_at < ? LIMIT ? FOR UPDATE SKIP LOCKED)"),
}


def queries(dialect: Dialect) -> dict[str, str]:
    """Every named statement, rendered for ``dialect``."""
    own = SQLITE_ONLY if dialect == "sqlite" else POSTGRES_ONLY
    pg = dialect == "postgresql"
    rendered = {}
    for name, sql in {**SHARED, **own}.items():
        sql = sql.format(jobs="capd_jobs" if pg else "jobs",
                         attempts="capd_attempts" if pg else "attempts")
        rendered[name] = sql.replace("?", "%s") if pg else sql.replace("greatest(", "max(")
    return rendered
