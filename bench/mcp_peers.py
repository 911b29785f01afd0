"""capd's MCP relay against the gateways a user would pick instead, on one upstream.

The upstream is the same for every target: `mcp-server-time` (PyPI) on stdio,
``python -m mcp_server_time --local-timezone UTC``, its tool ``get_current_time
{"timezone": "UTC"}``; each target has an upstream process of its own. Every target
is driven by the official SDK client (``mcp``: ``ClientSession`` over
``stdio_client``, ``streamable_http_client`` or ``sse_client``):

- direct: the SDK client straight to mcp-server-time (the baseline);
- capd bridge, direct mode: the real daemon (``capd serve``, the upstream as
  ``[tools.time_mcp] kind = "mcp"``) and ``capd mcp --expose direct`` as the stdio
  server, tool ``time_mcp.get_current_time``;
- capd bridge, meta mode: the same with ``capd mcp``, ``invoke_capability``;
- capd over streamable HTTP: the daemon's own front door (``[mcp.http]``), a bearer
  token from ``capd token create --allow time_mcp.get_current_time``,
  ``invoke_capability``;
- FastMCP's proxy (``fastmcp``, the ``bench`` extra) as the stdio server, in its
  documented configurations: ``create_proxy(StdioTransport(...))`` (its default,
  a fresh client per request; with a stdio upstream the transport keeps the one
  subprocess and its session alive between them, ``keep_alive`` on by default);
  one ``ProxyClient`` reused for every request (the docs' "session reuse"); and
  that shared proxy with ``BM25SearchTransform`` (lists ``search_tools`` and
  ``call_tool``; the tool is called as ``call_tool {"name": "get_current_time",
  ...}``, as capd's meta mode calls ``invoke_capability``; its ``call_tool`` reads
  the whole catalog, a ``tools/list`` of the upstream, on every call);
- mcp-hub (npm, pinned in bench/npm/package.json; ``npm ci --prefix bench/npm``):
  ``mcp-hub --port P --config F`` with the upstream as a stdio server. 4.2.x
  serves its MCP endpoint as the HTTP+SSE transport (``GET /mcp`` and ``POST
  /messages``), not streamable HTTP, so the SDK's ``sse_client`` talks to it; its
  tool is ``time__get_current_time``. At start it also fetches its marketplace
  catalogue from the network (and carries on without it). Skipped, and said so,
  without node.

capd's daemons run with loop detection off (the same call, over and over, is what a
loop looks like) and the rate limiter on but out of reach (``call_rate_per_s``);
each capd target has a daemon of its own.

Measured, per target:

- sequential calls on one session, in interleaved rounds (round 1: every target,
  round 2: every target, ...) after a warm-up: calls/s, p50 and p99 of a call, the
  added latency (p50 of the target minus p50 of direct in the same round) and
  calls/s over direct's in the same round; medians over rounds, min-max; and the CPU
  per call over the rounds of the client and of every server-side process (the
  upstream's included), which tells a relay's own cost from the client's;
- start-up, in interleaved rounds: from launching the front door (the bridge or
  proxy the client spawns, with the daemon already running for the bridges; the
  daemon for capd's HTTP front door; the hub) to the first successful call after
  ``initialize`` and ``tools/list``, what a host does; the HTTP front door and the
  hub include starting the upstream, as FastMCP's proxy does (it starts it at the
  client's ``initialize``); the bridges do not (the running daemon holds it);
- RSS after 1,000 calls (by default the warm-up and the rounds make them) of the
  gateway's own processes: VmRSS summed over the
  gateway's processes and their children but not the upstream's (capd: daemon,
  its stdio relay, the bridge; FastMCP: the proxy; mcp-hub: its node process);
  for direct, the upstream's own, for scale. Summed RSS counts shared pages once
  per process;
- tokens of the front door's ``tools/list`` answer (characters of the compact JSON
  of its tools / 4; capd's direct mode lists its meta tools beside the upstream's)
  and of one call's answer (the ``CallToolResult``, the same).

Placement. The machine this runs on has 2 cores: the SDK client runs on the
generator's core (``GENERATOR_CPUS``) and every server-side process (front door,
daemon, relay, upstream) on the other, each launched with ``taskset`` or
``_harness.spawn`` and at nice -10 where allowed. A relay of several processes
shares its core among them, as it would on a loaded host; putting the client on
that core too would take its time out of the servers' and tax most the target that
answers fastest.

    python bench/mcp_peers.py [--rounds 5] [--calls 190] [--starts 3] [--results FILE]
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
import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import uvloop

from bench._harness import (
    CPUS,
    GENERATOR_CPUS,
    REPO,
    SERVER_CPUS,
    Results,
    pin,
    spawn,
    spread,
    stop,
    tree_cpu_s,
)
from bench._servers import Server, installed, start_capd

PYTHON = sys.executable
UPSTREAM = [PYTHON, "-m", "mcp_server_time", "--local-timezone", "UTC"]
ARGS = {"timezone": "UTC"}
HUB = REPO / "bench" / "npm" / "node_modules" / "mcp-hub"
RSS_AFTER_CALLS = 1000
START_TIMEOUT_S = 60.0
ROUND_TIMEOUT_S = 300.0
# Server-side processes the client launches go to the server core: taskset execs them.
PIN = (["taskset", "-c", ",".join(map(str, sorted(SERVER_CPUS)))]
       if SERVER_CPUS and shutil.which("taskset") else [])

FASTMCP_PROXY = textwrap.dedent('''
    """FastMCP's proxy in front of mcp-server-time, on stdio; argv[1]: default, shared, bm25."""
    import sys

    from fastmcp.client.transports import StdioTransport
    from fastmcp.server import create_proxy
    from fastmcp.server.providers.proxy import FastMCPProxy, ProxyClient
    from fastmcp.server.transforms.search import BM25SearchTransform

    mode = sys.argv[1]
    upstream = StdioTransport(command=sys.executable,
                              args=["-m", "mcp_server_time", "--local-timezone", "UTC"])
    if mode == "default":  # create_proxy: a fresh client (session isolation) per request
        proxy = create_proxy(upstream, name="time-proxy")
    else:  # the docs' "session reuse": one client for every request
        shared = ProxyClient(upstream).new()
        proxy = FastMCPProxy(client_factory=lambda: shared, name="time-proxy")
    if mode == "bm25":
        proxy.add_transform(BM25SearchTransform())
    proxy.run(show_banner=False)
''')

PACK = "from capd.registry import op  # no ops: the upstream's tool is the capability\n"

DIRECT = "direct (SDK client to mcp-server-time)"

Opener = Callable[[AsyncExitStack], Awaitable[Any]]


def capd_config(port: int | None = None) -> str:
    """capd.toml for one daemon in front of the upstream; with ``port``, the HTTP front door."""
    config = textwrap.dedent(f"""
        plugins = []
        entry_points = false
        probe_live_interval_s = 3600
        call_rate_per_s = 1000000     # on, but out of reach
        call_burst = 1000000

        [tools.time_mcp]
        kind = "mcp"
        command = {json.dumps(UPSTREAM)}
        timeout_s = 30                # its handshake: the upstream starts slowly on a busy core

        [policy.loops]
        enabled = false               # the same call again and again is a loop to capd
    """)
    if port is not None:
        config += f'\n[mcp.http]\nlisten = "127.0.0.1:{port}"\n'
    return config


@dataclass
class Target:
    """One front door: how to reach it, how to restart it, and what its rounds measured."""

    name: str
    opener: Opener
    tool: str
    arguments: dict[str, Any]
    argv: list[str] | None = None  # the stdio server the client launches
    baseline: bool = False  # the upstream itself: its RSS is the upstream's
    launched: str = ""  # what its start-up starts
    # the gateway's processes the client does not launch (capd's daemon, the hub)
    gateway: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # a served front door: how to start it again (for its start-up), and its port
    restart: Callable[[], subprocess.Popen[bytes]] | None = None
    port: int | None = None
    rps: list[float] = field(default_factory=list)
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    start_s: list[float] = field(default_factory=list)
    calls: int = 0
    roots: list[int] = field(default_factory=list)  # its server-side processes' roots
    client_cpu_s: float = 0.0  # over the recorded rounds
    server_cpu_s: float = 0.0  # the same, of every server-side process (the upstream's too)
    recorded_calls: int = 0
    rss_mib: float = float("nan")
    processes: int = 0
    list_tokens: float = float("nan")
    answer_tokens: float = float("nan")


# ---------------------------------------------------------------- processes


def _processes() -> dict[int, tuple[int, list[str]]]:
    """Every process: its parent and its argv."""
    found: dict[int, tuple[int, list[str]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        found[int(entry)] = (int(stat[stat.rindex(")") + 2:].split()[1]),
                             argv.rstrip("\0").split("\0"))
    return found


def _is_upstream(argv: list[str]) -> bool:
    # capd's stdio relay names the upstream's command after `--`; only the server itself
    # starts with `-m mcp_server_time`
    return argv[1:3] == ["-m", "mcp_server_time"]


def _child_pid(argv: list[str]) -> int | None:
    """The pid of this process's child running ``argv`` (taskset execs it)."""
    me = os.getpid()
    return next((pid for pid, (parent, got) in _processes().items()
                 if parent == me and got == argv), None)


def _vm_rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def gateway_rss(roots: list[int], *, skip_upstream: bool = True) -> tuple[float, int]:
    """VmRSS (MiB) summed over ``roots`` and their descendants, the upstream's subtree
    left out; and how many processes that is."""
    table = _processes()
    total, count, todo = 0, 0, list(roots)
    while todo:
        pid = todo.pop()
        total += _vm_rss_kib(pid)
        count += 1
        todo.extend(child for child, (parent, argv) in table.items()
                    if parent == pid and not (skip_upstream and _is_upstream(argv)))
    return total / 1024, count


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


# ---------------------------------------------------------------- sessions


def stdio_opener(argv: list[str], log: Path, env: dict[str, str] | None = None) -> Opener:
    """Open a client session on ``argv`` launched on the server core, stderr to ``log``."""
    async def open_session(stack: AsyncExitStack) -> Any:
        from mcp import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client

        command = [*PIN, *argv]
        params = StdioServerParameters(command=command[0], args=command[1:], env=env,
                                       cwd=str(log.parent))
        errlog = stack.enter_context(log.open("a"))
        read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
        return await stack.enter_async_context(ClientSession(read, write))
    return open_session


def http_opener(url: str, token: str) -> Opener:
    """Open a client session over streamable HTTP with a bearer token."""
    async def open_session(stack: AsyncExitStack) -> Any:
        import httpx2
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        http = await stack.enter_async_context(
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}))
        streams = await stack.enter_async_context(streamable_http_client(url, http_client=http))
        return await stack.enter_async_context(ClientSession(streams[0], streams[1]))
    return open_session


def sse_opener(url: str) -> Opener:
    """Open a client session over the HTTP+SSE transport."""
    async def open_session(stack: AsyncExitStack) -> Any:
        from mcp import ClientSession
        from mcp.client.sse import sse_client

        streams = await stack.enter_async_context(sse_client(url))
        return await stack.enter_async_context(ClientSession(streams[0], streams[1]))
    return open_session


def _tokens(value: Any) -> float:
    """Characters of the compact JSON of ``value`` / 4."""
    return len(json.dumps(value, separators=(",", ":"))) / 4


async def call(session: Any, target: Target) -> Any:
    """One call of the target's tool; exits with what it answered if that was an error."""
    result = await session.call_tool(target.tool, target.arguments)
    if result.is_error:
        raise SystemExit(f"{target.name}: the call failed: {result.content}")
    return result


async def first_call(target: Target) -> float:
    """Seconds from launching ``target``'s front door to its first successful call (after
    ``initialize`` and ``tools/list``); raises TimeoutError after ``START_TIMEOUT_S``."""
    if target.restart is None:  # a stdio server: launched by the client itself
        started = time.perf_counter()
        async with asyncio.timeout(START_TIMEOUT_S), AsyncExitStack() as stack:
            session = await target.opener(stack)
            await session.initialize()
            await session.list_tools()
            await call(session, target)
            return time.perf_counter() - started
    assert target.port is not None
    started = time.perf_counter()
    proc = target.restart()
    try:
        deadline = started + START_TIMEOUT_S
        while not _accepts(target.port):
            if proc.poll() is not None or time.perf_counter() > deadline:
                raise SystemExit(f"{target.name} never listened on {target.port}")
            await asyncio.sleep(0.002)
        while True:
            try:
                left_s = max(deadline - time.perf_counter(), 0.001)
                async with asyncio.timeout(left_s), AsyncExitStack() as stack:
                    session = await target.opener(stack)
                    await session.initialize()
                    await session.list_tools()
                    while True:  # the hub lists its upstream's tools once it is connected
                        result = await session.call_tool(target.tool, target.arguments)
                        if not result.is_error:
                            return time.perf_counter() - started
                        if time.perf_counter() > deadline:
                            raise SystemExit(f"{target.name}: {result.content}")
                        await asyncio.sleep(0.005)
            except Exception:  # not serving MCP yet: try again
                if time.perf_counter() > deadline:
                    raise
            await asyncio.sleep(0.005)
    finally:
        stop(proc)


async def one_round(session: Any, target: Target, calls: int, record: bool) -> None:
    """``calls`` sequential calls; with ``record``, the round's calls/s, p50 and p99."""
    latencies = []
    client0, server0 = time.process_time(), sum(tree_cpu_s(pid) for pid in target.roots)
    started = time.perf_counter()
    async with asyncio.timeout(ROUND_TIMEOUT_S):
        for _ in range(calls):
            t0 = time.perf_counter()
            await call(session, target)
            latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    target.calls += calls
    if not record:
        return
    target.client_cpu_s += time.process_time() - client0
    target.server_cpu_s += sum(tree_cpu_s(pid) for pid in target.roots) - server0
    target.recorded_calls += calls
    latencies.sort()
    target.rps.append(calls / elapsed)
    target.p50_ms.append(latencies[len(latencies) // 2] * 1e3)
    target.p99_ms.append(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3)


async def measure(targets: list[Target], calls: int, rounds: int, starts: int) -> None:
    """Rounds of calls on one session per target, RSS after 1,000 calls, then start-ups."""
    async with AsyncExitStack() as stack:
        sessions = []
        for target in targets:
            async with asyncio.timeout(START_TIMEOUT_S):
                session = await target.opener(stack)
                await session.initialize()
                tools = (await session.list_tools()).tools
            if target.tool not in {t.name for t in tools}:
                raise SystemExit(f"{target.name}: no tool {target.tool!r} in "
                                 f"{sorted(t.name for t in tools)}")
            target.list_tokens = _tokens([t.model_dump(mode="json", by_alias=True,
                                                       exclude_none=True) for t in tools])
            answer = await call(session, target)
            target.answer_tokens = _tokens(answer.model_dump(mode="json", by_alias=True,
                                                             exclude_none=True))
            target.calls += 1
            child = _child_pid(target.argv) if target.argv else None
            target.roots = [p.pid for p in target.gateway] + ([child] if child else [])
            sessions.append(session)
        for session, target in zip(sessions, targets, strict=True):
            await one_round(session, target, max(50, calls // 4), record=False)
        for _ in range(rounds):
            for session, target in zip(sessions, targets, strict=True):
                await one_round(session, target, calls, record=True)
        for session, target in zip(sessions, targets, strict=True):
            if target.calls < RSS_AFTER_CALLS:
                await one_round(session, target, RSS_AFTER_CALLS - target.calls, record=False)
            target.rss_mib, target.processes = gateway_rss(
                target.roots, skip_upstream=not target.baseline)
    for target in targets:  # served front doors start again from their folders
        if target.restart is not None:
            for proc in target.gateway:
                stop(proc)
    for _ in range(starts):
        for target in targets:
            target.start_s.append(await first_call(target))


# ---------------------------------------------------------------- set-up


def make_capd(tmp: Path, name: str, port: int | None = None) -> Server:
    """A ready daemon in ``tmp/name`` in front of its own upstream."""
    return start_capd(tmp / name, pack=PACK, caps="", config=capd_config(port))


def restart_capd(server: Server) -> Callable[[], subprocess.Popen[bytes]]:
    """A function starting ``server``'s daemon again (pinned) on the same folder and log."""
    folder = Path(server.sock).parent
    argv = [PYTHON, "-m", "capd", "serve", "--config", str(folder / "capd.toml"),
            "--socket", server.sock]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return lambda: spawn(argv, cwd=folder, env=env, log=server.log)


def create_token(server: Server) -> str:
    """A bearer token for the one capability, made with the CLI as an operator would."""
    done = subprocess.run(
        [PYTHON, "-m", "capd", "token", "create", "--allow", "time_mcp.get_current_time",
         "--json", "--socket", server.sock], capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tempfile.gettempdir())
    return str(json.loads(done.stdout)["token"])


def hub_starter(folder: Path, port: int) -> Callable[[], subprocess.Popen[bytes]]:
    """A function starting mcp-hub (pinned) with the upstream as its one stdio server."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "mcp-servers.json"
    config.write_text(json.dumps({"mcpServers": {"time": {
        "command": UPSTREAM[0], "args": UPSTREAM[1:]}}}))
    # its logs and workspace cache go to the XDG state folder: keep them in the bench's
    env = {**os.environ, "XDG_STATE_HOME": str(folder / "state"),
           "XDG_CONFIG_HOME": str(folder / "config"), "XDG_DATA_HOME": str(folder / "data")}
    argv = [shutil.which("node") or "node", str(HUB / "dist" / "cli.js"), "--port", str(port),
            "--config", str(config)]
    return lambda: spawn(argv, cwd=folder, env=env, log=folder / "hub.log")


def wait_hub(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    """Return once the hub says its upstream is connected."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health",
                                        timeout=2) as answer:
                health = json.load(answer)
            if [s.get("status") for s in health.get("servers", [])] == ["connected"]:
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"mcp-hub did not connect its upstream: "
                             f"{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)


def versions() -> str:
    found = []
    for name in ("mcp", "mcp-server-time", "fastmcp"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    if (HUB / "package.json").exists():
        found.append(f"mcp-hub {json.loads((HUB / 'package.json').read_text())['version']}")
    node = shutil.which("node")
    if node:
        done = subprocess.run([node, "--version"], capture_output=True, text=True, check=False)
        found.append(f"node {done.stdout.strip()}")
    return ", ".join(found)


def fmt(values: list[float], digits: int | None = None) -> str:
    """Median (min-max); two decimals below 100 unless ``digits`` says otherwise."""
    median, lo, hi = spread(values)
    if digits is None:
        digits = 2 if hi < 100 else 0
    return f"{median:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def report(targets: list[Target], results: Results) -> None:
    """Print the two tables and record every figure in ``results``."""
    direct = targets[0]
    width = max(len(t.name) for t in targets) + 2
    print(f"{'target':<{width}}{'calls/s':>17}{'x direct':>18}{'p50 ms':>20}"
          f"{'p99 ms':>20}{'+p50 ms':>20}{'CPU µs/call: client':>21}{'servers':>9}")
    for t in targets:
        ratios = [a / b for a, b in zip(t.rps, direct.rps, strict=True)]
        added = [a - b for a, b in zip(t.p50_ms, direct.p50_ms, strict=True)]
        print(f"{t.name:<{width}}{fmt(t.rps, 0):>17}{fmt(ratios):>18}{fmt(t.p50_ms):>20}"
              f"{fmt(t.p99_ms):>20}{fmt(added):>20}"
              f"{1e6 * t.client_cpu_s / t.recorded_calls:>21.0f}"
              f"{1e6 * t.server_cpu_s / t.recorded_calls:>9.0f}")
    print("x direct, +p50: against direct's round, round by round; CPU over the rounds, of "
          "the client and of every server-side process (upstream included)")
    print(f"\n{'target':<{width}}{'start-up ms':>20}{'RSS MiB':>10}{'procs':>7}"
          f"{'tools/list tok':>16}{'answer tok':>12}")
    for t in targets:
        rss = f"{t.rss_mib:.0f}" + ("*" if t.baseline else "")
        print(f"{t.name:<{width}}{fmt([s * 1e3 for s in t.start_s], 0):>20}{rss:>10}"
              f"{t.processes:>7}{t.list_tokens:>16.0f}{t.answer_tokens:>12.0f}")
    print(textwrap.dedent(f"""\
        start-up: spawn of the front door to its first successful call (after initialize and
          tools/list). capd mcp: the bridge alone, the daemon (holding the upstream) already
          running; capd HTTP: the daemon, which starts the upstream before it listens; FastMCP:
          the proxy, which starts the upstream at the client's initialize; mcp-hub: the hub,
          which starts the upstream; * direct: the upstream alone.
        RSS: VmRSS summed over the gateway's processes (procs), the upstream left out, after
          {max(t.calls for t in targets):,} calls; * direct: the upstream's own, for scale.
        tokens: characters / 4 of the compact JSON of the tools listed, and of one call's
          CallToolResult."""))
    for t in targets:
        p50, p99 = statistics.median(t.p50_ms), statistics.median(t.p99_ms)
        if t.baseline:
            results.add("mcp peers", f"{t.name}, calls/s, 1 client, sequential calls", t.rps,
                        "calls/s", note=f"p50 {p50:.2f} ms, p99 {p99:.2f} ms; CPU/call client "
                                        f"{1e6 * t.client_cpu_s / t.recorded_calls:.0f} µs, "
                                        f"server {1e6 * t.server_cpu_s / t.recorded_calls:.0f} µs")
        else:
            ratios = [a / b for a, b in zip(t.rps, direct.rps, strict=True)]
            added = [a - b for a, b in zip(t.p50_ms, direct.p50_ms, strict=True)]
            results.add("mcp peers", f"{t.name}, calls/s, 1 client, sequential calls", t.rps,
                        "calls/s", against=DIRECT, against_values=direct.rps,
                        note=f"round by round x direct {fmt(ratios)}; p50 {p50:.2f} ms, p99 "
                             f"{p99:.2f} ms; CPU/call client "
                             f"{1e6 * t.client_cpu_s / t.recorded_calls:.0f} µs, servers "
                             f"{1e6 * t.server_cpu_s / t.recorded_calls:.0f} µs")
            results.add("mcp peers", f"{t.name}, added p50 over direct", added, "ms",
                        note=f"p50 {p50:.2f} ms vs {statistics.median(direct.p50_ms):.2f} "
                             f"direct, round by round")
        results.add("mcp peers", f"{t.name}, start-up to the first call",
                    [s * 1e3 for s in t.start_s], "ms",
                    against="" if t.baseline else DIRECT,
                    against_values=None if t.baseline else [s * 1e3 for s in direct.start_s],
                    note=f"spawn to the first call after initialize and tools/list: "
                         f"{t.launched}")
        results.add("mcp peers", f"{t.name}, RSS after {RSS_AFTER_CALLS:,} calls", [t.rss_mib],
                    "MiB", note=f"read after {t.calls:,} calls; " + (
                        "the upstream server alone" if t.baseline
                        else f"{t.processes} gateway processes, the upstream not counted"))
        results.add("mcp peers", f"{t.name}, tools/list", [t.list_tokens], "tokens",
                    note=f"characters / 4 of its tools' JSON; one call's answer "
                         f"{t.answer_tokens:.0f} tokens")


def capd_targets(tmp: Path, started: list[subprocess.Popen[bytes]]) -> list[Target]:
    """The bridge in both modes and the HTTP front door, each on a daemon of its own."""
    targets = []
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for mode, tool, arguments in (
            ("direct", "time_mcp.get_current_time", ARGS),
            ("meta", "invoke_capability",
             {"id": "time_mcp.get_current_time", "arguments": ARGS})):
        server = make_capd(tmp, f"capd-{mode}")
        started.append(server.proc)
        argv = [PYTHON, "-m", "capd", "mcp", "--socket", server.sock, "--expose", mode]
        # the client launches the bridge against the running daemon, which stays up
        targets.append(Target(f"capd mcp --expose {mode}",
                              stdio_opener(argv, tmp / f"bridge-{mode}.log", env),
                              tool, arguments, argv=argv, gateway=[server.proc],
                              launched="the bridge alone; the daemon, holding the upstream, "
                                       "already running"))
    port = _free_port()
    http = make_capd(tmp, "capd-http", port)
    started.append(http.proc)
    targets.append(Target("capd streamable HTTP front door",
                          http_opener(f"http://127.0.0.1:{port}/mcp", create_token(http)),
                          "invoke_capability",
                          {"id": "time_mcp.get_current_time", "arguments": ARGS},
                          gateway=[http.proc], restart=restart_capd(http), port=port,
                          launched="the daemon, which starts the upstream before it listens"))
    return targets


def fastmcp_targets(tmp: Path) -> list[Target]:
    """FastMCP's proxy: its default, one shared client, and that with BM25 search."""
    (tmp / "fastmcp_proxy.py").write_text(FASTMCP_PROXY)
    targets = []
    for mode, name, tool, arguments in (
            ("default", "FastMCP proxy, default (fresh client per request)",
             "get_current_time", ARGS),
            ("shared", "FastMCP proxy, one shared client", "get_current_time", ARGS),
            ("bm25", "FastMCP proxy, shared + BM25 search, call_tool", "call_tool",
             {"name": "get_current_time", "arguments": ARGS})):
        argv = [PYTHON, str(tmp / "fastmcp_proxy.py"), mode]
        targets.append(Target(name, stdio_opener(argv, tmp / f"fastmcp-{mode}.log"), tool,
                              arguments, argv=argv,
                              launched="the proxy, which starts the upstream at initialize"))
    return targets


def hub_target(tmp: Path, started: list[subprocess.Popen[bytes]]) -> Target:
    """mcp-hub, started and its upstream connected."""
    port = _free_port()
    start_hub = hub_starter(tmp / "hub", port)
    hub = start_hub()
    started.append(hub)
    wait_hub(hub, port, tmp / "hub" / "hub.log")
    return Target("mcp-hub (HTTP+SSE)", sse_opener(f"http://127.0.0.1:{port}/mcp"),
                  "time__get_current_time", ARGS, gateway=[hub], restart=start_hub, port=port,
                  launched="the hub, which starts the upstream")


def main() -> None:
    parser = argparse.ArgumentParser()
    # 50 warm-up calls, then 5 x 190: the RSS is read after the rounds' own calls
    parser.add_argument("--calls", type=int, default=190, help="calls per round and target")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--starts", type=int, default=3, help="start-ups per target")
    parser.add_argument("--results", type=Path, default=None)
    args = parser.parse_args()
    results = Results(args.results)
    tmp = Path(tempfile.mkdtemp(prefix="capd-mcp-peers-", dir="/tmp"))
    started: list[subprocess.Popen[bytes]] = []
    skipped: list[str] = []
    try:
        targets = [Target(DIRECT, stdio_opener(UPSTREAM, tmp / "direct.log"),
                          "get_current_time", ARGS, argv=UPSTREAM, baseline=True,
                          launched="the upstream alone")]
        targets += capd_targets(tmp, started)
        if installed("fastmcp"):
            targets += fastmcp_targets(tmp)
        else:
            skipped.append("FastMCP: not installed (pip install 'fastmcp>=4.2', in the bench "
                           "extra)")
        if shutil.which("node") is None:
            skipped.append("mcp-hub: node is not on PATH")
        elif not (HUB / "dist" / "cli.js").exists():
            skipped.append("mcp-hub: not installed (npm ci --prefix bench/npm)")
        else:
            targets.append(hub_target(tmp, started))

        pin(GENERATOR_CPUS)  # the client on a core of its own; the servers on SERVER_CPUS
        print(f"MCP gateways on one upstream (mcp-server-time get_current_time), the SDK client "
              f"on core(s) {GENERATOR_CPUS}, every server process on core(s) {SERVER_CPUS} "
              f"({CPUS} cores); {args.rounds} interleaved rounds of {args.calls} sequential "
              f"calls per target, {args.starts} start-ups each")
        print(versions())
        for line in skipped:
            print(f"skipped: {line}")
        uvloop.run(measure(targets, args.calls, args.rounds, args.starts))
        report(targets, results)
    finally:
        for proc in started:
            stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
