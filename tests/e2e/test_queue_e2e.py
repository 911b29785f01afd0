"""The retry queue through the real daemon: queued calls, idempotency, operator rows, health."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.crashlib import CrashRun
from tests.helpers.daemon import DaemonProcess

pytestmark = pytest.mark.slow  # starts the real daemon or the CLI as processes


def capd(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "capd", *args, "--socket",
                           str(daemon.socket)], capture_output=True, text=True, timeout=60,
                          check=False)


def wait_state(daemon: DaemonProcess, job: str, state: str) -> dict[str, object]:
    deadline = time.monotonic() + 20
    while True:
        body = daemon.call("GET", f"/queue/{job}").body
        if body["state"] == state:
            return dict(body)
        assert time.monotonic() < deadline, f"job {job} stayed {body['state']}"
        time.sleep(0.05)


def test_a_transient_failure_is_queued_and_finished_later(short_tmp: Path) -> None:
    """202 with a job id; the sweep finishes it when the tool works; the trail shows it all."""
    run = CrashRun(short_tmp)
    daemon = run.start("transient")
    try:
        reply = daemon.call("POST", "/call/crash.vf", {"token": "t1"})
        assert reply.status == 202
        assert reply.body["status"] == "error_transient"
        job = reply.body["queued"]
        assert f"queued as job {job}" in reply.body["message"]
        run.mode.write_text("ok")
        done = wait_state(daemon, job, "done")
        kinds = [a["kind"] for a in done["trail"]]  # type: ignore[index]
        assert kinds[0] == "enqueue"
        assert "verify" in kinds
        assert kinds[-1] == "complete"
        assert run.out.read_text().split() == ["t1"]
    finally:
        daemon.kill()


def test_idempotency_key_header(short_tmp: Path) -> None:
    """The same Idempotency-Key returns the same job; other parameters get 409."""
    run = CrashRun(short_tmp)
    daemon = run.start("transient")
    try:
        key = {"Idempotency-Key": "order-7"}
        first = daemon.call("POST", "/call/crash.rp", {"token": "a"}, headers=key)
        again = daemon.call("POST", "/call/crash.rp", {"token": "a"}, headers=key)
        assert first.body["queued"] == again.body["queued"]
        other = daemon.call("POST", "/call/crash.rp", {"token": "b"}, headers=key)
        assert other.status == 409
        assert "already used by job" in other.body["detail"]
        assert len(daemon.call("GET", "/queue").body["jobs"]) == 1
    finally:
        daemon.kill()


def test_operator_rows_and_health(short_tmp: Path) -> None:
    """A dead job makes health warn; queue list/show/retry/cancel/purge/stats work from the CLI."""
    run = CrashRun(short_tmp)
    daemon = run.start("transient")
    try:
        dead_job = daemon.call("POST", "/call/crash.rp", {"token": "d"}).body["queued"]
        waiting = daemon.call("POST", "/call/crash.vf", {"token": "w"}).body["queued"]
        run.mode.write_text("permanent")
        wait_state(daemon, dead_job, "dead")
        health = daemon.call("GET", "/health")
        assert (health.status, health.body["status"]) == (200, "warn")
        assert "1 dead" in health.body["output"]
        [jobs_check] = health.body["checks"]["queue:jobs"]
        assert (jobs_check["status"], jobs_check["observedValue"]["dead"]) == ("warn", 1)
        assert "1 dead" in jobs_check["output"]
        listed = json.loads(capd(daemon, "queue", "list", "--state", "dead", "--json").stdout)
        assert [j["id"] for j in listed["jobs"]] == [dead_job]
        table = capd(daemon, "queue", "list")
        assert dead_job in table.stdout
        shown = json.loads(capd(daemon, "queue", "show", dead_job, "--json").stdout)
        assert shown["last_error"] == "refused for good"
        assert capd(daemon, "queue", "cancel", dead_job).returncode == 0
        wait_state(daemon, waiting, "dead")
        run.mode.write_text("ok")
        before = json.loads(capd(daemon, "queue", "show", waiting, "--json").stdout)
        retried = json.loads(capd(daemon, "queue", "retry", waiting, "--json").stdout)
        assert retried["state"] == "pending"
        # history is kept: created_at stays, the retry is a new entry of the trail
        assert retried["created_at"] == before["created_at"]
        assert retried["retried_at"] > before["created_at"]
        wait_state(daemon, waiting, "done")
        after = json.loads(capd(daemon, "queue", "show", waiting, "--json").stdout)
        assert after["created_at"] == before["created_at"]
        assert after["trail"][0] == before["trail"][0]  # the enqueue entry, unchanged
        assert [a["kind"] for a in after["trail"][:len(before["trail"])]] == [
            a["kind"] for a in before["trail"]]  # appended to, never rewritten
        assert any(a["kind"] == "operator" and "retry requested (was dead)" in a["detail"]
                   for a in after["trail"])
        refused = capd(daemon, "queue", "retry", waiting)
        assert refused.returncode == 1
        assert "only needs_operator, dead, cancelled or partial" in refused.stderr
        purge = capd(daemon, "queue", "purge", "--state", "done", "--older-than", "0s", "--json")
        assert json.loads(purge.stdout)["purged"] == 1
        stats = json.loads(capd(daemon, "queue", "stats", "--json").stdout)
        assert stats["by_state"]["cancelled"] == 1
        assert stats["by_state"]["done"] == 0
        unknown = capd(daemon, "queue", "show", "nope")
        assert unknown.returncode == 1
        assert "no job 'nope'" in unknown.stderr
        bad = daemon.call("POST", "/queue/purge?state=done&older_than=soon")
        assert (bad.status, "is not a duration" in bad.body["detail"]) == (400, True)
    finally:
        daemon.kill()


def test_a_corrupt_queue_file_stops_the_daemon_with_a_clear_message(short_tmp: Path) -> None:
    """Garbage in queue.db: the daemon refuses to start, says why, and leaves the file alone."""
    run = CrashRun(short_tmp)
    run.db.parent.mkdir(parents=True, exist_ok=True)
    garbage = b"definitely not sqlite" * 64
    run.db.write_bytes(garbage)
    done = subprocess.run([sys.executable, "-m", "capd", "serve", "--config",
                           str(short_tmp / "capd.toml"), "--socket", str(run.socket)],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**__import__("os").environ, **run.env})
    assert done.returncode == 1
    assert "is not a readable capd queue" in done.stderr
    assert "never replaces it" in done.stderr
    assert run.db.read_bytes() == garbage
