"""Peer allowlist (a real second uid), per-peer rate limit, /metrics, log formats."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.daemon import FlipServer, Start, write_e2e_config
from tests.helpers.peers import curl_as, open_up

pytestmark = pytest.mark.slow  # starts the real daemon or the CLI as processes









def test_a_peer_with_another_uid_is_refused(start: Start, peer_uid: int) -> None:
    """Another uid gets 403 and a log line with its uid and pid; the daemon's uid is served."""
    daemon = start()
    open_up(daemon)
    assert curl_as(peer_uid, daemon.socket, "/health") == "403"
    event = daemon.wait_event("peer_denied")
    assert event["uid"] == peer_uid
    assert event["pid"] > 0
    assert daemon.call("GET", "/health").status == 200


def test_an_allowed_uid_is_served(start: Start, peer_uid: int) -> None:
    """With allow_uids the same peer is served."""
    daemon = start(allow_uids=[peer_uid])
    open_up(daemon)
    assert curl_as(peer_uid, daemon.socket, "/health") == "200"


def test_call_rate_limit_per_peer(start: Start) -> None:
    """Past the burst, /call answers 429 with Retry-After; other routes are not limited."""
    daemon = start(call_rate_per_s=0.5, call_burst=2)
    statuses = [daemon.call("POST", "/call/e2e.echo", {}).status for _ in range(3)]
    assert statuses == [200, 200, 429]
    limited = daemon.call("POST", "/call/e2e.echo", {})
    assert int(limited.headers["Retry-After"]) >= 1
    assert daemon.call("GET", "/health").status == 200


def test_metrics_match_the_calls_made(start: Start) -> None:
    """Scraped and parsed with prometheus_client: counts and histograms match the calls."""
    daemon = start()
    for _ in range(3):
        assert daemon.call("POST", "/call/e2e.echo", {"text": "m"}).status == 200
    assert daemon.call("POST", "/call/e2e.slow", {"seconds": 0}).status == 200
    reply = daemon.call("GET", "/metrics")
    assert reply.status == 200
    assert reply.content_type.startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(reply.body):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    assert samples[("capd_calls_total", (("capability", "e2e.echo"),
                                         ("status", "success")))] == 3
    assert samples[("capd_calls_total", (("capability", "e2e.slow"),
                                         ("status", "success")))] == 1
    assert samples[("capd_call_duration_seconds_count", (("capability", "e2e.echo"),))] == 3
    assert samples[("capd_capabilities", (("state", "live"),))] == 5
    assert samples[("capd_tool_up", (("tool", "web"),))] == 1
    assert samples[("capd_queue_jobs", (("state", "pending"),))] == 0
    cli = subprocess.run([sys.executable, "-m", "capd", "metrics", "--socket",
                          str(daemon.socket)], capture_output=True, text=True, timeout=30,
                         check=False)
    assert cli.returncode == 0
    assert 'capd_calls_total{capability="e2e.echo",status="success"} 3.0' in cli.stdout


def test_console_log_format(short_tmp: Path, web: FlipServer) -> None:
    """--log-format console prints human lines, not JSON."""
    config = write_e2e_config(short_tmp, web.port)
    proc = subprocess.Popen(
        [sys.executable, "-m", "capd", "serve", "--config", str(config), "--socket",
         str(short_tmp / "c.sock"), "--log-format", "console"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "ready" in line:
                assert not line.startswith("{")
                assert "[info" in line
                break
    finally:
        proc.terminate()
        proc.wait(20)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_a_search_query_is_bounded_and_spends_the_callers_rate(start: Start) -> None:
    """A 60 KB query (or over 64 words) is a 400 saying the bound, at once; a query
    within it answers; searches spend the caller's call rate like calls (429 past it)."""
    daemon = start(call_rate_per_s=0.5, call_burst=3)
    huge = daemon.call("GET", "/search?q=" + "echo%20" * 5_000)  # 30 KB
    assert huge.status == 400
    assert "at most 64 words and 1024 bytes" in huge.body["detail"]
    head = daemon.call("GET", "/search?q=" + "echo%20" * 12_000)  # past the head's 64 KiB
    assert head.status == 400
    assert "exceed 64 KiB" in head.body["detail"]
    wordy = daemon.call("GET", "/search?q=" + "%20".join(["a"] * 65))
    assert wordy.status == 400
    found = daemon.call("GET", "/search?q=echo%20the%20text")
    assert found.status == 200
    assert found.body["results"]
    statuses = [daemon.call("GET", "/search?q=echo").status for _ in range(3)]
    assert statuses[-1] == 429
    assert daemon.call("GET", "/health").status == 200
