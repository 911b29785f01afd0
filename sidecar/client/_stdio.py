"""The MCP message streams on the bridge's stdin and stdout, served by the event loop.

The SDK's ``stdio_server`` reads each line and writes each message (and flushes
it) on anyio worker threads: three thread hand-offs per tool call, which cost
more than the bridge's own work (bench/mcp_bridge.py: a call through the bridge
went from 0.71 to 0.96 of a directly hosted server with this alone). When stdin
and stdout are pipes or sockets, as MCP clients launch the bridge, the event loop
reads and writes them itself, each message parsed and written as
``stdio_server`` does; anything else is left to ``stdio_server``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import mcp_types as types
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage


class _LineReader(asyncio.Protocol):
    """The bytes of stdin, handed out line by line (no limit on a line's length)."""

    PAUSE_AT = 1 << 20  # complete lines buffered past this: stop reading until they are taken

    def __init__(self) -> None:
        self.transport: asyncio.ReadTransport | None = None
        self.buf = bytearray()
        self.scanned = 0  # bytes of buf known to hold no newline
        self.eof = False
        self.paused = False
        self.waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if (len(self.buf) > self.PAUSE_AT and not self.paused and self.transport is not None
                and self.buf.find(b"\n", self.scanned) >= 0):
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def readline(self) -> bytes | None:
        """The next line with its newline (the last one may have none); None at the end."""
        while True:
            end = self.buf.find(b"\n", self.scanned)
            if end >= 0:
                line = bytes(self.buf[:end + 1])
                del self.buf[:end + 1]
                self.scanned = 0
                if self.paused and self.transport is not None and (
                        len(self.buf) <= self.PAUSE_AT or self.buf.find(b"\n") < 0):
                    self.paused = False
                    self.transport.resume_reading()
                return line
            self.scanned = len(self.buf)
            if self.eof:
                line, self.buf, self.scanned = bytes(self.buf), bytearray(), 0
                return line or None
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None


class _LineWriter(asyncio.Protocol):
    """stdout's flow control: writers wait while the pipe's buffer is over its high mark."""

    def __init__(self) -> None:
        self.transport: asyncio.WriteTransport | None = None
        self.lost = False
        self.gone = asyncio.get_running_loop().create_future()
        self._resumed: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def pause_writing(self) -> None:
        self._resumed = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)
        self._resumed = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.resume_writing()
        if not self.gone.done():
            self.gone.set_result(None)

    async def drained(self) -> None:
        if self._resumed is not None:
            await asyncio.shield(self._resumed)


class _Incoming:
    """The MCP messages on stdin, as the SDK's ``stdio_server`` reads them."""

    def __init__(self, lines: _LineReader) -> None:
        self._lines = lines
        self._closed = False

    async def receive(self) -> SessionMessage | Exception:
        if self._closed:
            raise anyio.ClosedResourceError
        line = await self._lines.readline()
        if line is None:
            raise anyio.EndOfStream
        try:
            message = types.jsonrpc_message_adapter.validate_json(
                line.decode("utf-8", "replace"), by_name=False)
        except Exception as exc:  # handed to the server, as stdio_server does
            return exc
        return SessionMessage(message)

    def __aiter__(self) -> _Incoming:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self._closed = True

    async def __aenter__(self) -> _Incoming:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _Outgoing:
    """The MCP messages to stdout, one line each, as the SDK's ``stdio_server`` writes them."""

    def __init__(self, pipe: _LineWriter) -> None:
        self._pipe = pipe
        self._closed = False

    async def send(self, item: SessionMessage, /) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        if self._pipe.lost or self._pipe.transport is None:
            raise anyio.BrokenResourceError
        line = item.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
        self._pipe.transport.write(line.encode("utf-8"))
        await self._pipe.drained()

    async def aclose(self) -> None:
        self._closed = True

    async def __aenter__(self) -> _Outgoing:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _stdio_are_pipes() -> bool:
    """Whether stdin and stdout are pipes or sockets the event loop can serve (POSIX, asyncio).

    An MCP client gives the bridge pipes (Python's asyncio) or one socket pair each
    (libuv: Node clients, uvloop). Left to the SDK's transport, which reads and
    writes on worker threads: a terminal or a file; stdin and stdout on one and the
    same socket (asyncio's write-pipe transport takes data arriving on its socket
    for the peer closing it); stdout that is also stderr (logging writes there,
    blocking).
    """
    if sys.platform == "win32":
        return False
    try:
        asyncio.get_running_loop()
        stdin, stdout, stderr = os.fstat(0), os.fstat(1), os.fstat(2)
    except (RuntimeError, OSError):
        return False

    def same(a: os.stat_result, b: os.stat_result) -> bool:
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)

    return (all(stat.S_ISFIFO(s.st_mode) or stat.S_ISSOCK(s.st_mode) for s in (stdin, stdout))
            and not same(stdin, stdout) and not same(stdout, stderr))


@contextlib.asynccontextmanager
async def stdio_streams() -> AsyncIterator[tuple[Any, Any]]:
    """The MCP message streams on stdin and stdout.

    The SDK's ``stdio_server`` reads each line and writes each message (and flushes
    it) on anyio worker threads: three thread hand-offs per tool call, which cost
    more than the bridge's own work (bench/mcp_bridge.py). When stdin and stdout
    are pipes or sockets (as MCP clients launch the bridge) the event loop reads
    and writes them itself, each message parsed and written as ``stdio_server`` does.
    Like ``stdio_server``, fd 0 reads the null device and fd 1 writes to stderr
    meanwhile (so nothing stray reaches the wire); both are restored on exit, and
    so is their blocking mode.
    """
    if not _stdio_are_pipes():
        async with stdio_server() as streams:
            yield streams
        return
    import fcntl  # POSIX only, as _stdio_are_pipes checked

    loop = asyncio.get_running_loop()
    blocking = os.get_blocking(0), os.get_blocking(1)
    wire_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    wire_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    transports: list[asyncio.BaseTransport] = []
    writer: _LineWriter | None = None
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(2, 1)
        reader, writer = _LineReader(), _LineWriter()
        # Each transport closes a descriptor of its own (uvloop's closes it whatever the
        # file object says); wire_in and wire_out stay open to restore fd 0 and 1 from.
        read_transport, _ = await loop.connect_read_pipe(
            lambda: reader, os.fdopen(fcntl.fcntl(wire_in, fcntl.F_DUPFD_CLOEXEC, 3), "rb",
                                      buffering=0))
        transports.append(read_transport)
        write_transport, _ = await loop.connect_write_pipe(
            lambda: writer, os.fdopen(fcntl.fcntl(wire_out, fcntl.F_DUPFD_CLOEXEC, 3), "wb",
                                      buffering=0))
        transports.append(write_transport)
        yield _Incoming(reader), _Outgoing(writer)
    finally:
        for transport in transports:
            transport.close()  # the writer's once what it holds is written
        with anyio.CancelScope(shield=True):
            if writer is not None and len(transports) == 2:
                with contextlib.suppress(TimeoutError), anyio.fail_after(2):
                    await writer.gone
            await anyio.lowlevel.checkpoint()  # the transports let go of their descriptors
        os.dup2(wire_in, 0)
        os.dup2(wire_out, 1)
        os.set_blocking(0, blocking[0])
        os.set_blocking(1, blocking[1])
        os.close(wire_in)
        os.close(wire_out)
