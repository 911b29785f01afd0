"""Soak: hours of mixed work against one daemon, to show that its memory, fds and tasks stay flat.

Starts the real daemon (`capd serve`) on a config of its own in a temporary folder: a
plugin pack with a cheap capability (``soak.echo``), two queued writes (``soak.flaky``,
always busy, and ``soak.settle``, busy every other try) and one upstream MCP server
over stdio (`mcp-server-time`, through capd's relay as an operator runs it). For
``--minutes`` it then runs, all at once:

- the load, in a process of its own: ``--clients`` keep-alive connections over the
  Unix socket (capd's own client, ``UnixHttp``) sharing one paced schedule of
  ``--rate`` calls/s (a slot more than 1 s late is skipped and counted as missed, so
  a stall never turns into a burst). Of every 20 calls: 16 ``soak.echo``, 2
  ``time_mcp.get_current_time``, 1 ``soak.flaky``, 1 ``soak.settle``. Writes carry
  an ``Idempotency-Key`` of their own; every client sends a ``Capd-Session`` that
  changes every ``--session-s`` (agents come and go; 0 keeps one per client). Loop
  detection stays on with thresholds out of reach, so it counts every call of every
  session without refusing any;
- the queue: ``retry_max_attempts = 3`` from 0.2 s, so a ``soak.flaky`` job is dead
  within about a second and a ``soak.settle`` job done at its first replay; every
  ``--purge-s`` both states are purged (``POST /queue/purge``, older than 0 s), so
  the database holds seconds of jobs, not hours;
- the operator: ``POST /reload`` every ``--reload-s``; every ``--recheck-s`` a forced
  ``POST /recheck/NAME`` and ``POST /recheck-tool/TOOL`` in turn; every
  ``--restart-s`` (the first at the earlier of that and half the run) a SIGKILL of
  the `mcp-server-time` process under the daemon, then ``time_mcp.get_current_time``
  called until it answers (the daemon heals by itself; no reload) and the killed
  processes checked gone (reaped);
- a prober, in a process of its own: ``GET /health`` on a fresh connection
  ``--health-hz`` times a second (what a supervisor does).

Every ``--window-s`` it records the daemon's RSS and peak RSS (/proc/PID/status),
open fds (/proc/PID/fd), threads, CPU, owned tasks (``GET /status`` → ``tasks``),
queue counts and event-loop lag; the prober's /health p50/p99; the calls done,
missed and failed. At the end: the least-squares slope of RSS (KiB/min), fds and
tasks over the windows after ``--warmup-windows``, and /health p99 of the first
window against the last; a JSON file (``--out``) and a markdown table.

The daemon has no way to hand out tracemalloc snapshots, so this bench cannot say
*where* memory grows, only whether it does.

    python bench/soak.py [--minutes 120] [--window-s 60] [--rate 500] [--out FILE]
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/queue.py would shadow the standard library's `queue` (which multiprocessing and
# aiosqlite import): keep this folder off sys.path, and put the repository on it.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse
import asyncio
import collections
import contextlib
import json
import math
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import textwrap
import threading
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from bench._harness import REPO, machine, stop, tree_cpu_s

PACK = textwrap.dedent('''
    import itertools

    from pydantic import BaseModel, Field
    from capd.registry import TransientToolError, op


    class Text(BaseModel):
        text: str = Field("x", description="Text.")


    @op("soak.echo")
    async def echo(params: Text) -> dict:
        return {"text": params.text}


    @op("soak.flaky")
    async def flaky(params: Text) -> None:
        raise TransientToolError("the backend is busy")


    _turns = itertools.count()


    @op("soak.settle")
    async def settle(params: Text) -> str:
        if next(_turns) % 2 == 0:
            raise TransientToolError("busy this time")
        return "written"


    async def gate_probe() -> bool:
        return True
''')

CAPS = textwrap.dedent('''
    [[capability]]
    name = "soak.echo"
    op = "soak.echo"
    summary = "Echo text."
    requires = ["gate"]

    [[capability]]
    name = "soak.flaky"
    op = "soak.flaky"
    summary = "A write whose backend is always busy: queued, dead after three tries."
    mutates_state = true
    retry_policy = "replay"

    [[capability]]
    name = "soak.settle"
    op = "soak.settle"
    summary = "A write whose backend is busy every other try: queued, done on replay."
    mutates_state = true
    retry_policy = "replay"
''')

CONFIG = textwrap.dedent('''
    plugins = ["soak_pack"]
    plugin_paths = ["."]
    declarations = ["caps.toml"]
    entry_points = false
    state_dir = "state"
    recheck_cooldown_s = 0
    recheck_interval_s = 1
    probe_live_interval_s = 2
    retry_base_s = 0.2
    retry_factor = 2
    retry_max_attempts = 3

    # loop detection counts every call of every session, and refuses none
    [policy.loops]
    warn_at = 100000000
    block_at = 100000001
    per_minute_warn = 100000000
    per_minute_block = 100000001

    [tools.gate]
    kind = "python"
    target = "soak_pack:gate_probe"
    timeout_s = 10

    [tools.time_mcp]
    kind = "mcp"
    command = {command}
    timeout_s = 30
''')

UPSTREAM_MODULE = "mcp_server_time"
UPSTREAM_CALL = "/call/time_mcp.get_current_time"

# What the load sends, by kind: (path, body); of every 20 slots, in this order.
KINDS: dict[str, tuple[str, dict[str, str]]] = {
    "echo": ("/call/soak.echo", {"text": "soak"}),
    "upstream": (UPSTREAM_CALL, {"timezone": "UTC"}),
    "flaky": ("/call/soak.flaky", {"text": "soak"}),
    "settle": ("/call/soak.settle", {"text": "soak"}),
}
MIX = ["echo"] * 8 + ["upstream"] + ["echo"] * 8 + ["upstream", "flaky", "settle"]
WRITES = frozenset({"flaky", "settle"})
# The answers each kind expects: 503 from the upstream while it is restarting, 202 queued.
EXPECTED: dict[str, frozenset[int]] = {
    "echo": frozenset({200}), "upstream": frozenset({200, 503}),
    "flaky": frozenset({202}), "settle": frozenset({200, 202}),
}
LATE_S = 1.0  # a load slot later than this is skipped (counted as missed)
CHILD_GRACE_S = 60.0  # the load and the prober end this long after the run's end, at the latest


# ---------------------------------------------------------------------------- figures

def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values`` by nearest rank; 0.0 when there are none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def slope_per_min(xs_min: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ``ys`` over ``xs_min`` (per minute); None under two points."""
    if len(xs_min) < 2:
        return None
    mx, my = statistics.fmean(xs_min), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs_min)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs_min, ys, strict=True)) / sxx


# ---------------------------------------------------------------------------- the load

@dataclass
class _LoadWindow:
    """What the load did since the last report."""

    statuses: dict[str, collections.Counter[str]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter))
    latencies_s: list[float] = field(default_factory=list)
    missed: int = 0

    def summary(self) -> dict[str, Any]:
        done = sum(sum(c.values()) for c in self.statuses.values())
        errors = sum(n for kind, c in self.statuses.items() for status, n in c.items()
                     if not status.isdigit() or int(status) not in EXPECTED[kind])
        return {"done": done, "errors": errors, "missed": self.missed,
                "upstream_ok": self.statuses["upstream"]["200"],
                "upstream_unavailable": self.statuses["upstream"]["503"],
                "p50_ms": percentile(self.latencies_s, 0.5) * 1e3,
                "p99_ms": percentile(self.latencies_s, 0.99) * 1e3,
                "by_kind": {k: dict(c) for k, c in sorted(self.statuses.items())}}


def run_load(sock: str, rate: float, clients: int, session_s: float,
             conn: Connection) -> None:
    """The load process: say ready, wait for ("go", start, end) in wall-clock seconds,
    run the paced load until ``end``; answer "report" with the window's summary; end on
    "stop" or ``CHILD_GRACE_S`` after ``end``."""
    import uvloop

    uvloop.run(_load(sock, rate, clients, session_s, conn))


async def _load(sock: str, rate: float, clients: int, session_s: float,
                conn: Connection) -> None:
    from capd.sidecar.client._unixhttp import UnixHttp

    http = UnixHttp(sock, timeout_s=30)
    window = _LoadWindow()
    stopped = asyncio.Event()
    conn.send("ready")
    if not conn.poll(120):
        return
    command, start_wall, end_wall = conn.recv()
    if command != "go":
        return
    loop = asyncio.get_running_loop()
    start = time.monotonic() + (start_wall - time.time())
    end = start + (end_wall - start_wall)
    slot = 0

    def on_command() -> None:
        nonlocal window
        message = conn.recv()
        if message == "report":
            window, done = _LoadWindow(), window
            conn.send(done.summary())
        elif message == "stop":
            stopped.set()

    loop.add_reader(conn.fileno(), on_command)

    async def worker(index: int) -> None:
        nonlocal slot
        pid = os.getpid()
        while not stopped.is_set():
            k, slot = slot, slot + 1
            due = start + k / rate
            if due >= end:
                return
            late = time.monotonic() - due
            if late > LATE_S:
                window.missed += 1
                continue
            if late < 0:
                await asyncio.sleep(-late)
            kind = MIX[k % len(MIX)]
            path, body = KINDS[kind]
            turn = int((due - start) // session_s) if session_s > 0 else 0
            headers = {"Capd-Session": f"soak-{index}-{turn}"}
            if kind in WRITES:
                headers["Idempotency-Key"] = f"soak-{pid}-{k}"
            began = time.perf_counter()
            try:
                status, _ = await http.request("POST", path, body=json.dumps(body).encode(),
                                               headers=headers)
            except (OSError, TimeoutError) as exc:
                window.statuses[kind][type(exc).__name__] += 1
                await asyncio.sleep(0.05)  # the daemon is gone or stuck: do not spin
                continue
            window.latencies_s.append(time.perf_counter() - began)
            window.statuses[kind][str(status)] += 1

    try:
        async with asyncio.TaskGroup() as group:
            for index in range(clients):
                group.create_task(worker(index))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, end - time.monotonic()) + CHILD_GRACE_S):
                await stopped.wait()
    finally:
        loop.remove_reader(conn.fileno())
        await http.close()


# ---------------------------------------------------------------------------- the prober

def health_ms(sock: str, timeout_s: float = 5.0) -> tuple[int | None, float]:
    """``GET /health`` on a fresh connection: (status or None, milliseconds to the end of
    the answer)."""
    began = time.perf_counter()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(sock)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n")
            answer = bytearray()
            while chunk := s.recv(65536):
                answer += chunk
    except OSError:
        return None, (time.perf_counter() - began) * 1e3
    elapsed = (time.perf_counter() - began) * 1e3
    if not answer.startswith(b"HTTP/1."):
        return None, elapsed
    return int(answer[9:12]), elapsed


def run_prober(sock: str, hz: float, conn: Connection) -> None:
    """The prober process: like the load, ready → go → probe until the end; "report"
    answers the window's /health figures."""
    conn.send("ready")
    if not conn.poll(120):
        return
    command, _start_wall, end_wall = conn.recv()
    if command != "go":
        return
    latencies: list[float] = []
    statuses: collections.Counter[str] = collections.Counter()
    next_at = time.monotonic()
    while time.time() < end_wall + CHILD_GRACE_S:
        if conn.poll(max(0.0, next_at - time.monotonic())):
            message = conn.recv()
            if message == "stop":
                return
            if message == "report":
                conn.send({"n": len(latencies), "p50_ms": percentile(latencies, 0.5),
                           "p99_ms": percentile(latencies, 0.99),
                           "max_ms": max(latencies, default=0.0),
                           "statuses": dict(statuses)})
                latencies, statuses = [], collections.Counter()
            continue
        next_at = max(next_at + 1 / hz, time.monotonic())  # late: no catching up in a burst
        if time.time() >= end_wall:
            continue
        status, ms = health_ms(sock)
        statuses[str(status)] += 1
        if status is not None:
            latencies.append(ms)


# ---------------------------------------------------------------------------- the daemon

class DaemonLog:
    """Reads the daemon's JSON log lines off its stdout pipe (fast enough never to hold
    the daemon up): counts lines and events, keeps the last lines and every error."""

    def __init__(self, stream: Any) -> None:
        import orjson

        self._loads = orjson.loads
        self._stream = stream
        self.ready = threading.Event()
        self.lines = 0
        self.events: collections.Counter[str] = collections.Counter()
        self.tail: collections.deque[str] = collections.deque(maxlen=40)
        self.errors: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=self._read, name="daemon-log", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for raw in self._stream:
            self.lines += 1
            line = raw.decode(errors="replace").rstrip("\n")
            self.tail.append(line)
            try:
                event = self._loads(raw)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            name = str(event.get("event"))
            self.events[name] += 1
            if name == "ready":
                self.ready.set()
            if event.get("level") == "error" and len(self.errors) < 50:
                self.errors.append(event)

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)


def proc_figures(pid: int) -> dict[str, float]:
    """RSS and peak RSS (KiB), threads and open fds of ``pid`` from /proc."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "Threads"):
            out[key] = float(value.split()[0])
    out["fds"] = float(len(os.listdir(f"/proc/{pid}/fd")))
    return out


def fd_kinds(pid: int) -> dict[str, int]:
    """``pid``'s open fds by what they are (socket, pipe, anon_inode:[eventfd], a file's
    path): when fds grow, which kind does."""
    kinds: collections.Counter[str] = collections.Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        kinds[target.split(":[")[0] if ":[" in target and not target.startswith("anon")
              else target] += 1
    return dict(sorted(kinds.items()))


def descendants(pid: int) -> dict[int, bytes]:
    """Every live (not zombie) descendant of ``pid``: its command line."""
    parents: dict[int, int] = {}
    cmdlines: dict[int, bytes] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] == "Z":
            continue
        parents[int(entry)] = int(fields[1])
        cmdlines[int(entry)] = cmdline
    found: dict[int, bytes] = {}
    todo = [pid]
    while todo:
        current = todo.pop()
        for child, parent in parents.items():
            if parent == current:
                found[child] = cmdlines[child]
                todo.append(child)
    return found


def upstream_pids(daemon_pid: int) -> tuple[list[int], list[int]]:
    """(the upstream servers, their relays) running under the daemon."""
    servers: list[int] = []
    relays: list[int] = []
    for pid, cmdline in descendants(daemon_pid).items():
        args = cmdline.split(b"\0")
        if UPSTREAM_MODULE.encode() not in args:
            continue
        (relays if any(a.endswith(b"_relay.py") for a in args) else servers).append(pid)
    return servers, relays


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def api(sock: str, method: str, path: str, body: Any = None,
        timeout_s: float = 60.0) -> tuple[int | None, Any]:
    """One request to the daemon: (status, decoded body), or (None, the error) when it
    cannot be reached."""
    from capd.sidecar._errors import DaemonUnreachable
    from capd.sidecar.client._client import request

    try:
        answer = request(Path(sock), method, path, body=body, timeout_s=timeout_s)
    except DaemonUnreachable as exc:
        return None, str(exc)
    return answer.status, answer.body


# ---------------------------------------------------------------------------- the operator

@dataclass
class Restart:
    """One SIGKILL of the upstream server and what followed."""

    at_s: float
    killed: list[int]
    relays: list[int]
    new_server: int | None = None
    healed_after_s: float | None = None
    answered: bool = False
    reaped: bool = False


class Operator:
    """Reloads, rechecks, purges and upstream restarts on their schedules, in a thread
    (each request bounded by its timeout); counts what it did per window."""

    HEAL_TIMEOUT_S = 60.0

    def __init__(self, sock: str, daemon_pid: int, args: argparse.Namespace,
                 start: float, end: float) -> None:
        self.sock, self.daemon_pid, self.args = sock, daemon_pid, args
        self.start, self.end = start, end
        self.restarts: list[Restart] = []
        self.failures: list[str] = []
        self._counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="operator", daemon=True)

    def start_thread(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the schedule; return once the thread has ended (a heal in progress gets
        its bounded time first)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.HEAL_TIMEOUT_S + 70)

    def take(self) -> dict[str, int]:
        """What was done since the last call."""
        with self._lock:
            counts, self._counts = self._counts, collections.Counter()
        return dict(counts)

    def _count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self._counts[what] += n

    def _fail(self, what: str) -> None:
        self._count("failures")
        if len(self.failures) < 50:
            self.failures.append(f"{time.monotonic() - self.start:.1f}s {what}")

    def _run(self) -> None:
        try:
            self._schedule()
        except Exception as exc:  # a broken schedule is a failure of the run, never silent
            self._fail(f"operator thread: {exc!r}")

    def _schedule(self) -> None:
        a = self.args
        run_s = self.end - self.start
        due = {"reload": a.reload_s, "recheck": a.recheck_s, "purge": a.purge_s,
               "restart": min(a.restart_s, run_s / 2)}
        turn = 0
        healing: Restart | None = None
        while not self._stop.wait(0.25):
            now = time.monotonic() - self.start
            if now >= run_s:
                break
            if healing is not None and self._heal(healing, now):
                healing = None
            if now >= due["reload"]:
                due["reload"] += a.reload_s
                self._reload()
            if now >= due["recheck"]:
                due["recheck"] += a.recheck_s
                turn += 1
                self._recheck(turn)
            if now >= due["purge"]:
                due["purge"] += a.purge_s
                self._purge()
            if now >= due["restart"] and healing is None:
                due["restart"] += a.restart_s
                healing = self._kill_upstream(now)
        if healing is not None:  # the run ended while healing: give it its bounded time
            while not self._heal(healing, time.monotonic() - self.start):
                time.sleep(0.25)

    def _reload(self) -> None:
        status, body = api(self.sock, "POST", "/reload")
        self._count("reloads")
        if status != 200:
            self._fail(f"reload {status}: {body}")

    def _recheck(self, turn: int) -> None:
        path = ("/recheck/time_mcp.get_current_time?force=true" if turn % 2
                else "/recheck-tool/time_mcp?force=true")
        status, body = api(self.sock, "POST", path)
        self._count("rechecks")
        if status != 200:
            self._fail(f"{path} {status}: {body}")

    def _purge(self) -> None:
        for state in ("dead", "done"):
            status, body = api(self.sock, "POST", f"/queue/purge?state={state}&older_than=0")
            if status == 200:
                self._count("purged", int(body["purged"]))
            else:
                self._fail(f"purge {state} {status}: {body}")

    def _kill_upstream(self, now: float) -> Restart | None:
        servers, relays = upstream_pids(self.daemon_pid)
        if not servers:
            self._fail("restart: no upstream server under the daemon")
            return None
        for pid in servers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._count("restarts")
        restart = Restart(at_s=round(now, 3), killed=servers, relays=relays)
        self.restarts.append(restart)
        return restart

    def _heal(self, restart: Restart, now: float) -> bool:
        """One step of waiting for the upstream to answer again; True once it has (or the
        wait timed out)."""
        waited = now - restart.at_s
        if not restart.answered:
            status, _ = api(self.sock, "POST", UPSTREAM_CALL, {"timezone": "UTC"}, timeout_s=10)
            if status == 200:
                servers, _ = upstream_pids(self.daemon_pid)
                fresh = [p for p in servers if p not in restart.killed]
                restart.new_server = fresh[0] if fresh else None
                restart.answered = restart.new_server is not None
                if restart.answered:
                    restart.healed_after_s = round(waited, 3)
        if restart.answered:
            restart.reaped = not any(alive(p) for p in restart.killed + restart.relays)
            if restart.reaped:
                return True
        if waited > self.HEAL_TIMEOUT_S:
            self._fail(f"restart at {restart.at_s}s: answered={restart.answered} "
                       f"reaped={restart.reaped} after {self.HEAL_TIMEOUT_S:g} s")
            return True
        return False


# ---------------------------------------------------------------------------- the run

def write_config(folder: Path) -> Path:
    """The soak pack, its declarations and capd.toml in ``folder``; returns the config."""
    (folder / "soak_pack.py").write_text(PACK)
    (folder / "caps.toml").write_text(CAPS)
    command = json.dumps([sys.executable, "-m", UPSTREAM_MODULE, "--local-timezone", "UTC"])
    config = folder / "capd.toml"
    config.write_text(CONFIG.format(command=command))
    return config


def start_daemon(folder: Path, config: Path, sock: str,
                 log_level: str) -> tuple[subprocess.Popen[bytes], DaemonLog]:
    """`capd serve` in its own process group, its log on a pipe we read; ready when this
    returns (exits if it did not become ready in 60 s)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "capd", "serve", "--config", str(config), "--socket", sock,
         "--log-level", log_level],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True)
    log = DaemonLog(proc.stdout)
    deadline = time.monotonic() + 60
    while not log.ready.wait(0.1):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = "\n".join(log.tail)
            stop(proc)
            raise SystemExit(f"capd did not become ready (exit {proc.poll()}):\n{tail}")
    return proc, log


def sample(sock: str, pid: int) -> dict[str, Any]:
    """The daemon's figures now: /proc and GET /status."""
    figures = proc_figures(pid)
    status, body = api(sock, "GET", "/status", timeout_s=30)
    if status != 200:
        raise SystemExit(f"GET /status answered {status}: {body}")
    tasks = body.get("tasks") or {}
    queue = (body.get("queue") or {}).get("by_state") or {}
    return {
        "rss_kib": figures["VmRSS"], "hwm_kib": figures["VmHWM"],
        "anon_kib": figures.get("RssAnon", 0.0), "threads": figures["Threads"],
        "fds": figures["fds"], "fd_kinds": fd_kinds(pid), "cpu_s": round(tree_cpu_s(pid), 2),
        # /status counts every task on the daemon's loop ("all") beside its own background ones
        "tasks": int(tasks.get("all", sum(int(v) for v in tasks.values()))),
        "tasks_detail": tasks,
        "loop_lag_ms": round(float(body.get("event_loop_lag_s") or 0.0) * 1e3, 3),
        "queue": {k: v for k, v in queue.items() if v},
        "reload_count": (body.get("reload") or {}).get("count"),
        "upstream_connected": ((body.get("upstreams") or {}).get("time_mcp") or {})
        .get("connected"),
        "children": len(descendants(pid)),
    }


def exchange(conn: Connection, message: Any, timeout_s: float = 30.0) -> Any:
    """Send ``message`` to a child process and return its answer (None if it has none)."""
    try:
        conn.send(message)
        return conn.recv() if conn.poll(timeout_s) else None
    except (OSError, EOFError):
        return None


def window_line(w: dict[str, Any]) -> str:
    h, c, o = w["health"], w["calls"], w["ops"]
    return (f"window {w['index']:3d} {w['end_s'] / 60:6.1f} min  RSS {w['rss_kib'] / 1024:7.1f} MiB"
            f" (peak {w['hwm_kib'] / 1024:6.1f})  fds {w['fds']:4.0f}  threads {w['threads']:3.0f}"
            f"  tasks {w['tasks']:3d}  health p50 {h['p50_ms']:5.2f} p99 {h['p99_ms']:6.2f} ms"
            f" (n {h['n']})  calls {c['done']} (p99 {c['p99_ms']:.2f} ms, errors {c['errors']},"
            f" missed {c['missed']})  reloads {o.get('reloads', 0)} rechecks"
            f" {o.get('rechecks', 0)} purged {o.get('purged', 0)} restarts {o.get('restarts', 0)}"
            f"  queue {w['queue'] or '{}'}  lag {w['loop_lag_ms']:.1f} ms")


def summarize(windows: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Slopes after the warm-up, and first-vs-last /health p99."""
    used = windows[warmup:] if len(windows) - warmup >= 2 else windows
    xs = [w["end_s"] / 60 for w in used]

    def slope(key: str) -> float | None:
        value = slope_per_min(xs, [float(w[key]) for w in used])
        return None if value is None else round(value, 3)

    return {
        "windows_used": [w["index"] for w in used],
        "rss_kib_per_min": slope("rss_kib"),
        "anon_kib_per_min": slope("anon_kib"),
        "fds_per_min": slope("fds"),
        "tasks_per_min": slope("tasks"),
        "threads_per_min": slope("threads"),
        "rss_kib_first_used": used[0]["rss_kib"] if used else None,
        "rss_kib_last": windows[-1]["rss_kib"] if windows else None,
    }


def markdown(windows: list[dict[str, Any]], result: dict[str, Any]) -> str:
    rows = ["| window | end (min) | RSS MiB | peak MiB | fds | threads | tasks "
            "| /health p50 ms | /health p99 ms | calls | errors | missed | restarts |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for w in windows:
        h, c = w["health"], w["calls"]
        rows.append(f"| {w['index']} | {w['end_s'] / 60:.1f} | {w['rss_kib'] / 1024:.1f} "
                    f"| {w['hwm_kib'] / 1024:.1f} | {w['fds']:.0f} | {w['threads']:.0f} "
                    f"| {w['tasks']} | {h['p50_ms']:.2f} | {h['p99_ms']:.2f} | {c['done']} "
                    f"| {c['errors']} | {c['missed']} | {w['ops'].get('restarts', 0)} |")
    s = result["slopes"]

    def fmt(value: float | None, unit: str) -> str:
        return "n/a" if value is None else f"{value:+.2f} {unit}"

    rows.append("")
    rows.append(f"After {result['args']['warmup_windows']} warm-up window(s) (windows "
                f"{s['windows_used'][0]}-{s['windows_used'][-1]}): RSS "
                f"{fmt(s['rss_kib_per_min'], 'KiB/min')}, fds {fmt(s['fds_per_min'], '/min')}, "
                f"tasks {fmt(s['tasks_per_min'], '/min')}, threads "
                f"{fmt(s['threads_per_min'], '/min')}; /health p99 first window "
                f"{result['health_p99_ms']['first']:.2f} ms, last "
                f"{result['health_p99_ms']['last']:.2f} ms; upstream restarts "
                f"{len(result['restarts'])}, healed {result['restarts_healed']}.")
    return "\n".join(rows)


def soak(args: argparse.Namespace) -> int:
    """Run the soak; write the result; return the exit status (1 when something broke:
    the daemon died, an upstream did not heal, or calls failed)."""
    run_s = args.minutes * 60
    n_windows = max(1, math.ceil(run_s / args.window_s))
    folder = Path(tempfile.mkdtemp(prefix="capd-soak-", dir="/tmp"))
    sock = str(folder / "capd.sock")
    ctx = multiprocessing.get_context("spawn")
    children: list[tuple[BaseProcess, Connection]] = []
    proc: subprocess.Popen[bytes] | None = None
    log: DaemonLog | None = None
    operator: Operator | None = None
    windows: list[dict[str, Any]] = []
    try:
        proc, log = start_daemon(folder, write_config(folder), sock, args.log_level)
        pid = proc.pid
        ready_at = sample(sock, pid)
        print(f"soak: daemon pid {pid} ready, RSS {ready_at['rss_kib'] / 1024:.1f} MiB, "
              f"fds {ready_at['fds']:.0f}; {n_windows} window(s) of {args.window_s:g} s, "
              f"{args.rate:g} calls/s over {args.clients} connection(s), /health "
              f"{args.health_hz:g}/s; folder {folder}", flush=True)
        for target, extra in ((run_load, (args.rate, args.clients, args.session_s)),
                              (run_prober, (args.health_hz,))):
            mine, theirs = ctx.Pipe()
            process = ctx.Process(target=target, args=(sock, *extra, theirs), daemon=True)
            process.start()
            theirs.close()
            children.append((process, mine))
        for child, conn in children:
            if not conn.poll(120) or conn.recv() != "ready":
                raise SystemExit(f"{child.name} did not start")
        start_wall = time.time() + 0.2
        end_wall = start_wall + n_windows * args.window_s
        for _, conn in children:
            conn.send(("go", start_wall, end_wall))
        start = time.monotonic() + 0.2
        operator = Operator(sock, pid, args, start, start + n_windows * args.window_s)
        operator.start_thread()
        lines_before = log.lines
        for index in range(n_windows):
            boundary = start + (index + 1) * args.window_s
            while (left := boundary - time.monotonic()) > 0:
                time.sleep(min(left, 1.0))
                if proc.poll() is not None:
                    raise SystemExit(f"the daemon exited ({proc.returncode}):\n"
                                     + "\n".join(log.tail))
            figures = sample(sock, pid)
            calls = exchange(children[0][1], "report")
            health = exchange(children[1][1], "report")
            if calls is None or health is None:
                raise SystemExit("the load or the prober stopped answering")
            window = {"index": index, "end_s": round(time.monotonic() - start, 3), **figures,
                      "health": health, "calls": calls, "ops": operator.take(),
                      "log_lines": log.lines - lines_before}
            lines_before = log.lines
            windows.append(window)
            print(window_line(window), flush=True)
        operator.stop()
        for _, conn in children:
            with contextlib.suppress(OSError):
                conn.send("stop")
        restarts = [asdict(r) for r in operator.restarts]
        healed = sum(1 for r in operator.restarts if r.answered and r.reaped)
        result = {
            "args": vars(args), "machine": machine(), "daemon_pid": pid,
            "ready": {k: ready_at[k] for k in ("rss_kib", "fds", "threads", "tasks")},
            "windows": windows,
            "slopes": summarize(windows, args.warmup_windows),
            "health_p99_ms": {"first": windows[0]["health"]["p99_ms"],
                              "last": windows[-1]["health"]["p99_ms"]},
            "calls_done": sum(w["calls"]["done"] for w in windows),
            "call_errors": sum(w["calls"]["errors"] for w in windows),
            "restarts": restarts, "restarts_healed": healed,
            "upstream_answered_after_restart": bool(restarts) and all(
                r.answered for r in operator.restarts),
            "operator_failures": operator.failures,
            "daemon_events": dict(log.events.most_common()),
            "daemon_errors": log.errors,
        }
        Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
        print()
        print(markdown(windows, result))
        print(f"\nresult: {args.out}")
        broken = (result["call_errors"] or operator.failures or log.errors
                  or healed < len(operator.restarts))
        if broken:
            print(f"soak: something broke: call errors {result['call_errors']}, operator "
                  f"failures {operator.failures[:5]}, daemon errors {log.errors[:3]}")
        return 1 if broken else 0
    finally:
        if operator is not None:
            operator.stop()
        for child, conn in children:
            with contextlib.suppress(OSError):
                conn.send("stop")
            child.join(10)
            if child.is_alive():
                child.kill()
                child.join(5)
        if proc is not None:
            stop(proc)
        if log is not None:
            log.join(10)
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=120.0)
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--warmup-windows", type=int, default=2)
    parser.add_argument("--rate", type=float, default=500.0, help="calls/s, paced")
    parser.add_argument("--clients", type=int, default=8, help="keep-alive connections")
    parser.add_argument("--health-hz", type=float, default=20.0)
    parser.add_argument("--reload-s", type=float, default=30.0)
    parser.add_argument("--recheck-s", type=float, default=10.0)
    parser.add_argument("--purge-s", type=float, default=10.0)
    parser.add_argument("--restart-s", type=float, default=180.0)
    parser.add_argument("--session-s", type=float, default=60.0,
                        help="how long a client keeps its Capd-Session (0: for the whole run)")
    parser.add_argument("--log-level", default="info", choices=("info", "warning"))
    parser.add_argument("--out", default=str(_HERE / "soak-result.json"))
    args = parser.parse_args()
    if args.minutes <= 0 or args.window_s <= 0 or args.rate <= 0 or args.clients < 1:
        parser.error("--minutes, --window-s and --rate must be positive, --clients at least 1")

    def terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # so that the finally clauses end the daemon

    signal.signal(signal.SIGTERM, terminate)
    sys.exit(soak(args))


if __name__ == "__main__":
    main()
