"""/health latency while a reload runs a plain probe that blocks for 2 s.

Starts the real daemon (`capd serve`) with three tools: a plain (non-async)
python probe that sleeps 2 s, an HTTP tool on a server on 127.0.0.1 with a 1 s
timeout, and a path tool. Rounds alternate, in one run:

- idle: `GET /health` back to back for 2.5 s, nothing else happening;
- reload: `POST /reload` from a thread, `GET /health` back to back from here
  until the reload answers.

Each `/health` is a fresh connection over the Unix socket (what a supervisor's
check does). Prints p50/p99/max per mode over all rounds, and after each reload
how many capabilities were disabled (the HTTP tool is healthy all along, so
any is a probe that timed out because the loop was held).

    python bench/reload_health.py [--root PATH] [--rounds N]

--root runs the daemon from another checkout (an export of an older commit, for
a before/after table).
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
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from capd.sidecar.client._client import Response, request

PACK = textwrap.dedent('''
    import time

    from pydantic import BaseModel
    from capd.registry import op


    class Empty(BaseModel):
        pass


    def slow_probe() -> bool:
        time.sleep(2.0)
        return True


    @op("bench.local")
    async def local(params: Empty) -> str:
        return "ok"


    @op("bench.web")
    async def web(params: Empty) -> str:
        return "ok"


    @op("bench.files")
    async def files(params: Empty) -> str:
        return "ok"
''')

CAPS = textwrap.dedent('''
    [[capability]]
    name = "bench.local"
    op = "bench.local"
    summary = "Needs the slow probe."
    requires = ["slow"]

    [[capability]]
    name = "bench.web"
    op = "bench.web"
    summary = "Needs the web server."
    requires = ["web"]

    [[capability]]
    name = "bench.files"
    op = "bench.files"
    summary = "Needs a folder."
    requires = ["folder"]
''')

CONFIG = textwrap.dedent('''
    plugins = ["bench_pack"]
    plugin_paths = ["."]
    declarations = ["caps.toml"]
    entry_points = false
    state_dir = "state"
    probe_live_interval_s = 3600
    recheck_interval_s = 3600

    [tools.slow]
    kind = "python"
    target = "bench_pack:slow_probe"
    timeout_s = 5

    [tools.web]
    kind = "http"
    url = "http://127.0.0.1:{port}/health"
    timeout_s = 1

    [tools.folder]
    kind = "path"
    path = "{folder}"
    timeout_s = 1
''')


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return


def health_ms(socket_path: Path) -> float:
    started = time.perf_counter()
    answer = request(socket_path, "GET", "/health", timeout_s=10)
    elapsed = (time.perf_counter() - started) * 1000
    if answer.status not in (200, 503):
        raise SystemExit(f"/health answered {answer.status}: {answer.body}")
    return elapsed


def idle_round(socket_path: Path, seconds: float) -> list[float]:
    out: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        out.append(health_ms(socket_path))
    return out


def reload_round(socket_path: Path) -> tuple[list[float], float]:
    done: dict[str, Response] = {}
    started = time.perf_counter()
    thread = threading.Thread(
        target=lambda: done.update(r=request(socket_path, "POST", "/reload", timeout_s=60)))
    thread.start()
    out: list[float] = []
    while thread.is_alive():
        out.append(health_ms(socket_path))
    thread.join()
    took = time.perf_counter() - started
    if done["r"].status != 200:
        raise SystemExit(f"/reload answered {done['r'].status}: {done['r'].body}")
    return out, took


def disabled(socket_path: Path) -> list[str]:
    caps = request(socket_path, "GET", "/capabilities", timeout_s=10).body["capabilities"]
    return sorted(c["name"] for c in caps if c["state"] != "live")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=_HERE.parent,
                        help="checkout whose daemon to run (default: this one)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    folder = Path(tempfile.mkdtemp(prefix="capd-reload-", dir="/tmp"))
    (folder / "bench_pack.py").write_text(PACK)
    (folder / "caps.toml").write_text(CAPS)
    (folder / "capd.toml").write_text(
        CONFIG.format(port=server.server_address[1], folder=folder))
    log_path = folder / "capd.log"
    socket_path = folder / "capd.sock"
    env = {**os.environ, "PYTHONPATH": str(args.root), "PYTHONDONTWRITEBYTECODE": "1"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "capd", "serve", "--config", str(folder / "capd.toml"),
             "--socket", str(socket_path)], stdout=log, stderr=subprocess.STDOUT, env=env,
            cwd=folder)
        try:
            deadline = time.monotonic() + 60
            while b'"event":"ready"' not in log_path.read_bytes():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"capd did not start: {log_path.read_text()[-2000:]}")
                time.sleep(0.05)
            print(f"reload/health bench: daemon from {args.root}, {os.cpu_count()} cores, "
                  f"{args.rounds} rounds, idle and reload interleaved")
            idle: list[float] = []
            during: list[float] = []
            per_round: list[str] = []
            for n in range(args.rounds):
                idle += idle_round(socket_path, 2.5)
                samples, took = reload_round(socket_path)
                during += samples
                off = disabled(socket_path)
                per_round.append(f"  round {n + 1}: reload {took:.2f} s, {len(samples)} "
                                 f"/health answered, max {max(samples):.1f} ms, "
                                 f"disabled after: {off or 'none'}")
            print("\n".join(per_round))
            for name, values in (("idle", idle), ("during reload", during)):
                print(f"  /health {name:>13}: n={len(values):5d}  "
                      f"p50 {statistics.median(values):6.2f} ms  p99 {pct(values, 0.99):7.2f} ms"
                      f"  max {max(values):7.2f} ms")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            server.shutdown()
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
