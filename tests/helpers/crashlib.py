"""Crash rounds against the real daemon: kill -9 at each point, then check nothing is lost.

Shared by ``tests/recovery/test_crash.py`` (50 kills in CI) and ``bench/crash.py`` (more).
The test plugin's ops read a mode file and kill their own process with SIGKILL
at the chosen point: after the claim (before the side effect), after the side
effect (before completion), or during verification. The fourth point, right
after an enqueue is acknowledged, is a SIGKILL sent from outside.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import textwrap
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .daemon import DaemonProcess

PACK = '''
import os
import signal
from pathlib import Path

from pydantic import BaseModel
from capd.registry import PermanentToolError, TransientToolError, op


class Token(BaseModel):
    token: str


def _mode() -> str:
    return Path(os.environ["CRASH_MODE"]).read_text().strip()


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@op("crash.write")
def write(params: Token) -> str:
    mode = _mode()
    if mode == "transient":
        raise TransientToolError("not yet")
    if mode == "permanent":
        raise PermanentToolError("refused for good")
    if mode == "kill_before":
        _die()
    with open(os.environ["CRASH_OUT"], "a") as out:
        out.write(params.token + "\\n")
        out.flush()
        os.fsync(out.fileno())
    if mode == "kill_after":
        _die()
    return "written"


@op("crash.verify")
def verify(params: Token) -> bool:
    if _mode() == "kill_verify":
        _die()
    out = Path(os.environ["CRASH_OUT"])
    return out.exists() and params.token in out.read_text().split()
'''

CAPS = '''
[[capability]]
name = "crash.vf"
op = "crash.write"
summary = "Write a token, verified first."
mutates_state = true
retry_policy = "verify_first"
timeout_s = 1
[[capability.effects]]
kind = "op"
op = "crash.verify"

[[capability]]
name = "crash.rp"
op = "crash.write"
summary = "Write a token, replayed."
mutates_state = true
retry_policy = "replay"
timeout_s = 1
'''

CONFIG = '''
plugins = ["crash_pack"]
plugin_paths = ["."]
declarations = ["caps.toml"]
entry_points = false
state_dir = "state"
retry_base_s = 0.05
retry_cap_s = 0.2
retry_max_attempts = 100000
verify_grace_s = 0
lease_grace_s = 1
probe_live_interval_s = 3600
drain_grace_s = 1
'''

POINTS = ("after_ack", "kill_before", "kill_after", "kill_verify")


@dataclass
class CrashReport:
    """What a crash run found."""

    kills: Counter[str] = field(default_factory=Counter)
    acked: dict[str, str] = field(default_factory=dict)  # token -> capability
    lost: list[str] = field(default_factory=list)
    duplicates_verify_first: int = 0
    duplicates_replay: int = 0
    integrity_failures: int = 0
    seconds: float = 0.0

    @property
    def total_kills(self) -> int:
        return sum(self.kills.values())


class CrashRun:
    """A folder with the crash pack, and the daemon restarted round after round."""

    def __init__(self, folder: Path, *, sweep_batch: int | None = None,
                 queue_url: str | None = None) -> None:
        """``sweep_batch`` 1 keeps one replayed job in flight at a time (capd's default
        replays up to 32 at once, so one kill may land amid several writes);
        ``queue_url`` puts the queue in PostgreSQL instead of the SQLite file."""
        self.folder = folder
        self.queue_url = queue_url
        (folder / "crash_pack.py").write_text(PACK)
        (folder / "caps.toml").write_text(CAPS)
        (folder / "capd.toml").write_text(textwrap.dedent(CONFIG) + (
            f"sweep_batch = {sweep_batch}\n" if sweep_batch is not None else "") + (
            f'queue_url = "{queue_url}"\n' if queue_url else ""))
        self.mode = folder / "mode"
        self.out = folder / "out.txt"
        self.out.touch()
        self.socket = folder / "capd.sock"
        self.db = folder / "state" / "queue.db"
        self.env = {"CRASH_MODE": str(self.mode), "CRASH_OUT": str(self.out)}
        self.report = CrashReport()
        self.daemon: DaemonProcess | None = None

    def start(self, mode: str) -> DaemonProcess:
        self.mode.write_text(mode)
        self.daemon = DaemonProcess(self.folder / "capd.toml", self.socket, env=self.env)
        return self.daemon.start().wait_ready()

    def submit(self, daemon: DaemonProcess, per_capability: int) -> None:
        for capability in ("crash.vf", "crash.rp"):
            for _ in range(per_capability):
                token = uuid.uuid4().hex
                try:
                    reply = daemon.call("POST", f"/call/{capability}", {"token": token})
                except Exception:
                    return  # the daemon died under us: this call was never acknowledged
                if reply.status == 202 and reply.body.get("queued"):
                    self.report.acked[token] = capability

    def check_integrity(self) -> None:
        if self.queue_url:  # PostgreSQL's own recovery: every job row reads back
            self._job_states()
            return
        with sqlite3.connect(self.db) as raw:
            if raw.execute("PRAGMA integrity_check").fetchone()[0] != "ok":
                self.report.integrity_failures += 1

    def _job_states(self) -> dict[str, str]:
        """Each job's token and state, read from the queue's storage."""
        if self.queue_url:
            import psycopg

            with psycopg.connect(self.queue_url) as conn:
                rows = conn.execute("SELECT params::json->>'token', state FROM capd_jobs")
                return dict(rows.fetchall())
        with sqlite3.connect(self.db) as raw:
            return dict(raw.execute(
                "SELECT json_extract(params, '$.token'), state FROM jobs").fetchall())

    def round(self, point: str, per_capability: int = 2, timeout_s: float = 30.0) -> None:
        daemon = self.start("transient")
        self.submit(daemon, per_capability)
        if point == "after_ack":
            daemon.signal(signal.SIGKILL)
        else:
            self.mode.write_text(point)
        code = daemon.wait_exit(timeout_s)
        assert code == -signal.SIGKILL, f"round {point}: daemon exited {code}, not killed"
        self.report.kills[point] += 1
        self.check_integrity()

    def drain(self, timeout_s: float = 120.0) -> None:
        daemon = self.start("ok")
        deadline = time.monotonic() + timeout_s
        while True:
            stats = daemon.call("GET", "/queue/stats").body["by_state"]
            if stats["pending"] == 0 and stats["leased"] == 0:
                break
            assert time.monotonic() < deadline, f"queue did not drain: {stats}"
            time.sleep(0.1)
        assert daemon.stop() == 0
        self.check_integrity()

    def tally(self) -> CrashReport:
        written = Counter(self.out.read_text().split())
        states = self._job_states()
        for token, capability in self.report.acked.items():
            if written[token] == 0 or states.get(token) != "done":
                self.report.lost.append(token)
            extra = max(0, written[token] - 1)
            if capability == "crash.vf":
                self.report.duplicates_verify_first += extra
            else:
                self.report.duplicates_replay += extra
        return self.report

    def run(self, kills: int, per_capability: int = 2) -> CrashReport:
        started = time.monotonic()
        try:
            for index in range(kills):
                self.round(POINTS[index % len(POINTS)], per_capability)
            self.drain()
        finally:
            if self.daemon is not None:
                self.daemon.kill()
        self.report.seconds = time.monotonic() - started
        return self.tally()


def summary(report: CrashReport) -> str:
    """One JSON line for logs and the bench."""
    return json.dumps({
        "kills": report.total_kills, "by_point": dict(report.kills),
        "acknowledged_jobs": len(report.acked), "lost": len(report.lost),
        "duplicates_verify_first": report.duplicates_verify_first,
        "duplicates_replay": report.duplicates_replay,
        "integrity_failures": report.integrity_failures, "seconds": round(report.seconds, 1)})
