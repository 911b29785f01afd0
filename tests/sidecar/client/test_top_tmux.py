"""``capd top``: its figures from two snapshots, its escaping, and the real view in tmux
following the real daemon down and back."""

from __future__ import annotations

import math
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from capd.sidecar._errors import DaemonUnreachable
from capd.sidecar.client._top import Watch, _RowFailed, render
from capd.sidecar.client._top_figures import (
    Disabled,
    Job,
    QueueFigures,
    Sample,
    Tool,
    View,
    call_figures,
    delta,
    overall_rate,
    parse_metrics,
    quantile,
    refusal_figures,
)
from tests.helpers.daemon import FlipServer, Start
from tests.helpers.servers import ROOT

BOUNDS = ("0.0005", "0.001", "0.0025", "0.005", "0.01", "+Inf")


def metrics_text(per_bucket: dict[str, int], blocks: int = 0, capability: str = "e2e.echo"
                 ) -> str:
    """A /metrics text with ``per_bucket`` calls of ``capability`` (not cumulative) and
    ``blocks`` loop refusals, as the daemon writes it."""
    lines = ["# TYPE capd_call_duration_seconds histogram"]
    running = 0
    for bound in BOUNDS:
        running += per_bucket.get(bound, 0)
        lines.append(f'capd_call_duration_seconds_bucket{{capability="{capability}",'
                     f'le="{bound}"}} {running}.0')
    lines += [f'capd_call_duration_seconds_count{{capability="{capability}"}} {running}.0',
              f'capd_call_duration_seconds_sum{{capability="{capability}"}} 0.1',
              "# TYPE capd_policy_decisions_total counter",
              f'capd_policy_decisions_total{{decision="block",kind="loop"}} {blocks}.0',
              f'capd_policy_decisions_total{{decision="allow",kind="loop"}} {running}.0',
              "# TYPE capd_calls_total counter",
              f'capd_calls_total{{capability="{capability}",status="success"}} {running}.0',
              f'capd_calls_total{{capability="{capability}",status="error_blocked"}} '
              f'{blocks}.0']
    return "\n".join(lines) + "\n"


def test_rates_and_quantiles_come_from_the_difference_of_two_snapshots() -> None:
    """Calls per second and p50/p99 count only what happened between the two samples."""
    before = Sample(taken_at=10.0, counters=parse_metrics(metrics_text({"0.001": 10})))
    after = Sample(taken_at=12.0, counters=parse_metrics(metrics_text(
        {"0.001": 10, "0.0025": 50, "0.01": 50})))
    assert overall_rate([before, after]) == pytest.approx(50.0)  # 100 calls in 2 s
    [row] = call_figures([before, after])
    assert row.capability == "e2e.echo"
    assert row.per_s == pytest.approx(50.0)
    assert row.calls == 100
    assert row.p50_s == pytest.approx(0.0025)  # the 50th of 100 ends the (1 ms, 2.5 ms] bucket
    assert row.p99_s == pytest.approx(0.005 + 0.005 * 49 / 50)  # linear in (5 ms, 10 ms]


def test_one_sample_has_no_rate_yet() -> None:
    """With one sample there is no interval: no rate, figures since the daemon started."""
    only = Sample(taken_at=1.0, counters=parse_metrics(metrics_text({"0.001": 4})))
    assert overall_rate([only]) is None
    [row] = call_figures([only])
    assert row.per_s is None
    assert row.calls == 4


def test_a_counter_that_went_down_counts_from_zero() -> None:
    """A restarted daemon's smaller totals are new calls, not a negative rate."""
    assert delta({"a": 10.0, "b": 5.0}, {"a": 3.0, "b": 7.0, "c": 1.0}) == {
        "a": 3.0, "b": 2.0, "c": 1.0}


def test_quantile_edges() -> None:
    """No observation gives None; a quantile in +Inf gives the largest finite bound."""
    assert quantile(0.5, []) is None
    assert quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None
    assert quantile(0.99, [(0.1, 1.0), (1.0, 1.0), (math.inf, 100.0)]) == 1.0
    assert quantile(0.5, [(0.1, 10.0), (math.inf, 10.0)]) == pytest.approx(0.05)


def test_refusals_are_the_blocks_between_two_snapshots() -> None:
    """Refusals by policy step and blocked calls by capability, over the window only."""
    before = Sample(taken_at=0.0, counters=parse_metrics(metrics_text({"0.001": 1}, blocks=2)))
    after = Sample(taken_at=5.0, counters=parse_metrics(metrics_text({"0.001": 1}, blocks=5)))
    assert refusal_figures([before, after]) == ({"loop": 3.0}, {"e2e.echo": 3.0})
    assert refusal_figures([before, before]) == ({}, {})


def test_what_the_daemon_names_is_escaped_in_every_section() -> None:
    """A name or error holding terminal escapes is shown escaped, on its own row."""
    evil = "evil\x1b]0;owned\x07\n\u202e"
    sample = Sample(
        taken_at=1.0, pid=1, state="ready", version="0.1.0", counts={"live": 1, "disabled": 1},
        disabled=(Disabled(evil, (evil,), {evil: "boom\x1b[2J"}, since=0.0),),
        tools=(Tool(evil, ok=False, latency_s=0.01, checked_at=0.0, error="\x1b[31mred"),),
        queue=QueueFigures({"pending": 1}, 3.0, Job(evil, evil, 0.0, 1, 8, "\x9b6n")),
        counters=parse_metrics(metrics_text({"0.001": 1}, capability="evil\x1b[1m")),
    )
    lines = render(View(Path("/tmp/s\x1bock"), 10.0, [sample]))
    text = "\n".join(line for line, _style in lines)
    assert "\x1b" not in text
    assert "\x07" not in text
    assert "\x9b" not in text
    assert "\u202e" not in text
    assert "evil\\x1b]0;owned\\x07\\n\\u202e" in text
    assert all("\n" not in line for line, _style in lines)


def test_an_upstream_server_shows_its_session_under_its_tool() -> None:
    """An MCP server's session: connected, since when, what it is and its tools; or not
    connected with its last error, as a warning."""
    up = Tool("time_mcp", ok=True, latency_s=0.002, checked_at=95.0, error=None, upstream={
        "kind": "stdio", "connected": True, "since": 40.0, "tools": 2, "in_flight": 1,
        "server": {"name": "mcp-time", "version": "1.2"}, "last_error": None})
    lost = Tool("git_mcp", ok=False, latency_s=None, checked_at=95.0, error="gone", upstream={
        "kind": "http", "connected": False, "since": 90.0, "tools": 5, "in_flight": 0,
        "server": None, "last_error": "EndOfStream: \x1b[2J"})
    sample = Sample(taken_at=1.0, pid=1, state="ready", tools=(up, lost))
    lines = render(View(Path("/tmp/s"), 100.0, [sample]))
    shown = {text.strip(): style for text, style in lines}
    assert shown["mcp stdio: connected since 1m00s ago mcp-time 1.2, 2 tools, 1 calls in "
                 "flight"] == "plain"
    assert shown["mcp http: NOT CONNECTED since 10s ago: EndOfStream: \\x1b[2J"] == "warn"


def answers(bodies: dict[str, Any]) -> Callable[[str], Any]:
    """A getter answering ``bodies`` by path; a missing path is a daemon that is down."""

    def get(path: str) -> Any:
        if path not in bodies:
            raise DaemonUnreachable(f"is the daemon running? (socket: /x: {path})")
        body = bodies[path]
        if isinstance(body, Exception):
            raise body
        return body

    return get


STATUS = {"pid": 7, "state": "ready", "version": "0.1.0", "uptime_s": 3.0,
          "registry": {"live": 2, "disabled": 0, "errors": [],
                       "tools": {"web": {"ok": True, "latency_s": 0.001, "checked_at": 1.0,
                                         "error": None}}},
          "calls": {"in_flight": 0}}


def test_a_daemon_away_is_shown_with_since_when_and_data_comes_back() -> None:
    """Down: one headline with the time it went away, kept while it stays away; back: data."""
    bodies: dict[str, Any] = {}
    watch = Watch(Path("/tmp/x.sock"), answers(bodies))
    watch.refresh(0.0, 3600.0)
    watch.refresh(1.0, 3700.0)
    [_title, (headline, style), _reason] = render(watch.view(3700.0))
    since = time.strftime("%H:%M:%S", time.localtime(3600.0))
    assert headline == f"daemon not reachable at /tmp/x.sock (since {since}), retrying"
    assert style == "warn"
    bodies.update({"/status": STATUS, "/metrics": metrics_text({"0.001": 1}),
                   "/capabilities?state=disabled&limit=20": {"capabilities": []},
                   "/queue/stats": {"by_state": {"pending": 0}, "oldest_pending_age_s": None}})
    watch.refresh(2.0, 3800.0)
    text = "\n".join(line for line, _style in render(watch.view(3800.0)))
    assert watch.away is None
    assert "2 live" in text
    assert "pending 0" in text
    assert "e2e.echo" in text


def test_a_row_the_daemon_refuses_is_a_problem_of_its_section() -> None:
    """/metrics and /queue/stats that fail leave the rest of the view standing."""
    get = answers({"/status": STATUS, "/metrics": "<html>not prometheus {",
                   "/capabilities?state=disabled&limit=20": {"capabilities": []},
                   "/queue/stats": _RowFailed("GET /queue/stats answered 400: the retry queue "
                                              "is not open")})
    watch = Watch(Path("/tmp/x.sock"), get)
    watch.refresh(0.0, 0.0)
    [sample] = watch.samples
    assert set(sample.problems) == {"metrics", "queue"}
    text = "\n".join(line for line, _style in render(watch.view(0.0)))
    assert "2 live" in text
    assert "the retry queue is not open" in text


def test_status_refused_is_shown_as_the_reason() -> None:
    """A daemon that answers but refuses /status (not an operator) says so, and retries."""
    watch = Watch(Path("/tmp/x.sock"), answers(
        {"/status": _RowFailed("GET /status answered 403: operators only")}))
    watch.refresh(0.0, 0.0)
    assert watch.away is not None
    assert "answers, but not its status" in watch.away.headline
    assert watch.away.reason == "GET /status answered 403: operators only"


# ----------------------------------------------------------------------- in a terminal


class Tmux:
    """A private tmux server (its own socket, no user config) running one command in one
    session. The command's exit status and stderr go to files: tmux 3.3 can leave a dead
    pane's process unreaped, so ``#{pane_dead_status}`` is not to be relied on."""

    def __init__(self, folder: Path) -> None:
        self.base = ["tmux", "-S", str(folder / "tmux.sock"), "-f", "/dev/null"]
        self.session = f"top-{uuid.uuid4().hex[:8]}"
        self.status_file = folder / "top.status"
        self.stderr_file = folder / "top.stderr"

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=10,
                              check=check)

    def start(self, command: list[str], width: int = 160, height: int = 50) -> None:
        """Run ``command`` in a new detached session of ``width`` x ``height``."""
        # The shell waits for the command and writes its status; its trap (a handler, not an
        # ignore, so the command still gets SIGINT) keeps it alive through a Ctrl-C.
        script = (f"trap : INT; {shlex.join(command)} 2>{shlex.quote(str(self.stderr_file))};"
                  f" echo $? >{shlex.quote(str(self.status_file))}")
        self.run("new-session", "-d", "-s", self.session, "-x", str(width), "-y", str(height),
                 "-c", str(ROOT), "sh", "-c", script)

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", self.session).stdout

    def running(self) -> bool:
        """Whether the command still runs (no status yet) in a session that still exists."""
        alive = self.run("has-session", "-t", self.session, check=False).returncode == 0
        return alive and not self.status_file.exists()

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", self.session, *keys)

    def wait_screen(self, check: Callable[[str], bool], what: str, timeout_s: float = 15.0
                    ) -> str:
        """The screen once ``check`` takes it (bounded); ``what`` names it for the failure."""
        deadline = time.monotonic() + timeout_s
        while True:
            screen = self.screen()
            if check(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"the screen never showed {what}:\n{screen}")
            time.sleep(0.1)

    def wait_for(self, *needles: str) -> str:
        """The screen once it shows every one of ``needles`` (bounded)."""
        return self.wait_screen(lambda screen: all(n in screen for n in needles), str(needles))

    def wait_exit(self, timeout_s: float = 10.0) -> int:
        """The command's exit status once it has exited and its session has ended (bounded)."""
        deadline = time.monotonic() + timeout_s
        while True:
            ended = self.run("has-session", "-t", self.session, check=False).returncode != 0
            if ended and self.status_file.exists():
                return int(self.status_file.read_text())
            if time.monotonic() > deadline:
                raise AssertionError(f"capd top did not exit (session ended: {ended})")
            time.sleep(0.1)

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, timeout=10,
                       check=False)


@pytest.fixture
def tmux(short_tmp: Path) -> Iterator[Tmux]:
    """A tmux server for one test; killed, with every session in it, at the end."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (.ci/deps installs it): no terminal to run capd top in")
    server = Tmux(short_tmp)
    try:
        yield server
    finally:
        server.close()


def top_command(socket: Path) -> list[str]:
    return [sys.executable, "-m", "capd", "top", "--interval", "0.3", "--socket", str(socket)]


@pytest.mark.slow
def test_top_follows_the_daemon_down_and_back_in_a_real_terminal(
        tmux: Tmux, start: Start, web: FlipServer) -> None:
    """Counts, a disabled capability, the queued job and refusals; a resize; the daemon
    killed (not reachable, still running) and started again (data again); q exits 0."""
    web.healthy = False  # e2e.web starts disabled: missing web
    daemon = start()
    queued = daemon.call("POST", "/call/e2e.flaky", {"text": "w"})
    assert queued.status == 202
    assert queued.body["queued"]
    tmux.start(top_command(daemon.socket))
    screen = tmux.wait_for("4 live", "1 disabled", "pending 1", "e2e.web")
    assert "missing web" in screen
    assert "e2e.flaky, attempt" in screen  # the oldest pending job
    for _ in range(6):  # the same call again and again: the loop detector refuses 5th and 6th
        daemon.call("POST", "/call/e2e.echo", {"text": "same"}, headers={"Capd-Session": "s"})
    screen = tmux.wait_for("policy refusals by step: loop 2",
                           "calls answered error_blocked: e2e.echo 2")
    assert "loop block  e2e.echo:" in screen  # the latest refusals, each with its reason

    tmux.run("resize-window", "-t", tmux.session, "-x", "24", "-y", "4")
    small = tmux.wait_screen(  # drawn again at the new size: each line cut to 23 columns
        lambda screen: screen.startswith("capd")
        and max(len(line.rstrip()) for line in screen.splitlines()) <= 23, "a 24x4 drawing")
    assert len(small.splitlines()) <= 4
    tmux.run("resize-window", "-t", tmux.session, "-x", "160", "-y", "50")
    tmux.wait_for("q quits", "4 live", "pending 1")
    assert tmux.running()

    daemon.kill()
    screen = tmux.wait_for(f"daemon not reachable at {daemon.socket}", "retrying")
    assert tmux.running()

    start()  # the same socket, the same queue file
    tmux.wait_for("4 live", "pending 1", "e2e.web")

    tmux.keys("q")
    assert tmux.wait_exit() == 0
    assert tmux.stderr_file.read_text() == ""


@pytest.mark.slow
def test_ctrl_c_exits_130_without_a_traceback(tmux: Tmux, short_tmp: Path) -> None:
    """Ctrl-C while the daemon is away: exit 130, the terminal restored, nothing printed."""
    tmux.start(top_command(short_tmp / "nobody.sock"))
    tmux.wait_for("daemon not reachable at", "retrying")
    tmux.keys("C-c")
    assert tmux.wait_exit() == 130
    assert tmux.stderr_file.read_text() == ""  # quietly: no traceback, no sentence
