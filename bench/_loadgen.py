"""The one load generator every dispatch figure uses: bench/loadgen.c, or a Python fallback.

:func:`load` drives one server over its Unix socket with ``connections``
keep-alive HTTP/1.1 connections, closed loop (each connection waits for its
answer before sending the next request), for ``seconds`` after a warm-up, and
returns a :class:`Load`. It runs bench/loadgen.c, compiled with ``cc -O2`` on
first use into a cache folder outside the repository (keyed by the source's
hash). Where no C compiler works it falls back to a multi-process Python
generator (raw sockets on uvloop, pre-built request bytes); :data:`KIND` says
which one is in use, and every figure of a run comes from the same one.

The generator runs pinned to a core of its own, the server to another (see
``_harness``); its own CPU use over the measured window is reported as
``generator_cpu_pct`` (of its core), which shows that it was not the limit.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import multiprocessing
import os
import resource
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench._harness import GENERATOR_CPUS, pin

SOURCE = Path(__file__).resolve().parent / "loadgen.c"


@dataclass(frozen=True)
class Load:
    """One load run: answers in the window, their rate and latency, and what went wrong."""

    requests: int
    rps: float
    p50_us: float
    p99_us: float
    non_2xx: int
    errors: int
    generator_cpu_pct: float


def _compiled() -> Path | None:
    """The compiled generator (built now if needed), or None when it cannot be built."""
    if os.environ.get("BENCH_PY_LOADGEN") or shutil.which("cc") is None:
        return None
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    binary = Path(tempfile.gettempdir()) / "capd-bench" / f"loadgen-{digest}"
    if binary.exists():
        return binary
    binary.parent.mkdir(exist_ok=True)
    tmp = binary.with_suffix(f".{os.getpid()}")
    build = subprocess.run(["cc", "-O2", "-o", str(tmp), str(SOURCE)], capture_output=True,
                           text=True, check=False)
    if build.returncode != 0:
        print(f"note: cc could not build bench/loadgen.c, using the Python generator:\n"
              f"{build.stderr[-1000:]}")
        return None
    tmp.replace(binary)
    return binary


BINARY = _compiled()
KIND = ("C (bench/loadgen.c, epoll, 1 thread)" if BINARY is not None
        else "Python (multi-process, raw sockets on uvloop)")


def request_bytes(method: str, path: str, body: str, header: str = "") -> bytes:
    """The request the generator sends (the C one builds the same bytes)."""
    return (f"{method} {path} HTTP/1.1\r\nHost: bench\r\n{header}"
            f"Content-Type: application/json\r\nContent-Length: {len(body.encode())}\r\n\r\n"
            f"{body}").encode()


def load(sock: str, *, connections: int, seconds: float, warmup_s: float = 0.5,
         method: str = "POST", path: str = "/", body: str = "{}",
         per_connection_header: str | None = None) -> Load:
    """Drive ``sock`` and return what came back; raises SystemExit if the generator failed.

    ``per_connection_header`` is a header line with ``%d`` for the connection's
    index (``"Capd-Session: bench-%d"``).
    """
    if BINARY is None:
        return _python_load(sock, connections, seconds, warmup_s, method, path, body,
                            per_connection_header)
    argv = [str(BINARY), "-u", sock, "-c", str(connections), "-d", str(seconds),
            "-w", str(warmup_s), "-m", method, "-p", path, "-b", body]
    if per_connection_header:
        argv += ["-S", per_connection_header]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + warmup_s + 30,
                          preexec_fn=(lambda: pin(GENERATOR_CPUS)) if GENERATOR_CPUS else None,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"loadgen failed on {sock}: {done.stderr.strip()}")
    out = json.loads(done.stdout)
    return Load(requests=out["requests"], rps=out["rps"], p50_us=out["p50_us"],
                p99_us=out["p99_us"], non_2xx=out["non_2xx"],
                errors=out["errors"] + out["unanswered"], generator_cpu_pct=out["cpu_pct"])


# ------------------------------------------------------------ the Python fallback


class _Conn(asyncio.Protocol):
    """One keep-alive connection: send a request, wait for one whole answer (Content-Length)."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.waiter: asyncio.Future[int] | None = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None:
            return
        head = bytes(self.buf[:end]).lower()
        at = head.find(b"content-length:")
        stop = head.find(b"\r\n", at)
        length = int(head[at + 15:stop if stop > 0 else len(head)]) if at >= 0 else 0
        total = end + 4 + length
        if len(self.buf) >= total:
            status = int(self.buf[9:12])
            del self.buf[:total]
            waiter, self.waiter = self.waiter, None
            waiter.set_result(status)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("server closed the connection"))


async def _drive(sock: str, payloads: list[bytes], measure_at: float, stop_at: float
                 ) -> tuple[list[float], int, int]:
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    non_2xx = errors = 0

    async def worker(payload: bytes) -> None:
        nonlocal non_2xx, errors
        transport, proto = await loop.create_unix_connection(_Conn, sock)
        try:
            while (started := time.monotonic()) < stop_at:
                proto.waiter = loop.create_future()
                transport.write(payload)
                try:
                    status = await asyncio.wait_for(proto.waiter, stop_at + 2 - started)
                except (ConnectionError, TimeoutError):
                    errors += 1
                    return
                done = time.monotonic()
                if started >= measure_at and done <= stop_at:
                    latencies.append(done - started)
                    non_2xx += not 200 <= status < 300
        finally:
            transport.close()

    await asyncio.gather(*(worker(p) for p in payloads))
    return latencies, non_2xx, errors


def _worker(sock: str, payloads: list[bytes], measure_at: float, stop_at: float,
            out: multiprocessing.Queue[tuple[list[float], int, int, float]]) -> None:
    import uvloop

    pin(GENERATOR_CPUS)
    before = resource.getrusage(resource.RUSAGE_SELF)
    latencies, non_2xx, errors = uvloop.run(_drive(sock, payloads, measure_at, stop_at))
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out.put((latencies, non_2xx, errors, cpu))


def _python_load(sock: str, connections: int, seconds: float, warmup_s: float, method: str,
                 path: str, body: str, per_connection_header: str | None) -> Load:
    payloads = [request_bytes(method, path, body,
                              (per_connection_header % i + "\r\n") if per_connection_header
                              else "") for i in range(connections)]
    processes = min(connections, 2)
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[tuple[list[float], int, int, float]] = ctx.Queue()
    start = time.monotonic() + 0.2  # every process connects before the clock starts
    measure_at, stop_at = start + warmup_s, start + warmup_s + seconds
    workers = [ctx.Process(target=_worker, args=(sock, payloads[i::processes], measure_at,
                                                  stop_at, out)) for i in range(processes)]
    for w in workers:
        w.start()
    results = [out.get(timeout=seconds + warmup_s + 30) for _ in workers]
    for w in workers:
        w.join(10)
    latencies = sorted(x for r in results for x in r[0])
    if not latencies:
        raise SystemExit(f"the Python generator got no answer from {sock}")
    return Load(requests=len(latencies), rps=len(latencies) / seconds,
                p50_us=latencies[len(latencies) // 2] * 1e6,
                p99_us=latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e6,
                non_2xx=sum(r[1] for r in results), errors=sum(r[2] for r in results),
                generator_cpu_pct=100 * sum(r[3] for r in results) / (seconds + warmup_s))
