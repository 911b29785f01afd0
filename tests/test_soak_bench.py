"""bench/soak.py runs end to end, compressed to 45 seconds (its periods shortened to fit):
it measures every window, restarts the upstream and sees it answer again, reloads, and
computes the slopes (never asserted: figures belong in bench/, where it runs for hours)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow  # starts the real daemon and mcp-server-time for 45 seconds


def test_a_short_soak_measures_every_window_and_heals_a_restarted_upstream(
        tmp_path: Path) -> None:
    """45 seconds of soak in 6-second windows: at least five windows, each with RSS, fds,
    threads and /health p99 above zero and calls done; the upstream was killed at least
    once and answered afterwards; the RSS, fds and tasks slopes are numbers."""
    out = tmp_path / "soak.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--minutes", "0.75", "--window-s", "6",
         "--rate", "200", "--restart-s", "15", "--reload-s", "10", "--session-s", "15",
         "--out", str(out)],
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
