"""capd's `POST /call` beside the best Python HTTP stacks, all on a Unix socket, one generator.

Servers, each started once; each runs pinned to the bench core, the load generator
to another core of its own (see _harness.py):

- raw asyncio Protocol on uvloop: the ceiling (parses only the head's end and
  Content-Length, answers canned bytes); it also checks the generator: if the
  generator drives this server several times faster than the others, it is not
  what limits them;
- bare aiohttp (uvloop);
- uvicorn + a bare ASGI app (httptools, uvloop, no access log);
- granian + the same ASGI app (1 worker, 1 runtime thread, uvloop), if installed;
- capd's HTTP server alone (sidecar/server/_http.py with a handler answering the same
  fixed body): not a peer, but it tells the HTTP layer's cost from the call path's;
- capd `POST /call/bench.noop` (an `async def` op) and `POST /call/bench.noop_sync`
  (a plain `def` op, which capd runs on its executor), one daemon with the
  default config except the rate limiter, left on but set so high that it
  refuses nothing.

Every server gets the same request (`POST /call/...` with a `{}` body) from the
same generator (bench/loadgen.c, see _loadgen.py), closed loop, with 1 and 32
connections, in interleaved rounds (every server once per round, rounds
repeated). Prints the median calls/s with its min-max over rounds, p50/p99 of
the median round, the share of the core the generator and the server used, and
the CPU other processes on the machine used meanwhile (foreign, in % of one
core: noise the interleaving spreads over every server), then capd's ratios to
each peer.

    python bench/peers.py [--seconds 2] [--rounds 3] [--results FILE]
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
import shutil
import statistics
import tempfile
import textwrap
import time

from bench._harness import (
    CPUS,
    SERVER_CPUS,
    Results,
    children_cpu_s,
    machine_busy_s,
    spread,
    stop,
    tree_cpu_s,
)
from bench._loadgen import KIND, Load, load
from bench._servers import Server, installed, start_capd, start_peer

PACK = textwrap.dedent('''
    from pydantic import BaseModel
    from capd.registry import op

    class Empty(BaseModel):
        pass

    @op("bench.noop")
    async def noop(params: Empty) -> None:
        return None

    @op("bench.noop_sync")
    def noop_sync(params: Empty) -> None:
        return None
''')

CAPS = textwrap.dedent('''
    [[capability]]
    name = "bench.noop"
    op = "bench.noop"
    summary = "Do nothing."

    [[capability]]
    name = "bench.noop_sync"
    op = "bench.noop_sync"
    summary = "Do nothing, in a plain function."
''')

# capd's defaults, except: no entry-point plugins, no periodic re-probe during the
# run, and the per-peer rate limiter on but out of reach (one peer uid sends all).
CONFIG = textwrap.dedent('''
    plugins = ["bench_pack"]
    plugin_paths = ["."]
    declarations = ["caps.toml"]
    entry_points = false
    probe_live_interval_s = 3600
    call_rate_per_s = 1000000000
    call_burst = 1000000000
''')


HTTP_ONLY = "capd's HTTP layer alone, fixed answer"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default="1,32")
    parser.add_argument("--results", type=Path, default=None)
    args = parser.parse_args()
    results = Results(args.results)
    tmp = Path(tempfile.mkdtemp(prefix="capd-peers-", dir="/tmp"))
    servers: list[Server] = []
    # (label, server, path)
    rows: list[tuple[str, Server, str]] = []
    missing: list[str] = []
    try:
        for kind, label in (("raw", "raw asyncio Protocol, uvloop (ceiling)"),
                            ("aiohttp", "bare aiohttp, uvloop"),
                            ("uvicorn", "uvicorn + bare ASGI (httptools, uvloop)"),
                            ("granian", "granian + bare ASGI (1 worker, 1 thread)")):
            if kind != "raw" and not installed(kind):
                missing.append(kind)
                continue
            server = start_peer(kind, tmp / kind)
            servers.append(server)
            rows.append((label, server, "/call/bench.noop"))
        # Not a peer: capd's HTTP layer alone, to tell its cost from the call path's.
        http_only = start_peer("capd-http", tmp / "capd-http")
        servers.append(http_only)
        rows.append((HTTP_ONLY, http_only, "/call/bench.noop"))
        capd = start_capd(tmp / "capd", pack=PACK, caps=CAPS, config=CONFIG)
        servers.append(capd)
        rows.append(("capd POST /call, async def op", capd, "/call/bench.noop"))
        rows.append(("capd POST /call, plain def op", capd, "/call/bench.noop_sync"))

        clients = [int(c) for c in args.clients.split(",")]
        print(f"dispatch peers, {CPUS} cores, server and generator pinned to core "
              f"{SERVER_CPUS}, generator: {KIND}; {args.rounds} interleaved rounds of "
              f"{args.seconds:g} s (+0.5 s warm-up) per figure")
        if missing:
            print(f"not installed, skipped: {', '.join(missing)} (pip install -e '.[bench]')")
        print(f"{'server':<42}{'conns':>6}{'calls/s':>10}{'min-max':>16}{'p50 µs':>9}"
              f"{'p99 µs':>9}{'gen cpu':>8}{'srv cpu':>8}{'foreign':>8}")
        runs: dict[tuple[str, int], list[tuple[Load, float, float]]] = {}
        notes: dict[tuple[str, int], str] = {}
        for conns in clients:
            for _ in range(args.rounds):
                for label, server, path in rows:
                    busy, mine = machine_busy_s(), children_cpu_s()
                    cpu_before, started = tree_cpu_s(server.proc.pid), time.monotonic()
                    got = load(server.sock, connections=conns, seconds=args.seconds, path=path)
                    elapsed = time.monotonic() - started
                    server_s = tree_cpu_s(server.proc.pid) - cpu_before
                    generator_s = children_cpu_s() - mine
                    foreign = (machine_busy_s() - busy - server_s - generator_s) / elapsed
                    server_cpu = server_s / elapsed
                    if got.non_2xx or got.errors:
                        raise SystemExit(f"{label}: {got.non_2xx} non-2xx answers, "
                                         f"{got.errors} errors; see {server.log}")
                    runs.setdefault((label, conns), []).append((got, server_cpu, foreign))
            for label, _server, _path in rows:
                rounds = runs[(label, conns)]
                rates = [r.rps for r, _, _ in rounds]
                mid = sorted(rounds, key=lambda r: r[0].rps)[len(rounds) // 2]
                median, lo, hi = spread(rates)
                foreign = max(f for _, _, f in rounds)
                print(f"{label:<42}{conns:>6}{median:>10.0f}{f'{lo:.0f}-{hi:.0f}':>16}"
                      f"{mid[0].p50_us:>9.0f}{mid[0].p99_us:>9.0f}"
                      f"{mid[0].generator_cpu_pct:>7.0f}%{100 * mid[1]:>7.0f}%"
                      f"{100 * foreign:>7.0f}%")
                notes[(label, conns)] = (
                    f"p50 {mid[0].p50_us:.0f} µs, p99 {mid[0].p99_us:.0f} µs; core: generator "
                    f"{mid[0].generator_cpu_pct:.0f} %, server {100 * mid[1]:.0f} %; foreign "
                    f"CPU up to {100 * foreign:.0f} %")

        # One table row per server and connection count; capd's rows are set against the
        # fastest bare HTTP stack measured, their note giving the ratio to every peer.
        peers = [label for label, _server, _path in rows if not label.startswith("capd")]
        print("capd's median calls/s against each peer's:")
        for conns in clients:
            def rates(label: str, conns: int = conns) -> list[float]:
                return [r.rps for r, _, _ in runs[(label, conns)]]

            http = [p for p in peers if not p.startswith("raw")]
            best = max(http or peers, key=lambda p: statistics.median(rates(p)))
            for label in peers:
                results.add("dispatch", f"{label}, {conns} conn", rates(label), "calls/s",
                            note=notes[(label, conns)])
            results.add("dispatch", f"{HTTP_ONLY}, {conns} conn", rates(HTTP_ONLY), "calls/s",
                        against=best, against_values=rates(best),
                        note="not a peer: the HTTP server capd's call path runs behind. "
                        + notes[(HTTP_ONLY, conns)])
            for capd_label in ("capd POST /call, async def op", "capd POST /call, plain def op"):
                mine = rates(capd_label)
                ratios = []
                for label in peers:
                    ratio = statistics.median(mine) / statistics.median(rates(label))
                    ratios.append(f"{label.split(',')[0].split(' +')[0]} {ratio:.2f}")
                    print(f"  {conns:>2} conn: {capd_label[16:]:<16} / {label:<42} {ratio:.2f}")
                results.add("dispatch", f"{capd_label}, {conns} conn", mine, "calls/s",
                            against=best, against_values=rates(best),
                            note=f"ratio to {'; '.join(ratios)}. {notes[(capd_label, conns)]}")
        conns = clients[-1]
        ceiling = runs[("raw asyncio Protocol, uvloop (ceiling)", conns)]
        capd_runs = runs[("capd POST /call, async def op", conns)]
        top = statistics.median(r.rps for r, _, _ in ceiling)
        gen_us = statistics.median(r.generator_cpu_pct * 1e4 / r.rps for r, _, _ in ceiling)
        print(f"generator check ({conns} conns): the same generator drives the raw ceiling at "
              f"{top:.0f} calls/s, {top / statistics.median(r.rps for r, _, _ in capd_runs):.1f}"
              f"x capd's rate, spending {gen_us:.1f} µs of CPU a call (at capd's rate: "
              f"{statistics.median(r.generator_cpu_pct for r, _, _ in capd_runs):.0f} % of "
              "its own core)")
        results.add("dispatch", f"generator check: raw ceiling / capd async op, {conns} conn",
                    [r.rps for r, _, _ in ceiling], "calls/s",
                    against="capd POST /call, async def op",
                    against_values=[r.rps for r, _, _ in capd_runs],
                    note=f"generator CPU {gen_us:.1f} µs a call")
    finally:
        for server in servers:
            stop(server.proc)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
