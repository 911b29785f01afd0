"""A tool call through `capd mcp` against the same function hosted directly in an SDK MCPServer.

Starts the real daemon (`capd serve`, the no-op `async def` op of bench/dispatch.py, no
policy, loop detection off) and, with the official SDK client (ClientSession over
stdio_client), three MCP servers on stdio:

- `capd mcp` in its default meta mode, the capability called the way an agent calls
  it: ``invoke_capability {"id": "bench.noop"}``, forwarded to the daemon's socket;
- `capd mcp --expose direct`, the capability offered as a tool of its own
  (``bench.noop``), forwarded the same way;
- the baseline: the same function (``async def noop() -> None``) registered with
  ``@server.tool()`` on an SDK ``MCPServer`` and run with ``server.run("stdio")``.

Everything (this client, the MCP servers it launches, the daemon) runs on the bench
core (see _harness.py). Sequential calls, one at a time; interleaved rounds of
``--calls`` calls each, after a warm-up. Prints per server the median over rounds of
each round's calls/s, p50 and p99 (min-max over rounds), the CPU each process used per
call (from /proc, summed over the rounds), and the ratios capd / direct: calls/s of the
bridge over calls/s of MCPServer (the figure the goal "≥ 0.85 of a direct MCPServer"
is about; also round by round, each bridge round against the direct round just
before it), and direct p50 over bridge p50.

    python bench/mcp_bridge.py [--calls 300] [--rounds 7] [--results FILE] [--also-root PATH]

--also-root also runs `capd mcp` (meta mode) from another checkout (an export of an
older commit) against the same daemon, in the same rounds, for a before/after table.
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
import os
import shutil
import statistics
import tempfile
import textwrap
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import uvloop

from bench._harness import CPUS, REPO, SERVER_CPUS, Results, pin, spread, stop, tree_cpu_s
from bench._servers import Server, start_capd
from bench.dispatch import CAPS, CONFIG, NO_POLICY, PACK

DIRECT_SERVER = textwrap.dedent('''
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("direct")


    @server.tool()
    async def noop() -> None:
        """Do nothing."""
        return None


    server.run("stdio")
''')

DIRECT = "SDK MCPServer, same function"
META = "capd mcp, invoke_capability"
EXPOSED = "capd mcp --expose direct"


@dataclass
class Target:
    """One MCP server under test: how to call it, and what its rounds measured."""

    name: str
    argv: list[str]
    tool: str
    arguments: dict[str, Any]
    root: Path = REPO
    rps: list[float] = field(default_factory=list)
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    daemon_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    calls: int = 0
    pid: int | None = None


def _child_pid(argv: list[str]) -> int | None:
    """The pid of this process's child started with ``argv``."""
    me, wanted = str(os.getpid()), "\0".join(argv) + "\0"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if stat[stat.rindex(")") + 2:].split()[1] == me and cmdline == wanted:
            return int(entry)
    return None


def _cpu_s(pid: int | None) -> float:
    return tree_cpu_s(pid) if pid is not None else 0.0


async def open_session(stack: AsyncExitStack, target: Target) -> Any:
    """An initialized client session to ``target``, closed with ``stack``."""
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    # Not in the repository's folder: `python -m capd` would import the checkout there
    # before the one on PYTHONPATH.
    params = StdioServerParameters(command=target.argv[0], args=target.argv[1:],
                                   env={**os.environ, "PYTHONPATH": str(target.root)},
                                   cwd=tempfile.gettempdir())
    read, write = await stack.enter_async_context(stdio_client(params))
    client = await stack.enter_async_context(ClientSession(read, write))
    await client.initialize()
    tools = {t.name for t in (await client.list_tools()).tools}
    if target.tool not in tools:
        raise SystemExit(f"{target.name}: no tool {target.tool!r} in {sorted(tools)}")
    target.pid = _child_pid(target.argv)
    return client


async def one_round(client: Any, target: Target, calls: int, daemon_pid: int | None,
                    record: bool) -> None:
    latencies = []
    cpu0, daemon0, client0 = _cpu_s(target.pid), _cpu_s(daemon_pid), time.process_time()
    started = time.perf_counter()
    for _ in range(calls):
        t0 = time.perf_counter()
        result = await client.call_tool(target.tool, target.arguments)
        latencies.append(time.perf_counter() - t0)
        if result.is_error:
            raise SystemExit(f"{target.name}: the call failed: {result.content}")
    elapsed = time.perf_counter() - started
    if not record:
        return
    client1, cpu1, daemon1 = time.process_time(), _cpu_s(target.pid), _cpu_s(daemon_pid)
    latencies.sort()
    target.rps.append(calls / elapsed)
    target.p50_ms.append(latencies[len(latencies) // 2] * 1e3)
    target.p99_ms.append(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3)
    target.cpu_s += cpu1 - cpu0
    target.daemon_cpu_s += daemon1 - daemon0
    target.client_cpu_s += client1 - client0
    target.calls += calls


async def measure(targets: list[Target], calls: int, rounds: int,
                  daemon_pid: int | None) -> None:
    async with AsyncExitStack() as stack:
        clients = [await open_session(stack, t) for t in targets]
        for client, target in zip(clients, targets, strict=True):  # warm-up
            await one_round(client, target, max(50, calls // 4), None, record=False)
        for _ in range(rounds):
            for client, target in zip(clients, targets, strict=True):
                await one_round(client, target, calls, daemon_pid, record=True)


def fmt(values: list[float], digits: int = 2) -> str:
    median, lo, hi = spread(values)
    return f"{median:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300, help="calls per round and server")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--also-root", type=Path, default=None,
                        help="also measure the meta bridge of this checkout (before/after)")
    args = parser.parse_args()
    results = Results(args.results)
    tmp = Path(tempfile.mkdtemp(prefix="capd-bench-", dir="/tmp"))
    env = {**os.environ, "BENCH_SLOW_FLAG": str(tmp / "slow")}
    daemon: Server | None = None
    try:
        daemon = start_capd(tmp / "capd", pack=PACK, caps=CAPS, config=CONFIG + NO_POLICY,
                            env=env)
        (tmp / "direct_server.py").write_text(DIRECT_SERVER)
        python = sys.executable
        bridge = [python, "-m", "capd", "mcp", "--socket", daemon.sock]
        targets = [
            Target(DIRECT, [python, str(tmp / "direct_server.py")], "noop", {}),
            Target(META, bridge, "invoke_capability", {"id": "bench.noop"}),
            Target(EXPOSED, [*bridge, "--expose", "direct"], "bench.noop", {}),
        ]
        if args.also_root is not None:
            # The same command line as the meta bridge's: a marker argument tells them apart.
            targets.append(Target(f"{META} ({args.also_root.name})",
                                  [*bridge, "--expose", "meta"], "invoke_capability",
                                  {"id": "bench.noop"}, root=args.also_root.resolve()))
        pin(SERVER_CPUS)  # this client beside the servers it launches (they inherit it)
        print(f"MCP bridge bench, {CPUS} cores, everything on core(s) {SERVER_CPUS}; "
              f"{args.rounds} interleaved rounds of {args.calls} sequential calls per server")
        uvloop.run(measure(targets, args.calls, args.rounds, daemon.proc.pid))
        width = max(len(t.name) for t in targets) + 2
        print(f"{'server':<{width}}{'calls/s':>18}{'p50 ms':>20}{'p99 ms':>20}"
              f"{'CPU µs/call: server':>21}{'daemon':>8}{'client':>8}")
        for t in targets:
            print(f"{t.name:<{width}}{fmt(t.rps, 0):>18}{fmt(t.p50_ms):>20}{fmt(t.p99_ms):>20}"
                  f"{1e6 * t.cpu_s / t.calls:>21.0f}{1e6 * t.daemon_cpu_s / t.calls:>8.0f}"
                  f"{1e6 * t.client_cpu_s / t.calls:>8.0f}")
        direct = targets[0]
        direct_p50 = statistics.median(direct.p50_ms)
        for t in targets[1:]:
            rps_ratio = statistics.median(t.rps) / statistics.median(direct.rps)
            paired = [b / d for b, d in zip(t.rps, direct.rps, strict=True)]
            p50 = statistics.median(t.p50_ms)
            print(f"{t.name}: calls/s {rps_ratio:.2f} of the direct MCPServer's (round by "
                  f"round {fmt(paired)}); direct p50 / bridge p50 {direct_p50 / p50:.2f}; "
                  f"the bridge adds {p50 - direct_p50:.2f} ms p50")
            results.add("mcp", f"{t.name}, calls/s, 1 client, sequential calls", t.rps,
                        "calls/s", against=DIRECT, against_values=direct.rps,
                        note=f"ratio = calls/s over the direct server's (round by round "
                             f"{fmt(paired)}); p50 {p50:.2f} ms vs {direct_p50:.2f}, p99 "
                             f"{statistics.median(t.p99_ms):.2f} vs "
                             f"{statistics.median(direct.p99_ms):.2f}")
            results.add("mcp", f"{t.name}, p50 per call", t.p50_ms, "ms", against=DIRECT,
                        against_values=direct.p50_ms,
                        note=f"ratio = bridge p50 / direct p50; direct p50 / bridge p50 "
                             f"{direct_p50 / p50:.2f}")
    finally:
        if daemon is not None:
            stop(daemon.proc)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
