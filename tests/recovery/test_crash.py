"""kill -9 at every point of a job's life: no acknowledged job lost, no verified write doubled."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.crashlib import CrashRun, summary

pytestmark = pytest.mark.slow  # starts the real daemon or the CLI as processes

KILLS = int(os.environ.get("CAPD_CRASH_KILLS", "52"))


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_kill_minus_nine_loses_nothing_and_doubles_no_verified_write(
        short_tmp: Path, backend: str, request: pytest.FixtureRequest) -> None:
    """Over 50+ real SIGKILLs: 0 lost, 0 verify_first duplicates, replay duplicates <= kills.

    The sweep replays one job at a time here, so a kill interrupts at most one write:
    a replay job is done twice only when a kill hit its attempt. With the default
    batch a kill may land amid several concurrent replays, each of which may then be
    done twice (bench/crash.py runs that and prints the duplicates per kill). The same
    on both backends: the SQLite file and a PostgreSQL queue.
    """
    url = request.getfixturevalue("pg_url") if backend == "postgresql" else None
    report = CrashRun(short_tmp, sweep_batch=1, queue_url=url).run(KILLS)
    print(summary(report))
    assert report.total_kills == KILLS
    assert set(report.kills) == {"after_ack", "kill_before", "kill_after", "kill_verify"}
    assert len(report.acked) >= KILLS  # every round acknowledged jobs before its kill
    assert report.lost == []
    assert report.duplicates_verify_first == 0
    assert report.duplicates_replay <= report.total_kills
    assert report.integrity_failures == 0
