"""kill -9 at every point of a job's life: no acknowledged job lost, no verified write doubled."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .crashlib import CrashRun, summary

pytestmark = pytest.mark.slow  # starts the real daemon or the CLI as processes

KILLS = int(os.environ.get("CAPD_CRASH_KILLS", "52"))


def test_kill_minus_nine_loses_nothing_and_doubles_no_verified_write(short_tmp: Path) -> None:
    """Over 50+ real SIGKILLs: 0 lost, 0 verify_first duplicates, replay duplicates <= kills."""
    report = CrashRun(short_tmp).run(KILLS)
    print(summary(report))
    assert report.total_kills == KILLS
    assert set(report.kills) == {"after_ack", "kill_before", "kill_after", "kill_verify"}
    assert len(report.acked) >= KILLS  # every round acknowledged jobs before its kill
    assert report.lost == []
    assert report.duplicates_verify_first == 0
    assert report.duplicates_replay <= report.total_kills
    assert report.integrity_failures == 0
