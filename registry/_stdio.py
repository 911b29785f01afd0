"""The stdio transport to an upstream MCP server: a process, its pipes, its lines.

It is the SDK's ``stdio_client`` in what it promises (newline-delimited JSON-RPC on
the server's stdin and stdout, its stderr passed through, its own process group, and
the spec's shutdown: stdin closed, 2 s, SIGTERM to the group, 2 s, SIGKILL) with
one difference that matters for large answers: a line is gathered as a list of the
pieces read and joined once when its newline comes, where adding each piece to
what came before copies the line again for every piece read (a 14 MB answer in
64 KiB reads was a second of the event loop's time, in steps of milliseconds).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator, Sequence
from typing import IO, Any

import anyio
import mcp_types as types
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

STDIN_CLOSE_WAIT_S = 2.0
"""How long the server has to exit by itself once its stdin is closed."""
TERM_WAIT_S = 2.0
"""How long after SIGTERM to its process group before SIGKILL."""
FLUSH_WAIT_S = 0.5
_POLL_S = 0.01


@contextlib.asynccontextmanager
async def stdio_transport(argv: Sequence[str], env: dict[str, str] | None,
                          errlog: IO[str]) -> AsyncIterator[tuple[Any, Any]]:
    """Start ``argv`` (its own process group) and yield the session's (read, write)
    streams; on the way out, stop it as the MCP spec says, even when cancelled."""
    process = await anyio.open_process(list(argv), env=get_default_environment() | (env or {}),
                                       stderr=errlog, start_new_session=True)
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()

    async def read_lines() -> None:
        assert process.stdout is not None
        pieces: list[bytes] = []
        try:
            async with read_writer:
                async for chunk in process.stdout:
                    start = 0
                    while (end := chunk.find(b"\n", start)) >= 0:
                        pieces.append(chunk[start:end])
                        line = b"".join(pieces)
                        pieces.clear()
                        start = end + 1
                        if line.strip():
                            await read_writer.send(_parse(line))
                    if start < len(chunk):
                        pieces.append(chunk[start:])
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream,
                OSError):
            pass  # the session or the server is gone; the read stream's end says so

    async def write_lines() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # a request must not wait on a server that is gone
        finally:
            writer_done.set()

    async with anyio.create_task_group() as group:
        group.start_soon(read_lines)
        group.start_soon(write_lines)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                write_stream.close()
                with anyio.move_on_after(FLUSH_WAIT_S):
                    await writer_done.wait()
                await _stop(process)
                for stream in (read_stream, read_writer, write_reader):
                    await stream.aclose()
            group.cancel_scope.cancel()


def _parse(line: bytes) -> SessionMessage | Exception:
    """One line as a message, or the error the session reports for it."""
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


async def _stop(process: Any) -> None:
    """Close stdin and wait; then SIGTERM to the process group and wait; then SIGKILL."""
    with contextlib.suppress(Exception):
        await process.stdin.aclose()
    if await _exited(process, STDIN_CLOSE_WAIT_S):
        return
    for signum, wait_s in ((signal.SIGTERM, TERM_WAIT_S), (signal.SIGKILL, TERM_WAIT_S)):
        try:
            os.killpg(process.pid, signum)  # the leader's pid is the group's (new session)
        except ProcessLookupError:
            return
        except PermissionError:
            continue
        if await _exited(process, wait_s):
            return


async def _exited(process: Any, wait_s: float) -> bool:
    with anyio.move_on_after(wait_s):
        while process.returncode is None:  # noqa: ASYNC110 (wait() also waits for EOF)
            await anyio.sleep(_POLL_S)
        return True
    return False
