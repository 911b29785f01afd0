"""Every probe kind passing, failing and timing out, against real things."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from capd.registry import (
    CommandProbe,
    HttpProbe,
    PathProbe,
    PythonProbe,
    TcpProbe,
    UnixProbe,
    probe_all,
    run_probe,
)
from tests.helpers.servers import HttpServer


async def test_command_which_passes_for_a_program_on_path() -> None:
    """`which` finds a real program on PATH."""
    result = await run_probe("sh", CommandProbe(which="sh"))
    assert result.ok, result.error
    assert result.tool == "sh"
    assert result.checked_at == pytest.approx(time.time(), abs=5)


async def test_command_which_fails_for_a_missing_program() -> None:
    """A program absent from PATH fails with its name in the error."""
    result = await run_probe("x", CommandProbe(which="capd-no-such-program"))
    assert not result.ok
    assert result.error == "'capd-no-such-program' not found on PATH"


async def test_command_argv_passes_on_exit_zero() -> None:
    """A command that exits 0 passes."""
    result = await run_probe("t", CommandProbe(argv=("sh", "-c", "exit 0")))
    assert result.ok, result.error


async def test_command_argv_fails_with_exit_code_and_stderr() -> None:
    """A non-zero exit fails and reports the code and the last stderr line."""
    result = await run_probe("t", CommandProbe(argv=("sh", "-c", "echo broken >&2; exit 3")))
    assert not result.ok
    assert result.error == "'sh -c echo broken >&2; exit 3' exited 3: broken"


async def test_command_argv_times_out_and_the_child_is_killed(tmp_path: Path) -> None:
    """A hung command times out and is killed, not left running."""
    pidfile = tmp_path / "pid"
    spec = CommandProbe(argv=("sh", "-c", f"echo $$ > {pidfile}; exec sleep 30"), timeout_s=0.5)
    result = await run_probe("t", spec)
    assert not result.ok
    assert result.error == "timed out after 0.5s"
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_http_passes_on_expected_status(http_server: HttpServer) -> None:
    """A real HTTP server answering 200 passes."""
    result = await run_probe("web", HttpProbe(url=f"{http_server.url}/health"))
    assert result.ok, result.error
    assert http_server.hits == 1


async def test_http_fails_on_other_status(http_server: HttpServer) -> None:
    """A 503 fails and says what it got and what it expected."""
    http_server.healthy = False
    result = await run_probe("web", HttpProbe(url=f"{http_server.url}/health"))
    assert not result.ok
    assert result.error == f"GET {http_server.url}/health answered 503, expected 200"


async def test_http_fails_when_nothing_listens(free_port: int) -> None:
    """A closed port fails as a connection error naming host and port."""
    result = await run_probe("web", HttpProbe(url=f"http://127.0.0.1:{free_port}/"))
    assert not result.ok
    assert result.error is not None
    assert result.error.startswith(f"cannot connect to 127.0.0.1:{free_port}")


class _RawHttp:
    """A TCP server on 127.0.0.1 that records the request head and answers ``reply``."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.heads: list[bytes] = []
        self.port = 0

    async def __aenter__(self) -> _RawHttp:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.heads.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(self.reply)
            await writer.drain()
            writer.close()

        self._server = await asyncio.start_server(serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()


async def test_http_sends_one_plain_request_and_follows_no_redirect() -> None:
    """The request is HTTP/1.1 with Host, credentials from the URL as Basic auth, an empty
    body for POST; a redirect is a status like any other."""
    async with _RawHttp(b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\n\r\n") as server:
        url = f"http://probe:s%40cret@127.0.0.1:{server.port}/health?deep=1"
        moved = await run_probe("web", HttpProbe(url=url, method="POST"))
        assert moved.error == f"POST {url} answered 302, expected 200"
        passes = await run_probe("web", HttpProbe(url=url, expect_status=302))
        assert passes.ok, passes.error
    head = server.heads[0].decode()
    assert head.startswith("POST /health?deep=1 HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}\r\n" in head
    assert "Authorization: Basic cHJvYmU6c0BjcmV0\r\n" in head  # probe:s@cret
    assert "Content-Length: 0\r\n" in head
    assert "Content-Length" not in server.heads[1].decode()


async def test_http_encodes_what_is_not_ascii_and_says_when_nothing_came_back() -> None:
    async with _RawHttp(b"HTTP/1.1 200 OK\r\n\r\n") as server:
        url = f"http://127.0.0.1:{server.port}/notes/caf\u00e9 \u4e16?q=a b&r=%2F"
        result = await run_probe("web", HttpProbe(url=url))
        assert result.ok, result.error
    assert server.heads[0].startswith(b"GET /notes/caf%C3%A9%20%E4%B8%96?q=a%20b&r=%2F HTTP/1.1")
    async with _RawHttp(b"") as silent:
        closed = await run_probe("web", HttpProbe(url=f"http://127.0.0.1:{silent.port}/"))
    assert closed.error == (f"GET http://127.0.0.1:{silent.port}/ closed the connection "
                            "without answering")


async def test_http_fails_when_the_answer_is_not_http() -> None:
    async with _RawHttp(b"SSH-2.0-OpenSSH_9.2\r\n") as server:
        result = await run_probe("web", HttpProbe(url=f"http://127.0.0.1:{server.port}/"))
    assert result.error == (f"GET http://127.0.0.1:{server.port}/ did not answer HTTP "
                            "(it sent b'SSH-2.0-OpenSSH_9.2\\r\\n')")


async def test_http_times_out(http_server: HttpServer) -> None:
    """A server that never answers times out."""
    result = await run_probe("web", HttpProbe(url=f"{http_server.url}/slow", timeout_s=0.3))
    assert not result.ok
    assert result.error == "timed out after 0.3s"


async def test_tcp_passes_when_listening(http_server: HttpServer) -> None:
    """A listening TCP port passes."""
    result = await run_probe("db", TcpProbe(port=http_server.port))
    assert result.ok, result.error


async def test_tcp_fails_when_closed(free_port: int) -> None:
    """A closed TCP port fails."""
    result = await run_probe("db", TcpProbe(port=free_port))
    assert not result.ok
    assert result.error is not None
    assert "Connection refused" in result.error or "Connect call failed" in result.error


@contextlib.contextmanager
def full_backlog(family: int, address: object) -> Iterator[object]:
    """A listener that never accepts, its backlog filled so a new connect cannot complete."""
    listener = socket.socket(family)
    listener.bind(address)
    listener.listen(0)
    bound = listener.getsockname()
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket(family)
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(bound)
            fillers.append(filler)
        yield bound
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


async def test_tcp_times_out_on_a_full_backlog() -> None:
    """A listener whose accept queue is full never completes the handshake: timeout."""
    with full_backlog(socket.AF_INET, ("127.0.0.1", 0)) as bound:
        port = bound[1]  # type: ignore[index]
        result = await run_probe("db", TcpProbe(port=port, timeout_s=0.3))
    assert not result.ok
    assert result.error == "timed out after 0.3s"


async def test_unix_passes_when_listening(short_tmp: Path) -> None:
    """A listening Unix socket passes."""
    path = short_tmp / "tool.sock"
    server = await asyncio.start_unix_server(lambda r, w: w.close(), path=str(path))
    async with server:
        result = await run_probe("sock", UnixProbe(path=str(path)))
    assert result.ok, result.error


async def test_unix_fails_when_absent(short_tmp: Path) -> None:
    """A socket path with nothing there fails."""
    result = await run_probe("sock", UnixProbe(path=str(short_tmp / "none.sock")))
    assert not result.ok
    assert result.error is not None
    assert result.error == f"nothing listens on {short_tmp / 'none.sock'} (no such socket)"


async def test_unix_times_out_on_a_full_backlog(short_tmp: Path) -> None:
    """A Unix listener that never accepts and whose backlog is full: timeout."""
    path = str(short_tmp / "full.sock")
    with full_backlog(socket.AF_UNIX, path):
        result = await run_probe("sock", UnixProbe(path=path, timeout_s=0.3))
    assert not result.ok
    assert result.error == "timed out after 0.3s"


async def test_path_passes_for_a_writable_folder(tmp_path: Path) -> None:
    """An existing writable folder passes a dir+writable probe."""
    result = await run_probe("vault", PathProbe(path=str(tmp_path), must_be="dir", writable=True))
    assert result.ok, result.error


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("missing", "does not exist"), ("file-as-dir", "is not a folder"),
     ("dir-as-file", "is not a file")],
)
async def test_path_fails(tmp_path: Path, kind: str, expected: str) -> None:
    """A missing path, or one of the wrong kind, fails with the reason."""
    (tmp_path / "f").write_text("x")
    spec = {
        "missing": PathProbe(path=str(tmp_path / "nope")),
        "file-as-dir": PathProbe(path=str(tmp_path / "f"), must_be="dir"),
        "dir-as-file": PathProbe(path=str(tmp_path), must_be="file"),
    }[kind]
    result = await run_probe("p", spec)
    assert not result.ok
    assert result.error is not None
    assert expected in result.error


async def test_path_fails_when_not_writable(tmp_path: Path) -> None:
    """A read-only folder fails a writable probe (checked as an unprivileged uid)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        if os.geteuid() == 0:
            # root may write anywhere; check the probe's logic with a path that cannot exist.
            spec = PathProbe(path=str(folder / "missing"), writable=True)
            result = await run_probe("p", spec)
            assert result.error is not None
            assert "does not exist" in result.error
        else:
            result = await run_probe("p", PathProbe(path=str(folder), writable=True))
            assert result.error is not None
            assert "not writable" in result.error
        assert not result.ok
    finally:
        folder.chmod(0o700)


PROBE_MODULE = """
import asyncio

async def up():
    return True

async def down():
    return False

def raises():
    raise RuntimeError("backend offline")

async def hangs():
    await asyncio.sleep(30)
"""


async def test_python_probe_passes(plugin_dir: Callable[[str, str], Path]) -> None:
    """An async callable returning True passes."""
    plugin_dir("probe_targets_a", PROBE_MODULE)
    result = await run_probe("py", PythonProbe(target="probe_targets_a:up"))
    assert result.ok, result.error


async def test_python_probe_fails_on_false_or_raise(
    plugin_dir: Callable[[str, str], Path],
) -> None:
    """Returning False or raising fails, with the reason."""
    plugin_dir("probe_targets_b", PROBE_MODULE)
    down = await run_probe("py", PythonProbe(target="probe_targets_b:down"))
    raised = await run_probe("py", PythonProbe(target="probe_targets_b:raises"))
    missing = await run_probe("py", PythonProbe(target="capd_no_such_module:x"))
    assert (down.ok, down.error) == (False, "probe_targets_b:down returned False")
    assert (raised.ok, raised.error) == (False, "RuntimeError: backend offline")
    assert not missing.ok
    assert missing.error is not None
    assert missing.error.startswith("ModuleNotFoundError")


async def test_python_probe_times_out(plugin_dir: Callable[[str, str], Path]) -> None:
    """A hanging probe callable times out."""
    plugin_dir("probe_targets_c", PROBE_MODULE)
    result = await run_probe("py", PythonProbe(target="probe_targets_c:hangs", timeout_s=0.2))
    assert not result.ok
    assert result.error == "timed out after 0.2s"


async def test_probe_all_runs_every_probe_once_and_concurrently() -> None:
    """probe_all starts every probe before any finishes, and probes each tool once."""
    calls: list[str] = []
    active = 0
    peak = 0
    gate = asyncio.Event()

    async def probe(tool: str, spec: object) -> object:
        nonlocal active, peak
        calls.append(tool)
        active += 1
        peak = max(peak, active)
        if peak == 10:
            gate.set()
        await gate.wait()
        active -= 1
        from capd.registry import ProbeResult

        return ProbeResult(tool=tool, ok=True, latency_s=0.0, checked_at=0.0)

    specs = {f"t{i}": CommandProbe(which="sh") for i in range(10)}
    results = await asyncio.wait_for(probe_all(specs, probe=probe), 5)  # type: ignore[arg-type]
    assert sorted(calls) == sorted(specs)
    assert peak == 10
    assert set(results) == set(specs)


def test_an_international_host_name_goes_as_idna() -> None:
    from capd.registry._probes import _idna

    assert _idna("bücher.example") == "xn--bcher-kva.example"
    assert _idna("127.0.0.1") == "127.0.0.1"
    assert _idna("::1") == "::1"
