"""bench/soak.py runs end to end for two minutes: it measures every window, restarts the
upstream and sees it answer again, and computes the slopes (never asserted: figures
belong in bench/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow  # starts the real daemon and mcp-server-time for two minutes


def test_a_two_minute_soak_measures_every_window_and_heals_a_restarted_upstream(
        tmp_path: Path) -> None:
    """Two minutes of soak: at least five windows, each with RSS, fds, threads and
    /health p99 above zero and calls done; the upstream was killed at least once and
    answered afterwards; the RSS, fds and tasks slopes are numbers."""
    out = tmp_path / "soak.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--minutes", "2", "--window-s", "20",
         "--rate", "200", "--out", str(out)],
        capture_output=True, text=True, timeout=240, cwd=ROOT, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    windows = result["windows"]
    assert len(windows) >= 5
    for window in windows:
        assert window["rss_kib"] > 0
        assert window["fds"] > 0
        assert window["threads"] > 0
        # /status counts every task on the daemon's loop (the sweep, rechecks, serving...)
        assert window["tasks"] > 0
        assert window["health"]["p99_ms"] > 0
        assert window["calls"]["done"] > 0
    assert result["calls_done"] > 0
    assert len(result["restarts"]) >= 1
    assert result["upstream_answered_after_restart"] is True
    assert all(r["answered"] and r["reaped"] for r in result["restarts"])
    slopes = result["slopes"]
    for key in ("rss_kib_per_min", "fds_per_min", "tasks_per_min"):
        assert isinstance(slopes[key], float | int), key
