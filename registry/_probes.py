"""Tool probes: one coroutine per probe kind, each under its own timeout.

A probe never raises for a tool that is down: it returns a :class:`ProbeResult`
with ``ok=False`` and the reason. It never blocks the event loop: commands run
through ``asyncio.create_subprocess_exec``, HTTP and sockets through asyncio
streams, a plain Python probe on an executor. Cancellation
propagates.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib
import inspect
import os
import re
import shutil
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor
from functools import partial
from typing import Protocol
from urllib.parse import quote, unquote, urlsplit

from ._model import (
    CommandProbe,
    HttpProbe,
    McpProbe,
    PathProbe,
    ProbeResult,
    PythonProbe,
    TcpProbe,
    ToolSpec,
    UnixProbe,
)
from ._outcomes import USER_CODE_FAILURES
from ._upstream_session import Upstream, UpstreamError, UpstreamPool

Clock = Callable[[], float]


class Probe(Protocol):
    """Anything that can probe one tool. Tests replace it at this seam."""

    def __call__(self, tool: str, spec: ToolSpec) -> Awaitable[ProbeResult]: ...


class ProbeFailed(Exception):
    """Internal: the tool answered, but not as expected."""


def _find_program(program: str) -> bool:
    return shutil.which(program) is not None or os.path.isfile(program)


async def _probe_command(spec: CommandProbe) -> None:
    program = spec.which if spec.which is not None else (spec.argv or ("",))[0]
    # PATH lookups touch the disk: keep them off the loop.
    if not await asyncio.to_thread(_find_program, program):
        raise ProbeFailed(f"{program!r} not found on PATH")
    if spec.argv is None:
        return
    proc = await asyncio.create_subprocess_exec(
        *spec.argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    try:
        _, stderr = await proc.communicate()
    except BaseException:
        # Timeout or cancellation: never leave the child behind.
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await asyncio.shield(proc.wait())
        raise
    if proc.returncode != 0:
        tail = stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        command = " ".join(spec.argv)
        raise ProbeFailed(f"{command!r} exited {proc.returncode}: {tail[0]}".rstrip(": "))


async def _probe_http(spec: HttpProbe) -> None:
    status = await http_status(spec.method, spec.url)
    if status != spec.expect_status:
        raise ProbeFailed(f"{spec.method} {spec.url} answered {status}, "
                          f"expected {spec.expect_status}")


_URL_SAFE = "/%?=&:@!$'()*+,;~-._"


def _idna(host: str) -> str:
    """``host`` as the Host header carries it: an international name in IDNA form."""
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:  # an IP address or a name IDNA refuses: as written
        return host


_STATUS_LINE = re.compile(rb"HTTP/\d(?:\.\d)? (\d{3})[ \r\n]")
_tls: ssl.SSLContext | None = None


def _tls_context() -> ssl.SSLContext:
    """The system's CA bundle, verified, made once (reading it costs tens of ms)."""
    global _tls
    if _tls is None:
        _tls = ssl.create_default_context()
    return _tls


async def http_status(method: str, url: str) -> int:
    """The status code ``method url`` answers: HTTP/1.1, no redirect followed, the body
    left unread, the connection closed. A plain asyncio exchange: a probe needs no more,
    and an HTTP client library costs a tenth of a second to import at start-up.

    Raises :class:`ProbeFailed` when nothing can be reached or the answer is not HTTP.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    try:
        reader, writer = await asyncio.open_connection(
            host, port, ssl=_tls_context() if tls else None,
            server_hostname=host if tls else None)
    except OSError as exc:
        raise ProbeFailed(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from exc
    try:
        # What is not ASCII in the path or query is percent-encoded (an encoded one kept),
        # and the host name goes as IDNA, as an HTTP client library would send them.
        target = quote(parts.path or "/", safe=_URL_SAFE) + (
            f"?{quote(parts.query, safe=_URL_SAFE)}" if parts.query else "")
        netloc = parts.netloc.rpartition("@")[2]
        host_header = netloc.replace(host, _idna(host), 1) if host else netloc
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host_header}",
                 "User-Agent: capd-probe", "Accept: */*", "Connection: close"]
        if parts.username is not None:  # user:password@ in the URL, as a client would send
            token = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            lines.append(f"Authorization: Basic {base64.b64encode(token.encode()).decode()}")
        if method == "POST":
            lines.append("Content-Length: 0")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        status_line = await reader.readline()
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
    found = _STATUS_LINE.match(status_line)
    if found is None:
        raise ProbeFailed(f"{method} {url} closed the connection without answering"
                          if not status_line else
                          f"{method} {url} did not answer HTTP (it sent {status_line[:40]!r})")
    return int(found.group(1))


async def _probe_tcp(spec: TcpProbe) -> None:
    _, writer = await asyncio.open_connection(spec.host, spec.port)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


async def _probe_unix(spec: UnixProbe) -> None:
    # On Linux a non-blocking connect to a Unix listener whose backlog is full
    # fails with EAGAIN and is *not* in progress (asyncio would then report a
    # false success), so retry with a short back-off until the probe's timeout.
    delay = 0.01
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        while True:
            try:
                sock.connect(spec.path)
            except BlockingIOError:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.2)
                continue
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                why = "no such socket" if isinstance(exc, FileNotFoundError) else (
                    "connection refused")
                raise ProbeFailed(f"nothing listens on {spec.path} ({why})") from exc
            return


def _check_path(spec: PathProbe) -> None:
    path = spec.path
    if not os.path.exists(path):
        raise ProbeFailed(f"{path} does not exist")
    if spec.must_be == "dir" and not os.path.isdir(path):
        raise ProbeFailed(f"{path} is not a folder")
    if spec.must_be == "file" and not os.path.isfile(path):
        raise ProbeFailed(f"{path} is not a file")
    if spec.writable and not os.access(path, os.W_OK):
        raise ProbeFailed(f"{path} is not writable")


def _is_coroutine_function(target: object) -> bool:
    # A callable object whose __call__ is async counts too.
    call = type(target).__call__ if not inspect.isroutine(target) else None
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(call)


async def _probe_python(spec: PythonProbe, executor: Executor | None) -> None:
    module_name, _, attr_path = spec.target.partition(":")
    loop = asyncio.get_running_loop()
    module = await loop.run_in_executor(executor, importlib.import_module, module_name)
    target: object = module
    for part in attr_path.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise ProbeFailed(f"{spec.target} is not callable")
    if _is_coroutine_function(target):
        outcome = await target()
    else:  # a plain probe may block: never on the loop (the probe's timeout still holds)
        outcome = await loop.run_in_executor(executor, target)
        if inspect.isawaitable(outcome):
            outcome = await outcome
    if outcome is False:
        raise ProbeFailed(f"{spec.target} returned False")


async def _probe_mcp(tool: str, spec: McpProbe, upstreams: UpstreamPool | None) -> None:
    """The daemon's session (handshake or ping), or a one-off handshake without a pool."""
    try:
        if upstreams is not None:
            await upstreams.get(tool, spec).probe()
            return
        once = Upstream(tool, spec, lambda _t: None)
        try:
            await once.ensure()
        finally:
            await once.close()
    except UpstreamError as exc:
        raise ProbeFailed(f"MCP server: {exc}") from exc


async def run_probe(
    tool: str, spec: ToolSpec, *, executor: Executor | None = None,
    upstreams: UpstreamPool | None = None, clock: Clock = time.time,
    monotonic: Clock = time.perf_counter,
) -> ProbeResult:
    """Probe ``tool`` once under ``spec.timeout_s`` and return what was found.

    A plain (non-async) Python probe runs on ``executor`` (the loop's default
    when None), never on the event loop. Never raises for a failing tool;
    re-raises cancellation.
    """
    started = monotonic()
    error: str | None = None
    try:
        async with asyncio.timeout(spec.timeout_s):
            match spec:
                case CommandProbe():
                    await _probe_command(spec)
                case HttpProbe():
                    await _probe_http(spec)
                case TcpProbe():
                    await _probe_tcp(spec)
                case UnixProbe():
                    await _probe_unix(spec)
                case PathProbe():
                    await asyncio.to_thread(_check_path, spec)
                case PythonProbe():
                    await _probe_python(spec, executor)
                case McpProbe():
                    await _probe_mcp(tool, spec, upstreams)
    except TimeoutError:
        error = f"timed out after {spec.timeout_s:g}s"
    except ProbeFailed as exc:
        error = str(exc)
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc.strerror or exc}"
    except USER_CODE_FAILURES as exc:  # a probe reports any failure of the tool as data
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return ProbeResult(tool=tool, ok=error is None, latency_s=monotonic() - started,
                       error=error, checked_at=clock())


async def probe_all(
    specs: Mapping[str, ToolSpec], *, probe: Probe | None = None,
    executor: Executor | None = None, upstreams: UpstreamPool | None = None,
) -> dict[str, ProbeResult]:
    """Probe every tool in ``specs`` once, all at the same time.

    The whole batch costs about the slowest probe, not the sum. With no
    ``probe`` given, the real probes run, plain Python probes on ``executor``.
    """
    run = probe or partial(run_probe, executor=executor, upstreams=upstreams)
    results = await asyncio.gather(*(run(tool, spec) for tool, spec in specs.items()))
    return {r.tool: r for r in results}
