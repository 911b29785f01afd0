"""Dispatch throughput and latency of `POST /call/{name}` over the Unix socket.

Starts, in the same run, a bare aiohttp handler on a Unix socket under uvloop
(the baseline) and two real daemons (`capd serve`) on a no-op capability: one
with no policy at all, one with the whole policy pipeline on (a before-hook and
an after-hook on every call, the capability behind a consent grant, loop
detection counting every call of a session, each client connection its own
session, thresholds out of reach so nothing is refused). All are driven by the
same raw keep-alive HTTP/1.1 client (pre-built request bytes, minimal parsing,
uvloop) with 1 and 32 concurrent connections, in interleaved rounds of a fixed
time each. Prints the median calls/s with the spread over rounds, p50/p99 of
the median round, and the ratios capd / bare and policy / no policy. Then
measures /health latency while full reloads whose probes take 2 s run back to
back.

    python bench/dispatch.py [--seconds 5] [--rounds 3]
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
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import uvloop

BARE_SERVER = textwrap.dedent('''
    import asyncio, json, sys, uvloop
    from aiohttp import web

    async def call(request):
        await request.read()
        return web.Response(text=json.dumps({"status": "success", "result": None}),
                            content_type="application/json")

    async def main():
        app = web.Application()
        app.router.add_post("/call/{name}", call)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.UnixSite(runner, sys.argv[1]).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())
''')

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


class Conn(asyncio.Protocol):
    """One keep-alive connection: send a request, wait for one full response."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.waiter: asyncio.Future[int] | None = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None:
            return
        head = bytes(self.buf[:end]).lower()
        start = head.find(b"content-length:")
        length = int(head[start + 15:head.find(b"\r\n", start) if head.find(b"\r\n", start) > 0
                          else len(head)]) if start >= 0 else 0
        total = end + 4 + length
        if len(self.buf) >= total:
            status = int(self.buf[9:12])
            del self.buf[:total]
            waiter, self.waiter = self.waiter, None
            waiter.set_result(status)

    async def send(self, transport: asyncio.Transport, payload: bytes) -> int:
        self.waiter = asyncio.get_running_loop().create_future()
        transport.write(payload)
        return await self.waiter


async def drive(sock: str, payload: bytes | list[bytes], clients: int,
                seconds: float) -> tuple[int, list[float]]:
    """``clients`` connections, each sending its payload (one for all, or one each)."""
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def worker(index: int) -> None:
        nonlocal errors
        mine = payload[index] if isinstance(payload, list) else payload
        transport, proto = await loop.create_unix_connection(Conn, sock)
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            status = await proto.send(transport, mine)  # type: ignore[arg-type]
            latencies.append(time.perf_counter() - started)
            if status != 200:
                errors += 1
        transport.close()

    await asyncio.gather(*(worker(i) for i in range(clients)))
    if errors:
        raise SystemExit(f"{errors} non-200 answers from {sock}")
    return len(latencies), latencies


def request_bytes(path: str, body: bytes = b"", headers: bytes = b"") -> bytes:
    method = b"POST" if body else b"GET"
    return (method + b" " + path.encode() + b" HTTP/1.1\r\nHost: capd\r\n" + headers
            + b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
            + b"\r\n\r\n" + body)


def measure(sock: str, clients: int, seconds: float, sessions: bool = False
            ) -> dict[str, float]:
    payload: bytes | list[bytes] = request_bytes("/call/bench.noop", b"{}")
    if sessions:  # each connection its own agent session, as capd mcp does
        payload = [request_bytes("/call/bench.noop", b"{}", b"Capd-Session: bench-%d\r\n" % i)
                   for i in range(clients)]
    uvloop.run(drive(sock, payload, clients, 0.5))  # warm-up
    count, lat = uvloop.run(drive(sock, payload, clients, seconds))
    lat.sort()
    return {"rps": count / seconds, "p50_us": lat[len(lat) // 2] * 1e6,
            "p99_us": lat[int(len(lat) * 0.99)] * 1e6, "n": count}


def wait_line(proc: subprocess.Popen[str], needle: str) -> None:
    """Read ``proc``'s stdout until a line holds ``needle`` (the bare server's start line)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if needle in line:
            return
    raise SystemExit(f"process exited before printing {needle!r}")


def wait_ready(log: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while b'"event":"ready"' not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"capd did not become ready; log: {log.read_text()[-2000:]}")
        time.sleep(0.05)


def health_during_reloads(sock: str, flag: Path, seconds: float) -> dict[str, float]:
    from capd.sidecar.client._client import request

    flag.touch()
    stop = threading.Event()
    reloads = 0

    def reloader() -> None:
        nonlocal reloads
        while not stop.is_set():
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
    stop.set()
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
    the same server with the official SDK client over stdio."""
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
        lat.sort()
        return lat[len(lat) // 2] * 1e3

    async def direct(session: ClientSession) -> float:
        lat = []
        for _ in range(calls):
            started = time.perf_counter()
            result = await session.call_tool("get_current_time", {"timezone": "UTC"})
            lat.append(time.perf_counter() - started)
            if result.is_error:
                raise SystemExit(f"direct call failed: {result}")
        lat.sort()
        return lat[len(lat) // 2] * 1e3

    async def run() -> tuple[list[float], list[float]]:
        params = StdioServerParameters(command=sys.executable, args=[
            "-m", "mcp_server_time", "--local-timezone", "UTC"])
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


def start_capd(folder: Path, config: str, caps: str, env: dict[str, str]
               ) -> tuple[subprocess.Popen[bytes], str, Path]:
    folder.mkdir()
    (folder / "bench_pack.py").write_text(PACK)
    (folder / "caps.toml").write_text(caps)
    (folder / "capd.toml").write_text(f'state_dir = "{folder}/state"\n' + CONFIG + config)
    sock = str(folder / "capd.sock")
    # The daemon logs one line per call to a file, as it would to journald: a pipe
    # drained by this process would steal CPU from the load generator.
    log = folder / "capd.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "capd", "serve", "--config",
                                 str(folder / "capd.toml"), "--socket", sock],
                                stdout=out, env=env)
    return proc, sock, log


def main() -> None:
    from capd.sidecar.client._client import request

    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="capd-bench-", dir="/tmp"))
    (tmp / "bare.py").write_text(BARE_SERVER)
    flag = tmp / "slow"
    env = {**os.environ, "BENCH_SLOW_FLAG": str(flag)}
    upstream = UPSTREAM.format(python=sys.executable)
    capd, capd_sock, capd_log = start_capd(tmp / "plain", NO_POLICY + upstream, CAPS, env)
    guarded_caps = CAPS + 'consent_operations = ["bench.run"]\n'
    policy, policy_sock, policy_log = start_capd(tmp / "policy", POLICY, guarded_caps, env)
    bare_sock = str(tmp / "bare.sock")
    bare = subprocess.Popen([sys.executable, str(tmp / "bare.py"), bare_sock],
                            stdout=subprocess.PIPE, text=True)
    try:
        wait_ready(capd_log, capd)
        wait_ready(policy_log, policy)
        wait_line(bare, "ready")
        grant = request(Path(policy_sock), "POST", "/consent",
                        body={"operations": ["bench.run"], "ttl": "1d"})
        if grant.status != 200:
            raise SystemExit(f"consent grant failed: {grant.body}")
        print(f"dispatch bench, {os.cpu_count()} cores, {args.rounds} interleaved rounds of "
              f"{args.seconds:g} s per figure, raw keep-alive HTTP/1.1 client over the Unix "
              "socket")
        print(f"{'server':<34}{'clients':>8}{'calls/s':>10}{'spread':>16}{'p50 µs':>9}"
              f"{'p99 µs':>9}")
        servers = (("bare aiohttp (baseline)", bare_sock, False),
                   ("capd POST /call, no policy", capd_sock, False),
                   ("capd POST /call, full policy", policy_sock, True))
        results: dict[tuple[str, int], list[dict[str, float]]] = {}
        for clients in (1, 32):
            for _ in range(args.rounds):
                for name, sock, sessions in servers:
                    results.setdefault((name, clients), []).append(
                        measure(sock, clients, args.seconds, sessions))
            for name, _sock, _sessions in servers:
                rounds = sorted(results[(name, clients)], key=lambda r: r["rps"])
                mid = rounds[len(rounds) // 2]
                spread = f"{rounds[0]['rps']:.0f}-{rounds[-1]['rps']:.0f}"
                print(f"{name:<34}{clients:>8}{mid['rps']:>10.0f}{spread:>16}"
                      f"{mid['p50_us']:>9.0f}{mid['p99_us']:>9.0f}")

        def median(name: str, clients: int) -> float:
            rounds = sorted(r["rps"] for r in results[(name, clients)])
            return rounds[len(rounds) // 2]

        for clients in (1, 32):
            bare_rps = median("bare aiohttp (baseline)", clients)
            plain_rps = median("capd POST /call, no policy", clients)
            policy_rps = median("capd POST /call, full policy", clients)
            print(f"{clients:>2} client(s): capd / bare aiohttp {plain_rps / bare_rps:.2f}; "
                  f"full policy / no policy {policy_rps / plain_rps:.2f} "
                  f"(the pipeline costs {100 * (1 - policy_rps / plain_rps):.0f} % of calls/s)")
        capd_p50, sdk_p50 = upstream_rows(capd_sock, 200, args.rounds)
        capd_mid, sdk_mid = sorted(capd_p50)[len(capd_p50) // 2], sorted(sdk_p50)[
            len(sdk_p50) // 2]
        print(f"upstream MCP tool (mcp-server-time get_current_time), 200 sequential calls "
              f"x {args.rounds} rounds: through capd p50 {capd_mid:.2f} ms "
              f"({min(capd_p50):.2f}-{max(capd_p50):.2f}); SDK client straight to the server "
              f"p50 {sdk_mid:.2f} ms ({min(sdk_p50):.2f}-{max(sdk_p50):.2f}); capd adds "
              f"{capd_mid - sdk_mid:.2f} ms")
        health = health_during_reloads(capd_sock, flag, args.seconds)
        print(f"/health during back-to-back reloads with 2 s probes: n={health['n']} "
              f"p50 {health['p50_ms']:.2f} ms  p99 {health['p99_ms']:.2f} ms "
              f"({health['reloads']} reloads)")
    finally:
        for proc in (capd, policy, bare):
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        lines = len(capd_log.read_bytes().splitlines())
        print(f"capd log lines written during the run (no-policy daemon): {lines}")


if __name__ == "__main__":
    main()
