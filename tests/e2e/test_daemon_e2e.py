"""The real daemon as a subprocess on a temp socket: health, recheck, reload, drain, bad input."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from capd.sidecar.client._client import Response
from tests.helpers.daemon import DaemonProcess, FlipServer, Start

pytestmark = pytest.mark.slow  # starts the real daemon or the CLI as processes


def health_status(daemon: DaemonProcess) -> str:
    body = daemon.call("GET", "/health").body
    return str(body["status"])


def test_health_follows_a_real_tool_going_down_and_coming_back(
    start: Start, web: FlipServer
) -> None:
    """pass → warn (with a check naming the missing tool) → pass, with no caller involved."""
    daemon = start()
    first = daemon.call("GET", "/health")
    assert (first.status, first.body["status"]) == (200, "pass")
    assert first.content_type.startswith("application/health+json")
    web.healthy = False
    daemon.wait_until(lambda: health_status(daemon) == "warn")
    warn = daemon.call("GET", "/health")
    assert warn.status == 200
    check = warn.body["checks"]["capability:e2e.web"][0]
    assert check["observedValue"] == ["web"]
    assert "answered 503, expected 200" in check["output"]
    assert check["time"].endswith("Z")
    web.healthy = True
    daemon.wait_until(lambda: health_status(daemon) == "pass")


def test_recheck_restores_a_disabled_capability(start: Start, web: FlipServer) -> None:
    """POST /recheck re-probes the missing tool and restores the capability in place."""
    web.healthy = False
    daemon = start(recheck_interval_s=300, probe_live_interval_s=300)
    show = daemon.call("GET", "/capabilities/e2e.web").body
    assert show["state"] == "disabled"
    assert show["disabled"]["missing"] == ["web"]
    down = daemon.call("POST", "/call/e2e.web", {"text": "a"})
    assert (down.status, down.body["error_type"]) == (503, "capability_disabled")
    web.healthy = True
    outcome = daemon.call("POST", "/recheck/e2e.web")
    assert outcome.status == 200
    assert (outcome.body["state"], outcome.body["restored"]) == ("live", ["e2e.web"])
    up = daemon.call("POST", "/call/e2e.web", {"text": "a"})
    assert (up.status, up.body["status"]) == (200, "success")


def test_reload_picks_up_an_edited_plugin(start: Start, short_tmp: Path) -> None:
    """An edited op is live after POST /reload."""
    daemon = start()
    assert daemon.call("POST", "/call/e2e.echo", {"text": "a"}).body["result"]["version"] == "v1"
    plugin = short_tmp / "e2e_pack.py"
    plugin.write_text(plugin.read_text().replace('VERSION = "v1"', 'VERSION = "v2-edited"'))
    reload = daemon.call("POST", "/reload")
    assert (reload.status, reload.body["ok"]) == (200, True)
    after = daemon.call("POST", "/call/e2e.echo", {"text": "a"})
    assert after.body["result"]["version"] == "v2-edited"


def test_a_broken_plugin_reload_leaves_the_old_registry_serving(
    start: Start, short_tmp: Path
) -> None:
    """A syntax error in a plugin: reload answers 500 with why; calls keep the old op."""
    daemon = start()
    plugin = short_tmp / "e2e_pack.py"
    plugin.write_text(plugin.read_text() + "\ndef broken(:\n")
    reload = daemon.call("POST", "/reload")
    assert reload.status == 500
    assert reload.body["ok"] is False
    assert "plugin 'e2e_pack' failed to import: SyntaxError" in reload.body["error"]
    call = daemon.call("POST", "/call/e2e.echo", {"text": "still"})
    assert (call.status, call.body["result"]) == (200, {"text": "still", "version": "v1"})
    status = daemon.call("GET", "/status").body
    assert "SyntaxError" in status["reload"]["last"]["error"]
    assert daemon.wait_event("reload_failed")["error"] == reload.body["error"]
    # /health warns with the reason until the next good reload
    health = daemon.call("GET", "/health")
    assert (health.status, health.body["status"]) == (200, "warn")
    assert health.body["checks"]["reload:last"][0]["output"] == reload.body["error"]
    assert "the last reload failed" in health.body["output"]
    plugin.write_text(plugin.read_text().replace("\ndef broken(:\n", "\n"))
    assert daemon.call("POST", "/reload").status == 200
    health = daemon.call("GET", "/health")
    assert (health.body["status"], "reload:last" in health.body["checks"]) == ("pass", False)


def test_health_never_waits_on_a_slow_reload(start: Start, short_tmp: Path) -> None:
    """While a reload's probes take 5 s, /health and calls answer from the old snapshot."""
    flag = short_tmp / "slow"
    daemon = start(env={"E2E_SLOW_FLAG": str(flag)}, probe_live_interval_s=300)
    flag.touch()
    outcome: dict[str, Response] = {}
    reloader = threading.Thread(target=lambda: outcome.update(r=daemon.call("POST", "/reload")))
    reloader.start()
    daemon.wait_event("reload_started")
    answers = [daemon.call("GET", "/health") for _ in range(20)]
    call = daemon.call("POST", "/call/e2e.echo", {"text": "during"})
    assert reloader.is_alive(), "the reload finished before the health requests: not a test"
    assert [a.status for a in answers] == [200] * 20
    assert call.body["status"] == "success"
    reloader.join(30)
    assert outcome["r"].body["ok"] is True


def test_sigterm_drains_a_slow_call(start: Start, short_tmp: Path) -> None:
    """SIGTERM: new calls get 503, the slow call in flight completes, then a clean exit."""
    daemon = start()
    result: dict[str, Response] = {}
    caller = threading.Thread(target=lambda: result.update(
        r=daemon.call("POST", "/call/e2e.slow", {"seconds": 2})))
    caller.start()
    daemon.wait_until(lambda: daemon.call("GET", "/status").body["calls"]["in_flight"] == 1)
    daemon.signal(signal.SIGTERM)
    daemon.wait_event("draining")
    refused = daemon.call("POST", "/call/e2e.echo", {})
    assert refused.status == 503
    assert refused.body["title"] == "Draining"
    assert daemon.call("GET", "/readyz").status == 503
    assert daemon.call("GET", "/health").body["status"] == "fail"
    caller.join(30)
    assert (result["r"].status, result["r"].body["result"]) == (200, "slept")
    assert daemon.wait_exit() == 0
    assert not (short_tmp / "capd.sock").exists()


def test_bad_input_gets_clear_errors_and_the_daemon_keeps_serving(start: Start) -> None:
    """Malformed JSON 400, unknown 404, bad params or arguments 422, too big 413,
    browser 403."""
    daemon = start()
    import http.client

    def raw(method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
        conn = http.client.HTTPConnection("capd")
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(str(daemon.socket))
        conn.sock = sock
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        text = response.read().decode()
        conn.close()
        return response.status, text

    cases = [
        (raw("POST", "/call/e2e.echo", b"{not json", {}), 400, "malformed JSON body"),
        (raw("POST", "/call/e2e.echo", b"[1, 2]", {}), 422,
         "body: Input should be a valid dictionary"),
        (raw("POST", "/call/e2e.nope", b"{}", {}), 404, "unknown capability 'e2e.nope'"),
        (raw("POST", "/call/e2e.slow", b'{"seconds": "soon"}', {}), 422,
         "invalid parameters for 'e2e.slow': seconds"),
        (raw("POST", "/call/e2e.echo", b"x" * (1024 * 1024 + 10), {}), 413,
         "larger than 1048576 bytes"),
        (raw("GET", "/health", b"", {"Origin": "http://evil.example"}), 403, "Origin or Referer"),
        (raw("GET", "/health", b"", {"Referer": "http://evil.example/"}), 403, "Origin"),
        (raw("GET", "/no/such/route", b"", {}), 404, "Not Found"),
        (raw("POST", "/recheck-tool/nope", b"", {}), 404, "unknown tool 'nope'"),
        (raw("POST", "/recheck/e2e.web?force=maybe", b"", {}), 422,
         "force: Input should be a valid boolean"),
    ]
    for (status, text), expected_status, expected in cases:
        assert status == expected_status, text
        assert expected in text
    bad = daemon.call("POST", "/call/e2e.slow", {"seconds": "soon"})
    assert bad.content_type.startswith("application/problem+json")
    assert bad.body["errors"][0]["loc"] == ["seconds"]
    assert daemon.call("GET", "/health").status == 200
    assert daemon.call("POST", "/call/e2e.echo", {"text": "ok"}).body["status"] == "success"


def test_each_call_is_logged_with_the_callers_pid(start: Start) -> None:
    """One JSON log event per call: capability, status, duration and the caller's pid."""
    daemon = start()
    reply = daemon.call("POST", "/call/e2e.echo", {"text": "log"}, headers={"X-Request-Id": "r-42"})
    assert reply.headers["X-Request-Id"] == "r-42"
    event = daemon.wait_event("call", where=lambda e: e.get("request_id") == "r-42")
    assert event["capability"] == "e2e.echo"
    assert event["status"] == "success"
    assert event["caller_pid"] == os.getpid()
    assert event["duration_s"] >= 0


def test_a_stale_socket_is_replaced_and_a_second_daemon_refused(
    start: Start, short_tmp: Path, web: FlipServer
) -> None:
    """A dead socket file is replaced; a live daemon on the socket makes a second one exit 1."""
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(short_tmp / "capd.sock"))
    stale.close()  # the file stays, nothing listens: what a crash leaves
    daemon = start()
    assert daemon.call("GET", "/livez").status == 200
    # Its own state dir: the socket check is what this pins (two daemons on one state dir
    # have their own test in test_hardening_e2e).
    second = subprocess.run(
        [sys.executable, "-m", "capd", "serve", "--config", str(daemon.config),
         "--socket", str(daemon.socket)], capture_output=True, text=True, timeout=60,
        check=False, env={**os.environ, "CAPD_STATE_DIR": str(short_tmp / "state2")})
    assert second.returncode == 1
    assert f"another capd is already serving on {daemon.socket}" in second.stderr
    assert daemon.call("GET", "/livez").status == 200


def test_socket_and_folder_modes(start: Start, short_tmp: Path) -> None:
    """The socket file is 0660; a runtime folder we create is 0750."""
    daemon = start()
    assert (daemon.socket.stat().st_mode & 0o777) == 0o660
    nested = short_tmp / "run" / "capd.sock"
    second = DaemonProcess(daemon.config, nested,
                           env={"CAPD_STATE_DIR": str(short_tmp / "state2")}).start().wait_ready()
    try:
        assert (nested.parent.stat().st_mode & 0o777) == 0o750
    finally:
        assert second.stop() == 0


def test_wrong_method_is_405_as_problem_json(start: Start) -> None:
    """A known path with the wrong method is 405 with a problem body naming the method."""
    daemon = start()
    wrong = daemon.call("GET", "/call/e2e.echo")
    assert wrong.status == 405
    assert wrong.content_type.startswith("application/problem+json")
    assert wrong.body["detail"] == "GET /call/e2e.echo: use POST"


def test_a_hung_plain_op_does_not_hold_a_stopping_daemon(start: Start) -> None:
    """A sync op stuck past its timeout: the call times out, and SIGTERM still exits promptly."""
    daemon = start(drain_grace_s=1)
    reply = daemon.call("POST", "/call/e2e.hang", {})
    assert (reply.status, reply.body["error_type"]) == (503, "timeout")
    daemon.signal(signal.SIGTERM)
    assert daemon.wait_exit(timeout=15) == 0
    assert daemon.wait_event("stopped")["event"] == "stopped"
