"""/health latency while an upstream MCP server answers 20 MiB, and the daemon's memory.

Starts the real daemon with one stdio MCP server (the SDK's ``MCPServer``) whose tool
answers ``n`` bytes of text, and, with ``--before PATH``, a daemon of an older checkout
beside it on the same server script. For each daemon, in interleaved rounds: one call
of the tool for 20 MiB from a thread, and ``GET /health`` back to back (a fresh
connection each, as a supervisor's check) until the call answers. Prints per daemon the
/health p50/p99/max over all rounds, what the call answered and how long it took, and
the daemon's peak RSS (its ``VmHWM``).

    python bench/mcp_large.py [--rounds 3] [--mib 20] [--before PATH] [--results FILE]
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse
import shutil
import statistics
import tempfile
import textwrap
import threading
import time

from bench._harness import Results, stop
from bench._servers import Server, start_capd
from capd.sidecar.client._client import request

SERVER = textwrap.dedent('''
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("big")


    @server.tool()
    def big(n: int) -> str:
        """Answer n bytes of text."""
        return "a" * n


    server.run("stdio")
''')

PACK = "from capd.registry import op  # no ops: the upstream's tool is the capability\n"


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one_round(server: Server, size: int) -> tuple[list[float], float, str]:
    """/health latencies (ms) while one call for ``size`` bytes runs; its time and answer."""
    sock = Path(server.sock)
    answered: dict[str, object] = {}

    def call() -> None:
        started = time.perf_counter()
        response = request(sock, "POST", "/call/big_mcp.big", body={"n": size})
        answered["seconds"] = time.perf_counter() - started
        body = response.body if isinstance(response.body, dict) else {}
        answered["what"] = f"{response.status} {body.get('error_type') or body.get('status')}"

    thread = threading.Thread(target=call)
    thread.start()
    latencies = []
    while thread.is_alive():
        started = time.perf_counter()
        request(sock, "GET", "/health")
        latencies.append((time.perf_counter() - started) * 1e3)
    thread.join()
    return latencies, float(answered["seconds"]), str(answered["what"])  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=20)
    parser.add_argument("--before", type=Path, default=None)
    parser.add_argument("--results", type=Path, default=None)
    args = parser.parse_args()
    results = Results(args.results)
    tmp = Path(tempfile.mkdtemp(prefix="capd-bench-", dir="/tmp"))
    (tmp / "big.py").write_text(SERVER)
    config = textwrap.dedent(f"""
        plugins = []
        entry_points = false
        probe_live_interval_s = 3600

        [tools.big_mcp]
        kind = "mcp"
        command = ["{sys.executable}", "{tmp / 'big.py'}"]
        timeout_s = 60
        call_timeout_s = 120
    """)
    daemons: dict[str, Server] = {}
    try:
        daemons["capd"] = start_capd(tmp / "now", pack=PACK, caps="", config=config)
        if args.before is not None:
            daemons["capd before"] = start_capd(tmp / "before", pack=PACK, caps="",
                                                config=config, root=args.before)
        size = args.mib << 20
        seen: dict[str, list[float]] = {name: [] for name in daemons}
        calls: dict[str, list[float]] = {name: [] for name in daemons}
        answers: dict[str, str] = {}
        for round_no in range(args.rounds):
            for name, server in daemons.items():
                # a byte more each round: the same call again and again is a loop to capd
                latencies, seconds, what = one_round(server, size + round_no)
                seen[name] += latencies
                calls[name].append(seconds)
                answers[name] = what
        print(f"/health while an upstream answers {args.mib} MiB, {args.rounds} rounds")
        print(f"{'daemon':<14}{'n':>7}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
              f"{'call s':>9}{'peak RSS MiB':>14}  answer")
        for name, server in daemons.items():
            values = sorted(seen[name])
            p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
            rss = peak_rss_mib(server.proc.pid)
            print(f"{name:<14}{len(values):>7}{statistics.median(values):>9.2f}{p99:>9.2f}"
                  f"{values[-1]:>9.2f}{statistics.median(calls[name]):>9.2f}{rss:>14.0f}  "
                  f"{answers[name]}")
            results.add("mcp", f"/health p99 while an upstream answers {args.mib} MiB, {name}",
                        [p99], "ms", note=f"answer {answers[name]}, peak RSS {rss:.0f} MiB")
    finally:
        for server in daemons.values():
            stop(server.proc)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
