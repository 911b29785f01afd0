"""The socket's HTTP/1.1 server: framing, limits and bad input, over a real Unix socket.

The server runs in the test's event loop with a small handler that echoes what
it parsed; clients speak raw bytes (and curl), so framing is what is tested.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from capd.sidecar.server._http import HttpRequest, HttpResponse, HttpServer, ServerHooks

LIMIT = 1024


class Echo:
    """Answers each request with what the server parsed; /slow waits for a release."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started: list[str] = []
        self.finished: list[str] = []
        self._changed = asyncio.Event()

    async def wait_started(self, path: str) -> None:
        """Return once the handler has been entered for ``path`` (bounded)."""
        async with asyncio.timeout(5):
            while path not in self.started:
                self._changed.clear()
                await self._changed.wait()

    async def wait_finished(self, path: str) -> None:
        """Return once the handler has finished ``path`` (bounded)."""
        async with asyncio.timeout(5):
            while path not in self.finished:
                self._changed.clear()
                await self._changed.wait()

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        self.started.append(request.path)
        self._changed.set()
        try:
            return await self._answer(request)
        finally:
            self._changed.set()

    async def _answer(self, request: HttpRequest) -> HttpResponse:
        if request.path == "/slow":
            await self.release.wait()
        if request.path == "/bad-header":
            return HttpResponse(200, b"{}", headers={"X-Bad": "\u20ac"})
        self.finished.append(request.path)
        body = {"method": request.method, "path": request.path, "query": request.query_string,
                "body": request.body.decode(), "peer": request.peer,
                "headers": {k: v for k, v in request.headers.items() if k.startswith("x-")}}
        return HttpResponse(200, json.dumps(body).encode())


def _hooks(echo: Echo) -> ServerHooks:
    return ServerHooks(
        handler=echo, peer_of=lambda sock: "unix" if sock is not None else None,
        too_large=lambda: HttpResponse(413, b'{"title":"Payload Too Large"}',
                                       "application/problem+json"),
        malformed=lambda detail: HttpResponse(400, json.dumps({"detail": detail}).encode(),
                                              "application/problem+json"),
        max_body_bytes=LIMIT)


async def _serve(path: Path, idle_timeout_s: float = 75.0,
                 request_timeout_s: float = 10.0) -> tuple[HttpServer, Echo]:
    """An echo server listening on a new Unix socket at ``path``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(64)
    echo = Echo()
    server = HttpServer(_hooks(echo), idle_timeout_s=idle_timeout_s,
                        request_timeout_s=request_timeout_s)
    await server.start(sock)
    return server, echo


async def _until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait (bounded) for state the server reaches on its own schedule."""
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.005)


@pytest.fixture
async def serving(short_tmp: Path) -> AsyncIterator[tuple[Path, Echo, HttpServer]]:
    path = short_tmp / "h.sock"
    server, echo = await _serve(path)
    yield path, echo, server
    echo.release.set()
    await server.close(grace_s=1.0)


@pytest.fixture
def served(serving: tuple[Path, Echo, HttpServer]) -> tuple[Path, Echo]:
    path, echo, _ = serving
    return path, echo


async def _exchange(path: Path, data: bytes, *, until_close: bool = True,
                    responses: int = 1) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(data)
    await writer.drain()
    if until_close:
        out = await asyncio.wait_for(reader.read(), timeout=5)
    else:
        out = b""
        while out.count(b"HTTP/1.1 ") < responses or not _complete(out, responses):
            chunk = await asyncio.wait_for(reader.read(65536), timeout=5)
            if not chunk:
                break
            out += chunk
    writer.close()
    return out


async def _read_one(reader: asyncio.StreamReader) -> bytes:
    """One whole response (head and Content-Length body), or an interim one."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    lower = head.lower()
    if b"content-length:" not in lower:
        return head
    length = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
    return head + await asyncio.wait_for(reader.readexactly(length), timeout=5)


def _complete(data: bytes, responses: int) -> bool:
    """Whether ``data`` holds ``responses`` whole responses (Content-Length framed)."""
    for _ in range(responses):
        end = data.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = data[:end].decode("latin-1").lower()
        length = int(head.split("content-length:")[1].split("\r\n")[0])
        if len(data) < end + 4 + length:
            return False
        data = data[end + 4 + length:]
    return True


def _bodies(data: bytes) -> list[tuple[int, dict[str, object]]]:
    out = []
    while data:
        end = data.find(b"\r\n\r\n")
        head = data[:end].decode("latin-1")
        length = int(head.lower().split("content-length:")[1].split("\r\n")[0])
        body = data[end + 4:end + 4 + length]
        if head.startswith("HTTP/1.1 100"):
            data = data[end + 4:]
            continue
        out.append((int(head[9:12]), json.loads(body)))
        data = data[end + 4 + length:]
    return out


async def test_pipelined_requests_are_answered_in_order(served: tuple[Path, Echo]) -> None:
    path, _ = served
    requests = b"".join(
        f"POST /r{i}?n={i} HTTP/1.1\r\nHost: capd\r\nContent-Length: 2\r\n\r\n{i:02d}".encode()
        for i in range(20))
    answers = _bodies(await _exchange(path, requests, until_close=False, responses=20))
    assert [(s, b["path"], b["query"], b["body"]) for s, b in answers] == [
        (200, f"/r{i}", f"n={i}", f"{i:02d}") for i in range(20)]


async def test_chunked_body_and_percent_encoded_path(served: tuple[Path, Echo]) -> None:
    path, _ = served
    request = (b"POST /call/notes%2Eappend HTTP/1.1\r\nHost: capd\r\n"
               b"Transfer-Encoding: chunked\r\nX-Request-Id: r-1\r\nConnection: close\r\n\r\n"
               b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    [(status, body)] = _bodies(await _exchange(path, request))
    assert status == 200
    assert body["path"] == "/call/notes.append"
    assert body["body"] == "hello world"
    assert body["headers"] == {"x-request-id": "r-1"}
    assert body["peer"] == "unix"


async def test_connection_close_and_http_1_0_close_after_the_answer(
        served: tuple[Path, Echo]) -> None:
    path, _ = served
    closing = await _exchange(path, b"GET /a HTTP/1.1\r\nHost: c\r\nConnection: close\r\n\r\n")
    assert b"Connection: close" in closing
    old = await _exchange(path, b"GET /b HTTP/1.0\r\n\r\n")
    assert old.startswith(b"HTTP/1.1 200")
    assert _bodies(old)[0][1]["path"] == "/b"


async def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(
        served: tuple[Path, Echo]) -> None:
    """With Expect: 100-continue the client never has to send the body."""
    path, echo = served
    request = (f"POST /big HTTP/1.1\r\nHost: c\r\nContent-Length: {LIMIT + 1}\r\n"
               "Expect: 100-continue\r\n\r\n").encode()
    answer = await _exchange(path, request)
    assert answer.startswith(b"HTTP/1.1 413")
    assert b"100 Continue" not in answer
    assert echo.finished == []


async def test_a_chunked_body_over_the_limit_is_refused(served: tuple[Path, Echo]) -> None:
    path, echo = served
    chunk = b"x" * 600
    request = (b"POST /big HTTP/1.1\r\nHost: c\r\nTransfer-Encoding: chunked\r\n\r\n"
               + (b"258\r\n" + chunk + b"\r\n") * 3 + b"0\r\n\r\n")
    answer = await _exchange(path, request)
    assert answer.startswith(b"HTTP/1.1 413")
    assert echo.finished == []


async def test_expect_100_continue_within_the_limit_is_continued(
        served: tuple[Path, Echo]) -> None:
    path, _ = served
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(b"POST /e HTTP/1.1\r\nHost: c\r\nContent-Length: 3\r\n"
                 b"Expect: 100-continue\r\nConnection: close\r\n\r\n")
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"abc")
    final = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()
    assert _bodies(final)[0][1]["body"] == "abc"


@pytest.mark.parametrize("garbage", [
    b"NOT HTTP AT ALL\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: c\r\nContent-Length: nope\r\n\r\n",
    b"GET /" + b"a" * (70 * 1024) + b" HTTP/1.1\r\n\r\n",
    b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
])
async def test_malformed_requests_get_400_and_the_server_keeps_serving(
        served: tuple[Path, Echo], garbage: bytes) -> None:
    path, _ = served
    answer = await _exchange(path, garbage)
    assert answer.startswith(b"HTTP/1.1 400")
    assert b"Connection: close" in answer
    ok = await _exchange(path, b"GET /after HTTP/1.1\r\nHost: c\r\nConnection: close\r\n\r\n")
    [(status, body)] = _bodies(ok)
    assert (status, body["path"]) == (200, "/after")


async def test_a_client_that_leaves_mid_request_does_not_cut_the_handler_short(
        served: tuple[Path, Echo]) -> None:
    """The handler finishes its work; the answer is dropped; others are still served."""
    path, echo = served
    _reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(b"GET /slow HTTP/1.1\r\nHost: c\r\n\r\n")
    await writer.drain()
    await echo.wait_started("/slow")
    writer.close()
    await writer.wait_closed()
    echo.release.set()
    await echo.wait_finished("/slow")
    ok = await _exchange(path, b"GET /next HTTP/1.1\r\nHost: c\r\nConnection: close\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 200")


async def test_close_lets_a_busy_connection_answer_and_drops_idle_ones(
        short_tmp: Path) -> None:
    path = short_tmp / "c.sock"
    server, echo = await _serve(path)
    idle_reader, idle_writer = await asyncio.open_unix_connection(str(path))
    busy_reader, busy_writer = await asyncio.open_unix_connection(str(path))
    busy_writer.write(b"GET /slow HTTP/1.1\r\nHost: c\r\n\r\n")
    await busy_writer.drain()
    await echo.wait_started("/slow")
    closing = asyncio.create_task(server.close(grace_s=2.0))
    assert await asyncio.wait_for(idle_reader.read(), timeout=2) == b""  # idle: closed
    echo.release.set()
    answer = await asyncio.wait_for(busy_reader.read(), timeout=3)
    assert answer.startswith(b"HTTP/1.1 200")
    await closing
    idle_writer.close()
    busy_writer.close()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is installed by .ci/deps")
async def test_curl_speaks_to_it(served: tuple[Path, Echo]) -> None:
    """curl's defaults (Expect on large bodies, keep-alive) work, JSON in and out."""
    path, _ = served
    proc = await asyncio.create_subprocess_exec(
        "curl", "-s", "--unix-socket", str(path), "-H", "X-Trace: t", "--data", "x" * 1000,
        "http://capd/call/x?a=1", stdout=subprocess.PIPE)
    out, _ = await proc.communicate()
    body = json.loads(out)
    assert (body["path"], body["query"], len(body["body"])) == ("/call/x", "a=1", 1000)


async def test_an_idle_keep_alive_connection_is_closed_and_a_busy_one_is_not(
        short_tmp: Path) -> None:
    path = short_tmp / "i.sock"
    server, echo = await _serve(path, idle_timeout_s=0.2)
    idle_reader, idle_writer = await asyncio.open_unix_connection(str(path))
    busy_reader, busy_writer = await asyncio.open_unix_connection(str(path))
    busy_writer.write(b"GET /slow HTTP/1.1\r\nHost: c\r\n\r\n")
    await busy_writer.drain()
    assert await asyncio.wait_for(idle_reader.read(), timeout=3) == b""  # closed by the server
    await asyncio.sleep(0.4)  # well past the timeout: the busy one is still open
    echo.release.set()
    answer = await asyncio.wait_for(busy_reader.readuntil(b"}"), timeout=3)
    assert answer.startswith(b"HTTP/1.1 200")
    idle_writer.close()
    busy_writer.close()
    await server.close(grace_s=1.0)


async def test_an_answer_http_cannot_carry_becomes_500_and_the_connection_goes_on(
        served: tuple[Path, Echo]) -> None:
    path, _ = served
    requests = (b"GET /bad-header HTTP/1.1\r\nHost: c\r\n\r\n"
                b"GET /fine HTTP/1.1\r\nHost: c\r\nConnection: close\r\n\r\n")
    answers = _bodies(await _exchange(path, requests))
    assert [status for status, _ in answers] == [500, 200]
    assert answers[1][1]["path"] == "/fine"


async def test_a_client_that_half_closes_after_its_request_still_gets_the_answer(
        served: tuple[Path, Echo]) -> None:
    """Like `printf 'GET ...' | nc -U -N`: the request, then EOF, then read."""
    path, echo = served
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(b"GET /slow HTTP/1.1\r\nHost: c\r\n\r\n")
    writer.write_eof()
    await echo.wait_started("/slow")
    echo.release.set()
    answer = await asyncio.wait_for(reader.read(), timeout=3)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200")


# -- answers go out in request order -------------------------------------------------


async def _behind_slow(serving: tuple[Path, Echo, HttpServer], data: bytes,
                       queued: int = 1) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Send ``GET /slow`` then ``data``; return once ``queued`` answers wait behind it."""
    path, echo, server = serving
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(b"GET /slow HTTP/1.1\r\nHost: c\r\n\r\n" + data)
    await writer.drain()
    await _until(lambda: echo.started == ["/slow"]
                 and server.stats()["queued_answers"] >= queued)
    return reader, writer


async def test_a_413_waits_for_the_answer_to_an_earlier_pipelined_request(
        serving: tuple[Path, Echo, HttpServer]) -> None:
    """A refused body is answered after the request before it, then the connection closes."""
    _, echo, _ = serving
    big = (f"POST /big HTTP/1.1\r\nHost: c\r\nContent-Length: {LIMIT + 1}\r\n\r\n"
           ).encode() + b"x" * (LIMIT + 1)
    reader, writer = await _behind_slow(serving, big)
    echo.release.set()
    answers = _bodies(await asyncio.wait_for(reader.read(), timeout=5))
    writer.close()
    assert [status for status, _ in answers] == [200, 413]
    assert answers[0][1]["path"] == "/slow"
    assert echo.finished == ["/slow"]


async def test_100_continue_waits_for_the_answer_to_an_earlier_pipelined_request(
        serving: tuple[Path, Echo, HttpServer]) -> None:
    """The interim answer never overtakes the final answer to an earlier request."""
    _, echo, _ = serving
    reader, writer = await _behind_slow(
        serving, b"POST /e HTTP/1.1\r\nHost: c\r\nContent-Length: 3\r\n"
                 b"Expect: 100-continue\r\nConnection: close\r\n\r\n")
    echo.release.set()
    first = await _read_one(reader)
    interim = await _read_one(reader)
    assert first.startswith(b"HTTP/1.1 200")
    assert b'"path": "/slow"' in first
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"abc")
    final = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()
    assert [(s, b["path"], b["body"]) for s, b in _bodies(final)] == [(200, "/e", "abc")]


async def test_a_malformed_request_after_a_pipelined_one_is_answered_400_after_it(
        serving: tuple[Path, Echo, HttpServer]) -> None:
    """The 400 and the close wait for the answer the client is owed first."""
    _, echo, _ = serving
    reader, writer = await _behind_slow(serving, b"NOT HTTP AT ALL\r\n\r\n")
    echo.release.set()
    answers = _bodies(await asyncio.wait_for(reader.read(), timeout=5))
    writer.close()
    assert [status for status, _ in answers] == [200, 400]
    assert answers[0][1]["path"] == "/slow"


@pytest.mark.parametrize("after", [b"GET /b HTTP/1.1\r\nHost: c\r\n\r\n", b"NOT HTTP\r\n\r\n"])
async def test_bytes_after_a_connection_close_request_are_dropped_not_answered(
        serving: tuple[Path, Echo, HttpServer], after: bytes) -> None:
    """The request marked close is answered; whatever follows it is ignored, not a 400."""
    path, echo, _ = serving
    echo.release.set()
    data = (b"GET /slow HTTP/1.1\r\nHost: c\r\n\r\n"
            b"GET /a HTTP/1.1\r\nHost: c\r\nConnection: close\r\n\r\n" + after)
    answers = _bodies(await _exchange(path, data))
    assert [(s, b["path"]) for s, b in answers] == [(200, "/slow"), (200, "/a")]
    assert echo.finished == ["/slow", "/a"]


async def test_pipelined_chunked_and_declared_bodies_are_answered_in_order(
        served: tuple[Path, Echo]) -> None:
    """A request right behind a chunked body (parsed in the same piece) keeps its place."""
    path, _ = served
    requests = b"".join(
        (b"POST /c%d HTTP/1.1\r\nHost: c\r\nTransfer-Encoding: chunked\r\n\r\n"
         b"2\r\n%02d\r\n0\r\n\r\n" % (i, i)) if i % 2 else
        (b"POST /c%d HTTP/1.1\r\nHost: c\r\nContent-Length: 2\r\n\r\n%02d" % (i, i))
        for i in range(40))
    answers = _bodies(await _exchange(path, requests, until_close=False, responses=40))
    assert [(b["path"], b["body"]) for _, b in answers] == [
        (f"/c{i}", f"{i:02d}") for i in range(40)]


# -- slow clients --------------------------------------------------------------------------


async def test_a_request_that_does_not_arrive_in_time_is_answered_408_and_closed(
        short_tmp: Path) -> None:
    """Headers trickled past request_timeout_s get a problem+json 408 with Connection: close."""
    path = short_tmp / "t.sock"
    server, echo = await _serve(path, request_timeout_s=0.3)
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(b"GET /late HTTP/1.1\r\nHost:")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), timeout=5)  # read until the server closes
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    assert b"Connection: close" in head
    assert b"application/problem+json" in head
    assert json.loads(body)["status"] == 408
    assert echo.started == []
    assert server.stats()["timed_out"] == 1
    await server.close(grace_s=1.0)


async def test_a_slow_request_behind_a_busy_one_gets_its_408_after_the_first_answer(
        short_tmp: Path) -> None:
    """The 408 for a trickled request queues behind the answer owed before it."""
    path = short_tmp / "t.sock"
    server, echo = await _serve(path, request_timeout_s=0.3)
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(b"GET /slow HTTP/1.1\r\nHost: c\r\n\r\nGET /late HTTP/1.1\r\n")
    await writer.drain()
    await _until(lambda: server.stats()["timed_out"] == 1)
    echo.release.set()
    answers = _bodies(await asyncio.wait_for(reader.read(), timeout=5))
    writer.close()
    assert [status for status, _ in answers] == [200, 408]
    assert answers[0][1]["path"] == "/slow"
    await server.close(grace_s=1.0)


async def test_an_idle_keep_alive_connection_outlives_the_request_timeout(
        short_tmp: Path) -> None:
    """Between requests only idle_timeout_s applies; request_timeout_s is for requests."""
    path = short_tmp / "t.sock"
    server, _ = await _serve(path, request_timeout_s=0.3)
    idle_reader, idle_writer = await asyncio.open_unix_connection(str(path))
    idle_writer.write(b"GET /one HTTP/1.1\r\nHost: c\r\n\r\n")
    assert (await _read_one(idle_reader)).startswith(b"HTTP/1.1 200")
    # A trickling client, started after, is timed out: the idle one has been
    # silent longer than the request timeout by then.
    slow_reader, slow_writer = await asyncio.open_unix_connection(str(path))
    slow_writer.write(b"GET /late HTTP/1.1\r\n")
    assert (await asyncio.wait_for(slow_reader.read(), timeout=5)).startswith(b"HTTP/1.1 408")
    idle_writer.write(b"GET /two HTTP/1.1\r\nHost: c\r\n\r\n")
    assert b'"path": "/two"' in await _read_one(idle_reader)
    idle_writer.close()
    slow_writer.close()
    await server.close(grace_s=1.0)
