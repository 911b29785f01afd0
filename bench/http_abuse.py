"""What abusive clients cost the daemon: memory under pipelining, descriptors under trickling.

Starts the real daemon (`capd serve`) on the e2e pack, a fresh one per scenario so
each peak (VmHWM) is that scenario's own, and drives it over its Unix socket:

(a) one client pipelines 20,000 `GET /health` and never reads its answers, for
    10 s; then it reads, and every answer it is owed must come, in order;
(b) 100 connections each pipeline 16 `POST /call/e2e.echo` with a body just under
    1 MiB (the default max_body_bytes) and read nothing for 10 s; then they read
    (sending what the daemon did not take meanwhile) and every answer must come;
(c) 1,100 connections trickle a request line one byte a second (reconnecting when
    the daemon closes them, as an attacker would) while 110 fresh clients each
    do `GET /health` with 5 s to get an answer.

Prints the daemon's resident memory when ready and its peak (from
/proc/PID/status), and what the clients got. The daemon runs with the HTTP limits
of its config (the defaults unless --max-connections is given).

    python bench/http_abuse.py [--root PATH] [--max-connections N] [--daemon-nofile N]
                               [--scenarios abc]

--root runs the daemon from another checkout (e.g. an export of an older commit,
for a before/after table). --daemon-nofile runs the daemon under that descriptor
limit (soft and hard), as on a host with a low one.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/queue.py would shadow the standard library's `queue` (which aiosqlite
# imports): keep this folder off sys.path, and put the repository on it.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvloop

from tests.helpers.daemon import E2E_PACK

CAPS = textwrap.dedent('''
    [[capability]]
    name = "e2e.echo"
    op = "e2e.echo"
    summary = "Echo text and the plugin version."
    requires = ["gate"]
''')

CONFIG = textwrap.dedent('''
    plugins = ["e2e_pack"]
    plugin_paths = ["."]
    declarations = ["caps.toml"]
    entry_points = false
    state_dir = "state"
    probe_live_interval_s = 3600
    call_rate_per_s = 0          # measure the HTTP layer, not the rate limiter
    {extra}
    [tools.gate]
    kind = "python"
    target = "e2e_pack:gate_probe"
    timeout_s = 10
''')

MIB = 1024 * 1024


@dataclass
class Outcome:
    """One scenario's figures."""

    name: str
    ready_mib: float = 0.0
    peak_mib: float = 0.0
    result: str = ""
    notes: list[str] = field(default_factory=list)


# -- the daemon -------------------------------------------------------------------------


class Daemon:
    """`capd serve` in a subprocess, its log in a file (a pipe would steal the client's CPU)."""

    def __init__(self, folder: Path, root: Path, nofile: int | None) -> None:
        self.folder = folder
        self.socket = folder / "capd.sock"
        self.log_path = folder / "capd.log"
        self._log = self.log_path.open("wb")
        env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "capd", "serve", "--config", str(folder / "capd.toml"),
             "--socket", str(self.socket)],
            stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=folder,
            preexec_fn=None if nofile is None else (
                lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))))

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while b'"event":"ready"' not in self.log_path.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"capd did not become ready; log: "
                                 f"{self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)

    def memory_mib(self, field_name: str) -> float:
        """VmRSS (now) or VmHWM (peak) of the daemon, in MiB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024
        raise SystemExit(f"no {field_name} in /proc/{self.proc.pid}/status")

    def events(self, name: str) -> list[dict[str, object]]:
        out = []
        for line in self.log_path.read_bytes().splitlines():
            if f'"event":"{name}"'.encode() in line:
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


@contextlib.contextmanager
def running_daemon(root: Path, extra_config: str, nofile: int | None) -> Iterator[Daemon]:
    folder = Path(tempfile.mkdtemp(prefix="capd-abuse-", dir="/tmp"))
    (folder / "e2e_pack.py").write_text(E2E_PACK)
    (folder / "caps.toml").write_text(CAPS)
    (folder / "capd.toml").write_text(CONFIG.format(extra=extra_config))
    daemon = Daemon(folder, root, nofile)
    try:
        daemon.wait_ready()
        yield daemon
    finally:
        daemon.stop()
        shutil.rmtree(folder, ignore_errors=True)


# -- reading answers ---------------------------------------------------------------------


class Answers:
    """Splits a byte stream into HTTP/1.1 responses (Content-Length framed)."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.statuses: list[int] = []
        self.bodies: list[bytes] = []

    def feed(self, data: bytes, keep_bodies: bool = False) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15:].split(b"\r\n")[0]) if at >= 0 else 0
            if len(self.buf) < end + 4 + length:
                return
            self.statuses.append(int(self.buf[9:12]))
            if keep_bodies:
                self.bodies.append(bytes(self.buf[end + 4:end + 4 + length]))
            del self.buf[:end + 4 + length]


async def read_answers(reader: asyncio.StreamReader, count: int, timeout_s: float,
                       keep_bodies: bool = False) -> Answers:
    """Up to ``count`` answers, for at most ``timeout_s``; fewer if the daemon closes."""
    answers = Answers()
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(timeout_s):
            while len(answers.statuses) < count:
                chunk = await reader.read(1 << 20)
                if not chunk:
                    break
                answers.feed(chunk, keep_bodies)
    return answers


# -- (a) pipelining, never reading ---------------------------------------------------------


async def pipelined_never_read(daemon: Daemon, requests: int, seconds: float) -> str:
    """Pipeline ``requests`` and read nothing for ``seconds``; then read what is owed."""
    reader, writer = await asyncio.open_unix_connection(str(daemon.socket))
    writer.write(b"GET /health HTTP/1.1\r\nHost: capd\r\n\r\n" * requests)
    await asyncio.sleep(seconds)  # the scenario: the client does nothing for this long
    unsent_kib = writer.transport.get_write_buffer_size() / 1024
    answers = await read_answers(reader, requests, timeout_s=60)
    writer.close()
    statuses = Counter(answers.statuses)
    return (f"{len(answers.statuses)}/{requests} answered once it read ({dict(statuses)})"
            + (f"; after {seconds:g} s, {unsent_kib:.0f} KiB of requests were still unsent "
            "(the daemon had stopped reading)" if unsent_kib else ""))


# -- (b) many large bodies -----------------------------------------------------------------


async def pipelined_bodies(daemon: Daemon, connections: int, per_connection: int,
                           body_bytes: int, hold_s: float) -> str:
    """Each connection pipelines its requests and reads nothing for ``hold_s``, then reads
    while it sends the rest (what it could not send: the daemon stopped reading)."""
    text = "x" * (body_bytes - 64)
    body = json.dumps({"text": text}).encode()
    request = (b"POST /call/e2e.echo HTTP/1.1\r\nHost: capd\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body)) + body

    async def client() -> tuple[int, Answers]:
        reader, writer = await asyncio.open_unix_connection(str(daemon.socket))
        sent = 0
        while sent < per_connection and time.monotonic() < reading_from:
            writer.write(request)  # one at a time, so the client holds one at most
            sent += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(writer.drain(), max(0.0, reading_from - time.monotonic()))
        sent_unread = sent
        await asyncio.sleep(max(0.0, reading_from - time.monotonic()))
        # Now read while sending the rest, as a pipelining client must: one that reads
        # only after sending everything waits on the daemon, which waits on it.
        reading = asyncio.create_task(read_answers(reader, per_connection, timeout_s=120))
        while sent < per_connection:
            writer.write(request)
            sent += 1
            await writer.drain()
        answers = await reading
        writer.close()
        return sent_unread, answers

    started = time.monotonic()
    reading_from = started + hold_s
    async with asyncio.timeout(300):
        results = await asyncio.gather(*(client() for _ in range(connections)))
    elapsed = time.monotonic() - started
    statuses = Counter(s for _, r in results for s in r.statuses)
    unread = sum(n for n, _ in results)
    return (f"{unread} bodies sent in the first {hold_s:g} s (answers unread); "
            f"{sum(statuses.values())}/{connections * per_connection} answered "
            f"({dict(statuses)}) {elapsed:.1f} s after the start")


# -- (c) trickling connections --------------------------------------------------------------


async def trickling(daemon: Daemon, tricklers: int, fresh: int, seconds: float) -> str:
    """``tricklers`` connections send a request line a byte a second, reconnecting when
    closed; after 3 s, ``fresh`` clients each try one GET /health with 5 s to get it."""
    stop = asyncio.Event()
    closed_by_daemon = Counter[str]()

    async def trickle() -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_unix_connection(str(daemon.socket))
            except OSError:
                closed_by_daemon["connect_failed"] += 1
                await asyncio.sleep(1)
                continue
            got = asyncio.create_task(reader.read(4096))
            line = b"GET /" + b"a" * 100_000
            for byte in line:
                if stop.is_set() or got.done():
                    break
                writer.write(bytes([byte]))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(got), timeout=1.0)
            if got.done() and not got.cancelled():
                if got.exception() is not None:
                    closed_by_daemon["reset"] += 1
                else:
                    closed_by_daemon[got.result()[9:12].decode() or "closed"] += 1
            got.cancel()
            writer.close()

    async def health() -> float | None:
        started = time.monotonic()
        try:
            async with asyncio.timeout(5):
                reader, writer = await asyncio.open_unix_connection(str(daemon.socket))
                writer.write(b"GET /health HTTP/1.1\r\nHost: capd\r\nConnection: close\r\n\r\n")
                answer = await reader.read()
                writer.close()
        except (TimeoutError, OSError):
            return None
        return time.monotonic() - started if answer.startswith(b"HTTP/1.1 200") else None

    tasks = [asyncio.create_task(trickle()) for _ in range(tricklers)]
    await asyncio.sleep(3)
    served = [t for t in await asyncio.gather(*(health() for _ in range(fresh))) if t is not None]
    await asyncio.sleep(max(0.0, seconds - 3 - 5))
    stop.set()
    await asyncio.wait(tasks, timeout=10)
    for task in tasks:
        task.cancel()
    served.sort()
    latency = (f"p50 {served[len(served) // 2] * 1e3:.0f} ms, max {served[-1] * 1e3:.0f} ms"
               if served else "none served")
    return (f"{len(served)}/{fresh} fresh clients served ({latency}); trickling connections "
            f"ended by the daemon: {dict(closed_by_daemon)}")


# -- main -------------------------------------------------------------------------------------


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def run(name: str, args: argparse.Namespace, extra: str,
        scenario: Callable[[Daemon], Coroutine[Any, Any, str]]) -> Outcome:
    outcome = Outcome(name)
    with running_daemon(args.root, extra, args.daemon_nofile) as daemon:
        outcome.ready_mib = daemon.memory_mib("VmRSS")
        outcome.result = uvloop.run(scenario(daemon))
        outcome.peak_mib = daemon.memory_mib("VmHWM")
        for event in ("connection_evicted", "connection_refused", "slow_clients_closed"):
            if found := daemon.events(event):
                outcome.notes.append(f"{event} x{len(found)}")
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=_HERE.parent,
                        help="the checkout whose daemon runs (default: this one)")
    parser.add_argument("--max-connections", type=int, default=None)
    parser.add_argument("--daemon-nofile", type=int, default=None,
                        help="RLIMIT_NOFILE (soft and hard) the daemon runs under")
    parser.add_argument("--scenarios", default="abc")
    args = parser.parse_args()
    extra = "" if args.max_connections is None else f"max_connections = {args.max_connections}"
    fds = raise_fd_limit()
    print(f"http abuse bench: daemon from {args.root}, {os.cpu_count()} cores, "
          f"RLIMIT_NOFILE {fds} here, {args.daemon_nofile or 'inherited'} for the daemon, "
          f"{extra or 'default HTTP limits'}")
    scenarios = {
        "a": ("(a) 1 conn, 20,000 pipelined GET /health, unread 10 s",
              lambda d: pipelined_never_read(d, 20_000, 10.0)),
        "b": ("(b) 100 conns x 16 pipelined ~1 MiB POST, unread 10 s",
              lambda d: pipelined_bodies(d, 100, 16, MIB - 512, hold_s=10.0)),
        "c": ("(c) 1,100 trickling conns + 110 fresh GET /health",
              lambda d: trickling(d, 1100, 110, 16.0)),
    }
    outcomes = [run(name, args, extra, scenario)
                for key, (name, scenario) in scenarios.items() if key in args.scenarios]
    print(f"{'scenario':<56}{'ready MiB':>10}{'peak MiB':>10}{'growth':>8}")
    for o in outcomes:
        print(f"{o.name:<56}{o.ready_mib:>10.0f}{o.peak_mib:>10.0f}"
              f"{o.peak_mib - o.ready_mib:>8.0f}")
    for o in outcomes:
        print(f"{o.name}: {o.result}" + (f" [{', '.join(o.notes)}]" if o.notes else ""))


if __name__ == "__main__":
    main()
