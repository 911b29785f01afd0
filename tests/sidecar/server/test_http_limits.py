"""The HTTP server's limits under abusive clients, over a real Unix socket.

Each test drives the server in the test's event loop with raw clients that do
what well-behaved ones do not: pipeline without reading, flood bodies, trickle
bytes, hold connections open. It asserts on what the server holds and answers
(``HttpServer.stats()``, the bytes on the wire), never on how long it took.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from capd.sidecar.server._http import (
    MAX_PIPELINED,
    HttpRequest,
    HttpResponse,
    HttpServer,
    ServerHooks,
)


class Gate:
    """Answers each request with its path and body length, padded to ``answer_bytes``;
    while ``open`` is not set, requests to /held wait for it."""

    def __init__(self, answer_bytes: int = 0) -> None:
        self.open = asyncio.Event()
        self.answer_bytes = answer_bytes
        self.started = 0
        self.finished = 0

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        self.started += 1
        if request.path.startswith("/held"):
            await self.open.wait()
        self.finished += 1
        body = json.dumps({"path": request.path, "length": len(request.body)}).encode()
        return HttpResponse(200, body.ljust(self.answer_bytes))


async def _serve(path: Path, gate: Gate, *, max_body_bytes: int = 1024,
                 **limits: float) -> HttpServer:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(1024)
    hooks = ServerHooks(
        handler=gate, peer_of=lambda sock: None,
        too_large=lambda: HttpResponse(413, b"{}", "application/problem+json"),
        malformed=lambda detail: HttpResponse(400, b"{}", "application/problem+json"),
        max_body_bytes=max_body_bytes)
    server = HttpServer(hooks, **limits)  # type: ignore[arg-type]  # float or int, as named
    await server.start(sock)
    return server


@pytest.fixture
async def stop_after() -> AsyncIterator[list[HttpServer]]:
    """Servers appended here are closed at the end of the test."""
    servers: list[HttpServer] = []
    yield servers
    for server in servers:
        await server.close(grace_s=0.5)


async def _until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait (bounded) for state the server reaches on its own schedule."""
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.005)


async def _read_answers(reader: asyncio.StreamReader, count: int) -> list[tuple[int, bytes]]:
    """``count`` whole answers: (status, body)."""
    out = []
    for _ in range(count):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        body = await asyncio.wait_for(reader.readexactly(length), timeout=10)
        out.append((int(head[9:12]), body))
    return out


def _paths(answers: list[tuple[int, bytes]]) -> list[str]:
    return [json.loads(body)["path"] for _, body in answers]


async def _get(path: Path, target: str = "/health") -> bytes:
    """One GET on a new connection; the whole answer (the server closes after it)."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(f"GET {target} HTTP/1.1\r\nHost: c\r\nConnection: close\r\n\r\n".encode())
    answer = await asyncio.wait_for(reader.read(), timeout=10)
    writer.close()
    return answer


# -- write backpressure -------------------------------------------------------------------


async def test_a_client_that_does_not_read_its_answers_is_not_read_or_answered_further(
        short_tmp: Path, stop_after: list[HttpServer]) -> None:
    """Unread answers pause the connection: bounded handler calls, queue and write
    buffer; once the client reads, it gets every answer, in order."""
    path = short_tmp / "w.sock"
    gate = Gate(answer_bytes=256 * 1024)
    server = await _serve(path, gate)
    stop_after.append(server)
    requests = 300
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(b"".join(f"GET /r{i} HTTP/1.1\r\nHost: c\r\n\r\n".encode()
                          for i in range(requests)))
    await writer.drain()
    await _until(lambda: server.stats()["writing_paused"] == 1
                 and server.stats()["reading_paused"] == 1)
    stats = server.stats()
    # Handled: what the socket took before the buffer passed its high-water mark.
    assert gate.finished <= 8
    assert stats["queued_answers"] <= MAX_PIPELINED
    assert stats["write_buffer_bytes"] <= 2 * 256 * 1024
    answers = await _read_answers(reader, requests)
    writer.close()
    assert _paths(answers) == [f"/r{i}" for i in range(requests)]
    assert gate.finished == requests


async def test_a_connection_holds_at_most_max_pipelined_requests(
        short_tmp: Path, stop_after: list[HttpServer]) -> None:
    """Requests pipelined behind a busy one wait in the socket, not in the server."""
    path = short_tmp / "p.sock"
    gate = Gate()
    server = await _serve(path, gate)
    stop_after.append(server)
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(b"".join(f"GET /held{i} HTTP/1.1\r\nHost: c\r\n\r\n".encode()
                          for i in range(200)))
    await writer.drain()
    await _until(lambda: server.stats()["reading_paused"] == 1)
    assert server.stats()["queued_answers"] == MAX_PIPELINED
    assert gate.started == 1
    gate.open.set()
    answers = await _read_answers(reader, 200)
    writer.close()
    assert _paths(answers) == [f"/held{i}" for i in range(200)]


async def test_a_client_that_never_reads_is_dropped_after_the_idle_timeout(
        short_tmp: Path, stop_after: list[HttpServer]) -> None:
    """Answers unread for idle_timeout_s: the connection is dropped, its buffers freed."""
    path = short_tmp / "s.sock"
    server = await _serve(path, Gate(answer_bytes=256 * 1024), idle_timeout_s=0.3)
    stop_after.append(server)
    _reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(b"".join(f"GET /r{i} HTTP/1.1\r\nHost: c\r\n\r\n".encode() for i in range(50)))
    await writer.drain()
    await _until(lambda: server.stats()["stalled"] == 1)
    # the reaper aborts the transport; the connection leaves when the loop reports it lost
    await _until(lambda: server.stats()["connections"] == 0)
    assert server.stats()["buffered_bytes"] == 0
    writer.close()


# -- bounded buffering ----------------------------------------------------------------------


async def test_request_bodies_held_across_connections_stay_within_the_budget(
        short_tmp: Path, stop_after: list[HttpServer]) -> None:
    """100 connections pipelining large bodies to a busy handler: what the server holds
    never passes max_buffered_bytes; when the handler frees up, every request is answered."""
    path = short_tmp / "b.sock"
    gate = Gate()
    body_bytes, per_connection, connections = 60 * 1024, 4, 100
    budget = 1 << 20
    server = await _serve(path, gate, max_body_bytes=64 * 1024, max_buffered_bytes=budget)
    stop_after.append(server)
    body = b"x" * body_bytes
    request = (b"POST /held HTTP/1.1\r\nHost: c\r\nContent-Length: %d\r\n\r\n" % body_bytes) + body

    async def client() -> list[tuple[int, bytes]]:
        reader, writer = await asyncio.open_unix_connection(str(path))
        for _ in range(per_connection):  # drained one by one: the client holds one at most
            writer.write(request)
            await writer.drain()
        answers = await _read_answers(reader, per_connection)
        writer.close()
        return answers

    clients = [asyncio.create_task(client()) for _ in range(connections)]
    await _until(lambda: server.stats()["waiting_for_buffer"] > 0)
    assert budget - body_bytes < server.stats()["buffered_bytes"] <= budget
    gate.open.set()
    results = await asyncio.wait_for(asyncio.gather(*clients), timeout=60)
    assert all([json.loads(b)["length"] for _, b in r] == [body_bytes] * per_connection
               for r in results)
    stats = server.stats()
    assert stats["peak_buffered_bytes"] <= budget
    assert stats["buffered_bytes"] == 0


async def test_one_request_larger_than_the_budget_is_still_served(
        short_tmp: Path, stop_after: list[HttpServer]) -> None:
    """A body may be max_body_bytes whatever the budget: it is let in when nothing is held."""
    path = short_tmp / "o.sock"
    server = await _serve(path, Gate(), max_body_bytes=256 * 1024, max_buffered_bytes=64 * 1024)
    stop_after.append(server)
    body = b"y" * (200 * 1024)
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write((b"POST /big HTTP/1.1\r\nHost: c\r\nContent-Length: %d\r\n\r\n" % len(body))
                 + body + b"GET /after HTTP/1.1\r\nHost: c\r\n\r\n")
    answers = await _read_answers(reader, 2)
    writer.close()
    assert [json.loads(b) for _, b in answers] == [
        {"path": "/big", "length": len(body)}, {"path": "/after", "length": 0}]


# -- slow clients and descriptors -------------------------------------------------------------


async def test_trickling_connections_are_timed_out_while_a_new_client_is_served(
        short_tmp: Path, stop_after: list[HttpServer]) -> None:
    """Connections that never finish a request get 408 and are closed; others are served."""
    path = short_tmp / "t.sock"
    server = await _serve(path, Gate(), request_timeout_s=0.5)
    stop_after.append(server)
    stop = asyncio.Event()

    async def trickle() -> bytes:
        reader, writer = await asyncio.open_unix_connection(str(path))
        got = asyncio.create_task(reader.read())
        for byte in b"GET /never-finished-" * 100:  # bounded: 2,000 bytes at most
            if got.done() or stop.is_set():
                break
            writer.write(bytes([byte]))
            await asyncio.sleep(0.05)
        answer = await asyncio.wait_for(got, timeout=10)
        writer.close()
        return answer

    trickling = [asyncio.create_task(trickle()) for _ in range(50)]
    await _until(lambda: server.stats()["connections"] == 50)
    assert (await _get(path)).startswith(b"HTTP/1.1 200")
    answers = await asyncio.wait_for(asyncio.gather(*trickling), timeout=30)
    stop.set()
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers)
    assert server.stats()["timed_out"] == 50
    # each is closed once its client has read the 408 and closed too (never reset)
    await _until(lambda: server.stats()["connections"] == 0)


async def test_idle_connections_are_evicted_for_new_clients_at_the_connection_limit(
        short_tmp: Path, stop_after: list[HttpServer]) -> None:
    """Past max_connections the connection silent longest is closed to make room."""
    path = short_tmp / "e.sock"
    server = await _serve(path, Gate(), max_connections=20)
    stop_after.append(server)
    idle = [await asyncio.open_unix_connection(str(path)) for _ in range(30)]
    await _until(lambda: server.stats()["evicted"] == 10)
    assert (await _get(path)).startswith(b"HTTP/1.1 200")
    stats = server.stats()
    assert stats["evicted"] == 11
    assert stats["refused"] == 0
    # The first ten opened (silent longest) were the ones evicted.
    for reader, _ in idle[:10]:
        assert await asyncio.wait_for(reader.read(), timeout=5) == b""
    for _, writer in idle:
        writer.close()


async def test_a_new_client_is_refused_503_when_every_connection_is_busy(
        short_tmp: Path, stop_after: list[HttpServer]) -> None:
    """No connection can be evicted: the newcomer is told the limit and to retry."""
    path = short_tmp / "r.sock"
    gate = Gate()
    server = await _serve(path, gate, max_connections=20)
    stop_after.append(server)
    busy = [await asyncio.open_unix_connection(str(path)) for _ in range(20)]
    for i, (_, writer) in enumerate(busy):
        writer.write(f"GET /held{i} HTTP/1.1\r\nHost: c\r\n\r\n".encode())
    await _until(lambda: gate.started == 20)
    reader, writer = await asyncio.open_unix_connection(str(path))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    problem = json.loads(await asyncio.wait_for(reader.readexactly(length), timeout=5))
    writer.close()
    assert head.startswith(b"HTTP/1.1 503")
    assert b"Connection: close" in head
    assert problem["status"] == 503
    assert "connection limit" in problem["detail"]
    assert server.stats()["refused"] == 1
    gate.open.set()
    for i, (busy_reader, busy_writer) in enumerate(busy):
        assert _paths(await _read_answers(busy_reader, 1)) == [f"/held{i}"]
        busy_writer.close()


async def test_a_waiting_claim_that_goes_away_does_not_block_the_next(
        short_tmp: Path, stop_after: list[HttpServer]) -> None:
    """The line for the budget is not left blocked by a waiter that went away (evicted)."""
    path = short_tmp / "l.sock"
    gate = Gate()
    server = await _serve(path, gate, max_body_bytes=64 * 1024, max_buffered_bytes=64 * 1024,
                          max_connections=2)
    stop_after.append(server)
    body = b"z" * (60 * 1024)

    def post(target: str) -> bytes:
        return (b"POST %s HTTP/1.1\r\nHost: c\r\nContent-Length: %d\r\n\r\n"
                % (target.encode(), len(body))) + body

    held_reader, held_writer = await asyncio.open_unix_connection(str(path))
    held_writer.write(post("/held"))
    await _until(lambda: gate.started == 1)
    waiting_reader, waiting_writer = await asyncio.open_unix_connection(str(path))
    waiting_writer.write(post("/waits"))
    await _until(lambda: server.stats()["waiting_for_buffer"] == 1)
    reader, writer = await asyncio.open_unix_connection(str(path))  # evicts the waiting one
    assert await asyncio.wait_for(waiting_reader.read(), timeout=5) == b""
    gate.open.set()
    assert _paths(await _read_answers(held_reader, 1)) == ["/held"]
    await _until(lambda: server.stats()["buffered_bytes"] == 0)
    writer.write(post("/next"))
    assert _paths(await _read_answers(reader, 1)) == ["/next"]
    for w in (held_writer, waiting_writer, writer):
        w.close()
