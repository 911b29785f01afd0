"""The generated CLI against a real daemon: output, --json parity with HTTP, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.daemon import DaemonProcess, Start

pytestmark = pytest.mark.slow  # starts the real daemon or the CLI as processes


def capd(daemon: DaemonProcess | None, *args: str, socket: Path | None = None
         ) -> subprocess.CompletedProcess[str]:
    path = socket or (daemon.socket if daemon else Path("/nonexistent"))
    return subprocess.run([sys.executable, "-m", "capd", *args, "--socket", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)


def test_json_output_equals_the_http_body(start: Start) -> None:
    """`--json` prints exactly what the HTTP route returns."""
    daemon = start()
    for argv, path in [(("show", "e2e.echo"), "/capabilities/e2e.echo"),
                       (("list",), "/capabilities"),
                       (("list", "--state", "live", "--tag", "e2e"),
                        "/capabilities?state=live&tag=e2e")]:
        done = capd(daemon, *argv, "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == daemon.call("GET", path).body


def test_call_with_key_value_and_json_params(start: Start) -> None:
    """`-p k=v` sends a string, `-p k:=json` a JSON value, `--params` a whole object."""
    daemon = start()
    done = capd(daemon, "call", "e2e.echo", "-p", "text=12", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == {"text": "12", "version": "v1"}
    slow = capd(daemon, "call", "e2e.slow", "-p", "seconds:=0", "--json")
    assert json.loads(slow.stdout)["result"] == "slept"
    whole = capd(daemon, "call", "e2e.echo", "--params", '{"text": "w"}')
    assert whole.returncode == 0
    assert json.loads(whole.stdout) == {"text": "w", "version": "v1"}


def test_output_json_and_yaml_print_the_body(start: Start) -> None:
    """`-o json` is --json; `-o yaml` prints the same body as YAML; `-o table` the default."""
    import yaml

    daemon = start()
    as_json = capd(daemon, "show", "e2e.echo", "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    body = json.loads(as_json.stdout)
    as_yaml = capd(daemon, "show", "e2e.echo", "-o", "yaml")
    assert as_yaml.returncode == 0, as_yaml.stderr
    assert yaml.safe_load(as_yaml.stdout)["parameters"] == body["parameters"]
    table = capd(daemon, "list", "-o", "table")
    assert table.stdout.startswith("STATE")
    wrong = capd(daemon, "list", "-o", "xml")
    assert wrong.returncode == 2


def test_failed_calls_exit_1_with_the_reason_on_stderr(start: Start, web: object) -> None:
    """Invalid params and unknown capabilities exit 1 with one sentence on stderr."""
    daemon = start()
    bad = capd(daemon, "call", "e2e.slow", "-p", "seconds=soon")
    assert bad.returncode == 1
    assert bad.stderr.startswith("capd: invalid parameters for 'e2e.slow': seconds")
    unknown = capd(daemon, "show", "e2e.nope")
    assert unknown.returncode == 1
    assert "unknown capability 'e2e.nope'" in unknown.stderr


def test_health_and_status_and_recheck(start: Start) -> None:
    """health prints the status line; status and recheck-tool answer with exit 0."""
    daemon = start()
    health = capd(daemon, "health")
    assert health.returncode == 0
    assert health.stdout.startswith("pass: all capabilities live")
    status = capd(daemon, "status", "--json")
    assert json.loads(status.stdout)["registry"]["live"] == 5
    tool = capd(daemon, "recheck-tool", "web", "--force", "--json")
    assert json.loads(tool.stdout)["probed"] is True
    assert capd(daemon, "readyz").stdout.strip() == "pass"


def test_reload_from_the_cli(start: Start) -> None:
    """`capd reload` blocks until the reload is done and reports it."""
    daemon = start()
    done = capd(daemon, "reload", "--json")
    assert done.returncode == 0
    assert json.loads(done.stdout)["ok"] is True


def test_no_daemon_says_so(short_tmp: Path) -> None:
    """With no daemon on the socket the CLI asks whether it is running; exit 1."""
    sock = short_tmp / "none.sock"
    done = capd(None, "health", socket=sock)
    assert done.returncode == 1
    assert done.stderr == (
        f"capd: is the daemon running? (socket: {sock}: No such file or directory)\n"
    )


def test_usage_errors_exit_2(short_tmp: Path) -> None:
    """A malformed -p or --params is a usage error: exit 2, before any request."""
    bad_p = capd(None, "call", "e2e.echo", "-p", "novalue", socket=short_tmp / "s")
    assert bad_p.returncode == 2
    assert "use key=value" in bad_p.stderr
    bad_json = capd(None, "call", "e2e.echo", "--params", "{nope", socket=short_tmp / "s")
    assert bad_json.returncode == 2
    twice = capd(None, "call", "e2e.echo", "--params", '{"text": "a"}', "-p", "text=b",
                 socket=short_tmp / "s")
    assert twice.returncode == 2
    assert "'text' is set by --params too" in twice.stderr
    missing = subprocess.run([sys.executable, "-m", "capd", "show"], capture_output=True,
                             text=True, timeout=30, check=False)
    assert missing.returncode == 2
