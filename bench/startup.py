"""Start-up: from spawn to the first `GET /health` answered 200, capd against a bare uvicorn app.

In interleaved rounds, each pinned to the bench core (see _harness.py):

- capd: `python -m capd serve --config examples/capd.toml --socket …`, the bundled
  example pack (three tools, one of which is missing on purpose), its state
  folder made by an untimed first start, so each timed one is a restart;
- uvicorn: `python -m uvicorn` with a bare ASGI app that answers every path
  (httptools, uvloop), on a Unix socket;
- the interpreter alone (`python -c pass`), the floor under both.

The clock starts just before the spawn and stops at the first 200 (the socket
is tried every 2 ms). Prints the median and min-max over rounds.

    python bench/startup.py [--rounds 5] [--results FILE]
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
import subprocess
import tempfile
import time
from collections.abc import Callable

from bench._harness import REPO, SERVER_CPUS, Results, http_status, pin, spawn, spread, stop
from bench._servers import ASGI_APP


def time_to_health(argv: list[str], sock: Path, *, cwd: Path, env: dict[str, str],
                   log: Path, timeout_s: float = 60.0) -> float:
    """Seconds from spawning ``argv`` to its first 200 on ``GET /health``; then stop it."""
    sock.unlink(missing_ok=True)
    started = time.perf_counter()
    proc = spawn(argv, cwd=cwd, env=env, log=log)
    try:
        while True:
            if sock.exists() and http_status(str(sock), "/health", timeout_s=5) == 200:
                return time.perf_counter() - started
            if proc.poll() is not None or time.perf_counter() - started > timeout_s:
                raise SystemExit(f"{argv[2:4]} never answered /health with 200: "
                                 f"{log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.002)
    finally:
        stop(proc)


def time_interpreter() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True,
                   preexec_fn=(lambda: pin(SERVER_CPUS)) if SERVER_CPUS else None)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--results", type=Path, default=None)
    args = parser.parse_args()
    results = Results(args.results)
    tmp = Path(tempfile.mkdtemp(prefix="capd-startup-", dir="/tmp"))
    try:
        (tmp / "bench_asgi.py").write_text(ASGI_APP)
        capd_env = {**os.environ, "CAPD_STATE_DIR": str(tmp / "state")}
        capd_argv = [sys.executable, "-m", "capd", "serve", "--config",
                     str(REPO / "examples" / "capd.toml"), "--socket", str(tmp / "capd.sock")]
        uvicorn_argv = [sys.executable, "-m", "uvicorn", "bench_asgi:app", "--uds",
                        str(tmp / "uvicorn.sock"), "--http", "httptools", "--loop", "uvloop",
                        "--lifespan", "off", "--no-access-log", "--log-level", "warning"]
        subjects: dict[str, Callable[[], float]] = {
            "capd serve, examples/capd.toml": lambda: time_to_health(
                capd_argv, tmp / "capd.sock", cwd=REPO, env=capd_env, log=tmp / "capd.log"),
            "uvicorn + bare ASGI app": lambda: time_to_health(
                uvicorn_argv, tmp / "uvicorn.sock", cwd=tmp, env=dict(os.environ),
                log=tmp / "uvicorn.log"),
            "python -c pass, spawn to exit (interpreter floor)": time_interpreter,
        }
        for measure in subjects.values():  # untimed: capd's state folder, warm file caches
            measure()
        times: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for name, measure in subjects.items():
                times.setdefault(name, []).append(measure())
        print(f"start-up, spawn to first /health 200, {args.rounds} interleaved rounds "
              "(each pinned to the bench core)")
        uvicorn = times["uvicorn + bare ASGI app"]
        for name, got in times.items():
            median, lo, hi = spread(got)
            print(f"  {name:<50} {median * 1e3:>7.0f} ms ({lo * 1e3:.0f}-{hi * 1e3:.0f})")
        for name, got in times.items():
            what = "" if "spawn to exit" in name else ", spawn to first /health 200"
            results.add("start-up", f"{name}{what}",
                        [t * 1e3 for t in got], "ms",
                        against="" if name.startswith("uvicorn") else "uvicorn + bare ASGI app",
                        against_values=None if name.startswith("uvicorn")
                        else [t * 1e3 for t in uvicorn])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
