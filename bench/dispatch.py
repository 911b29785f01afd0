"""Dispatch throughput and latency of `POST /call/{name}`, and what capd's policy costs.

Starts, in the same run, a bare aiohttp handler on a Unix socket under uvloop
(the baseline) and two real daemons (`capd serve`) on a no-op capability: one
with no policy at all, one with the whole policy pipeline on (a before-hook and
an after-hook on every call, the capability behind a consent grant, loop
detection counting every call of a session, each client connection its own
session, thresholds out of reach so nothing is refused). All are driven by the
one load generator of the bench (bench/loadgen.c, see _loadgen.py), on a core of
its own, each server on the bench core (see _harness.py), with 1 and 32 concurrent
connections, in interleaved rounds of a fixed time each; with ``--before PATH``
(an export of an older commit) a no-policy daemon of that code runs in the same
rounds, so "no policy" is compared with what it was in the same run. Prints the median
calls/s with the spread over rounds, p50/p99 of the median round, and the
ratios capd / bare and policy / no policy. Then the added latency of an
upstream MCP tool through capd against the SDK client straight to the same
server (servers and client all on the bench core), and /health latency while full
reloads whose probes take 2 s run back to back.

bench/peers.py sets capd beside the other Python HTTP stacks.

    python bench/dispatch.py [--seconds 2] [--rounds 3] [--results FILE] [--before PATH]
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
import os
import shutil
import statistics
import tempfile
import textwrap
import threading
import time

import uvloop

from bench._harness import CPUS, SERVER_CPUS, Results, pin, spread, stop
from bench._loadgen import KIND, Load, load
from bench._servers import Server, start_capd, start_peer

PACK = textwrap.dedent('''
    import asyncio, os
    from pydantic import BaseModel
    from capd.registry import op

    class Empty(BaseModel):
        pass

    @op("bench.noop")
    async def noop(params: Empty) -> None:
        return None

    try:
        from capd.registry import after_call, before_call
    except ImportError:  # an older checkout (--root) without hooks
        pass
    else:
        @before_call("bench.*")
        async def look(capability, params, caller):
            return None

        @after_call("bench.*")
        async def seen(capability, params, caller, result):
            return None

    async def reload_probe() -> bool:
        if os.path.exists(os.environ["BENCH_SLOW_FLAG"]):
            await asyncio.sleep(2)
        return True
''')

CONFIG = textwrap.dedent('''
    plugins = ["bench_pack"]
    plugin_paths = ["."]
    declarations = ["caps.toml"]
    entry_points = false
    probe_live_interval_s = 3600
    call_rate_per_s = 0          # measure dispatch, not the rate limiter

    [tools.gate]
    kind = "python"
    target = "bench_pack:reload_probe"
    timeout_s = 10
''')

CAPS = textwrap.dedent('''
    [[capability]]
    name = "bench.noop"
    op = "bench.noop"
    summary = "Do nothing."
    requires = ["gate"]
''')

NO_POLICY = textwrap.dedent('''
    [policy.loops]
    enabled = false
''')

POLICY = textwrap.dedent('''
    [policy]
    before = ["bench_pack:look"]
    after = ["bench_pack:seen"]

    [policy.loops]
    warn_at = 100000000
    block_at = 100000001
    per_minute_warn = 100000000
    per_minute_block = 100000001
''')


def health_during_reloads(sock: str, flag: Path, seconds: float) -> dict[str, float]:
    from capd.sidecar.client._client import request

    flag.touch()
    finished = threading.Event()
    reloads = 0

    def reloader() -> None:
        nonlocal reloads
        while not finished.is_set():
            request(Path(sock), "POST", "/reload")
            reloads += 1

    thread = threading.Thread(target=reloader)
    thread.start()
    time.sleep(0.2)
    latencies = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        response = request(Path(sock), "GET", "/health")
        latencies.append(time.perf_counter() - started)
        assert response.status == 200
    finished.set()
    thread.join()
    flag.unlink()
    latencies.sort()
    return {"n": len(latencies), "p50_ms": latencies[len(latencies) // 2] * 1e3,
            "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3, "reloads": reloads}


UPSTREAM = textwrap.dedent('''
    [tools.time_mcp]
    kind = "mcp"
    command = ["{python}", "-m", "mcp_server_time", "--local-timezone", "UTC"]
    timeout_s = 30
''')


def upstream_rows(sock: str, calls: int, rounds: int) -> tuple[list[float], list[float]]:
    """p50 of a sequential `get_current_time` call, in interleaved rounds: through capd
    (POST /call over the socket, the daemon's session to mcp-server-time) and straight to
    the same server with the official SDK client over stdio. Everything runs on the
    bench core: capd's child inherits its pinning, the SDK's server is pinned here, and
    the caller (this process) is pinned before this is called."""
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    from capd.sidecar.client._client import request

    def through_capd() -> float:
        lat = []
        for _ in range(calls):
            started = time.perf_counter()
            answer = request(Path(sock), "POST", "/call/time_mcp.get_current_time",
                             body={"timezone": "UTC"})
            lat.append(time.perf_counter() - started)
            if answer.status != 200:
                raise SystemExit(f"upstream call failed: {answer.body}")
        return statistics.median(lat) * 1e3

    async def direct(session: ClientSession) -> float:
        lat = []
        for _ in range(calls):
            started = time.perf_counter()
            result = await session.call_tool("get_current_time", {"timezone": "UTC"})
            lat.append(time.perf_counter() - started)
            if result.is_error:
                raise SystemExit(f"direct call failed: {result}")
        return statistics.median(lat) * 1e3

    pinned = (f"import os, runpy, sys; os.sched_setaffinity(0, {SERVER_CPUS!r}); "
              "sys.argv = ['mcp_server_time', '--local-timezone', 'UTC']; "
              "runpy.run_module('mcp_server_time', run_name='__main__')")
    args = (["-c", pinned] if SERVER_CPUS
            else ["-m", "mcp_server_time", "--local-timezone", "UTC"])

    async def run() -> tuple[list[float], list[float]]:
        params = StdioServerParameters(command=sys.executable, args=args)
        capd_p50: list[float] = []
        sdk_p50: list[float] = []
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            await direct(s)  # warm-up
            await asyncio.to_thread(through_capd)
            for _ in range(rounds):
                sdk_p50.append(await direct(s))
                capd_p50.append(await asyncio.to_thread(through_capd))
        return capd_p50, sdk_p50

    return uvloop.run(run())


BARE = "bare aiohttp (baseline)"
PLAIN = "capd POST /call, no policy"
GUARDED = "capd POST /call, full policy"
BEFORE = "capd before (--before), no policy"


def main() -> None:
    from capd.sidecar.client._client import request

    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--before", type=Path, default=None,
                        help="an older checkout: its no-policy daemon runs in the same rounds")
    args = parser.parse_args()
    results = Results(args.results)
    tmp = Path(tempfile.mkdtemp(prefix="capd-bench-", dir="/tmp"))
    flag = tmp / "slow"
    env = {**os.environ, "BENCH_SLOW_FLAG": str(flag)}
    upstream = UPSTREAM.format(python=sys.executable)
    started: list[Server] = []
    try:
        plain = start_capd(tmp / "plain", pack=PACK, caps=CAPS,
                           config=CONFIG + NO_POLICY + upstream, env=env)
        started.append(plain)
        guarded_caps = CAPS + 'consent_operations = ["bench.run"]\n'
        guarded = start_capd(tmp / "policy", pack=PACK, caps=guarded_caps,
                             config=CONFIG + POLICY, env=env)
        started.append(guarded)
        bare = start_peer("aiohttp", tmp / "bare")
        started.append(bare)
        before = None
        if args.before is not None:
            before = start_capd(tmp / "before", pack=PACK, caps=CAPS,
                                config=CONFIG + NO_POLICY, env=env, root=args.before)
            started.append(before)
        grant = request(Path(guarded.sock), "POST", "/consent",
                        body={"operations": ["bench.run"], "ttl": "1d"})
        if grant.status != 200:
            raise SystemExit(f"consent grant failed: {grant.body}")
        print(f"dispatch bench, {CPUS} cores, generator: {KIND}; {args.rounds} interleaved "
              f"rounds of {args.seconds:g} s (+0.5 s warm-up) per figure, over the Unix socket")
        print(f"{'server':<34}{'clients':>8}{'calls/s':>10}{'min-max':>16}{'p50 µs':>9}"
              f"{'p99 µs':>9}")
        servers = ((BARE, bare, False), (PLAIN, plain, False), (GUARDED, guarded, True),
                   *(((BEFORE, before, False),) if before is not None else ()))
        runs: dict[tuple[str, int], list[Load]] = {}
        for clients in (1, 32):
            for _ in range(args.rounds):
                for name, server, sessions in servers:
                    got = load(server.sock, connections=clients, seconds=args.seconds,
                               path="/call/bench.noop",
                               per_connection_header="Capd-Session: bench-%d" if sessions
                               else None)
                    if got.non_2xx or got.errors:
                        raise SystemExit(f"{name}: {got.non_2xx} non-2xx answers, "
                                         f"{got.errors} errors; see {server.log}")
                    runs.setdefault((name, clients), []).append(got)
            for name, _server, _sessions in servers:
                rounds = sorted(runs[(name, clients)], key=lambda r: r.rps)
                mid = rounds[len(rounds) // 2]
                median, lo, hi = spread([r.rps for r in rounds])
                print(f"{name:<34}{clients:>8}{median:>10.0f}{f'{lo:.0f}-{hi:.0f}':>16}"
                      f"{mid.p50_us:>9.0f}{mid.p99_us:>9.0f}")

        def rates(name: str, clients: int) -> list[float]:
            return [r.rps for r in runs[(name, clients)]]

        for clients in (1, 32):
            bare_rps = statistics.median(rates(BARE, clients))
            plain_rps = statistics.median(rates(PLAIN, clients))
            policy_rps = statistics.median(rates(GUARDED, clients))
            print(f"{clients:>2} client(s): capd / bare aiohttp {plain_rps / bare_rps:.2f}; "
                  f"full policy / no policy {policy_rps / plain_rps:.2f} "
                  f"(the pipeline costs {100 * (1 - policy_rps / plain_rps):.0f} % of calls/s)")
            results.add("policy", f"{PLAIN}, {clients} conn", rates(PLAIN, clients), "calls/s",
                        against=BARE, against_values=rates(BARE, clients),
                        note="limiter off, loops off")
            results.add("policy", f"{GUARDED}, {clients} conn", rates(GUARDED, clients),
                        "calls/s", against=PLAIN, against_values=rates(PLAIN, clients),
                        note="2 hooks, consent, loop detection per session")
            if before is not None:
                before_rps = statistics.median(rates(BEFORE, clients))
                print(f"{clients:>2} client(s): no policy now / before "
                      f"{plain_rps / before_rps:.2f}")
                results.add("policy", f"{PLAIN}, {clients} conn, now vs before",
                            rates(PLAIN, clients), "calls/s", against=BEFORE,
                            against_values=rates(BEFORE, clients), note=str(args.before))
        pin(SERVER_CPUS)  # the client beside the servers, as the generator was
        capd_p50, sdk_p50 = upstream_rows(plain.sock, 200, args.rounds)
        capd_mid, sdk_mid = statistics.median(capd_p50), statistics.median(sdk_p50)
        print(f"upstream MCP tool (mcp-server-time get_current_time), 200 sequential calls "
              f"x {args.rounds} rounds: through capd p50 {capd_mid:.2f} ms "
              f"({min(capd_p50):.2f}-{max(capd_p50):.2f}); SDK client straight to the server "
              f"p50 {sdk_mid:.2f} ms ({min(sdk_p50):.2f}-{max(sdk_p50):.2f}); capd adds "
              f"{capd_mid - sdk_mid:.2f} ms")
        results.add("upstream", "MCP tool through capd, p50 of 200 sequential calls", capd_p50,
                    "ms", against="SDK client straight to the server", against_values=sdk_p50,
                    note=f"capd adds {capd_mid - sdk_mid:.2f} ms")
        health = health_during_reloads(plain.sock, flag, args.seconds)
        print(f"/health during back-to-back reloads with 2 s probes: n={health['n']} "
              f"p50 {health['p50_ms']:.2f} ms  p99 {health['p99_ms']:.2f} ms "
              f"({health['reloads']} reloads)")
        results.add("reload", "/health p99 during back-to-back reloads (2 s probes)",
                    [health["p99_ms"]], "ms",
                    note=f"p50 {health['p50_ms']:.2f} ms, {health['n']} requests, "
                         f"{health['reloads']} reloads")
    finally:
        for server in started:
            stop(server.proc)
        if started:
            lines = len(started[0].log.read_bytes().splitlines())
            print(f"capd log lines written during the run (no-policy daemon): {lines}")
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
