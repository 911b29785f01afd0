"""The HTTP front door under half-sent connections: does a token holder still get in?

Starts the real daemon (`capd serve`) on the e2e pack with `[mcp.http]` on 127.0.0.1,
makes a token, then opens ``--half-sent`` TCP connections (1,100 by default) that each
send half a request head and hold it, as a local user without a token would. Meanwhile
a token holder sends ``--requests`` MCP `initialize` requests, one at a time, each on a
fresh connection; the bench records each answer's status and latency. Then it waits
for the half-sent connections to be closed by the daemon and records when each one
closed (the head timeout is the daemon's default, 10 s, unless ``--head-timeout-s``).

Prints: the token holder's answers (all 200?), their latency p50/p99/max; how many
half-sent connections were closed and by when (p50/max seconds after they were
opened); and whether the Unix socket answered `/health` throughout.

    python bench/door_abuse.py [--half-sent 1100] [--requests 50] [--head-timeout-s 10]
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/queue.py would shadow the standard library's `queue`: keep this folder off
# sys.path, and put the repository on it.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse
import json
import select
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from tests.helpers.daemon import DaemonProcess, write_e2e_config

INITIALIZE = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "bench", "version": "1"}}}).encode()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def token_request(port: int, token: str) -> tuple[int, float]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/mcp", data=INITIALIZE, method="POST", headers={
            "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {token}"})
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            answer.read()
            status = answer.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError:
        status = 0
    return status, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--half-sent", type=int, default=1100)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--head-timeout-s", type=float, default=None)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="capd-door-", dir="/tmp"))
    port = free_port()
    config = write_e2e_config(folder, free_port())
    extra = ('\n[profiles.reader]\ncapabilities = ["e2e.echo"]\n\n'
             f'[mcp.http]\nlisten = "127.0.0.1:{port}"\n')
    if args.head_timeout_s is not None:
        extra += f"head_timeout_s = {args.head_timeout_s}\n"
    config.write_text(config.read_text() + extra)
    daemon = DaemonProcess(config, folder / "capd.sock").start().wait_ready()
    try:
        made = subprocess.run([sys.executable, "-m", "capd", "token", "create", "--profile",
                               "reader", "--json", "--socket", str(daemon.socket)],
                              capture_output=True, text=True, timeout=60, check=True)
        token = json.loads(made.stdout)["token"]
        held: list[tuple[socket.socket, float]] = []
        for _ in range(args.half_sent):
            conn = socket.create_connection(("127.0.0.1", port), timeout=5)
            conn.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: applic")
            conn.setblocking(False)
            held.append((conn, time.monotonic()))
        answers = [token_request(port, token) for _ in range(args.requests)]
        health_ok = daemon.call("GET", "/health").status == 200
        closed_after: list[float] = []
        open_ = {conn.fileno(): (conn, at) for conn, at in held}
        poller = select.poll()  # select() cannot take descriptors past 1023
        for fd in open_:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        deadline = time.monotonic() + 60
        while open_ and time.monotonic() < deadline:
            ready = [fd for fd, _ in poller.poll(1000)]
            for fd in ready:
                conn, at = open_.pop(fd)
                try:
                    gone = conn.recv(1) == b""
                except BlockingIOError:
                    open_[fd] = (conn, at)
                    continue
                except OSError:
                    gone = True
                if gone:
                    closed_after.append(time.monotonic() - at)
                    poller.unregister(fd)
                else:
                    open_[fd] = (conn, at)
        for conn, _ in held:
            conn.close()
        latencies = sorted(s for _, s in answers)
        statuses = [status for status, _ in answers]
        print(f"token holder: {statuses.count(200)}/{len(statuses)} answered 200; latency "
              f"p50 {statistics.median(latencies) * 1000:.1f} ms, "
              f"p99 {latencies[int(0.99 * (len(latencies) - 1))] * 1000:.1f} ms, "
              f"max {latencies[-1] * 1000:.1f} ms")
        closed = sorted(closed_after)
        if closed:
            print(f"half-sent: {len(closed)}/{len(held)} closed by the daemon; after p50 "
                  f"{statistics.median(closed):.1f} s, max {closed[-1]:.1f} s")
        else:
            print(f"half-sent: 0/{len(held)} closed within 60 s")
        print(f"unix socket /health during the run: {'200' if health_ok else 'FAILED'}")
    finally:
        daemon.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
