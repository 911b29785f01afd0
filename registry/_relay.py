"""A stdio MCP server behind a bound: lines over ``--max-bytes`` never reach capd.

Run as a script (``python -I _relay.py --max-bytes N -- COMMAND...``), never imported by
the daemon: it starts ``COMMAND`` with the same stdin, stderr and process group, and
copies the server's stdout to its own line by line. A line longer than ``N`` bytes is
read through and dropped in pieces (never held whole), and replaced by a JSON-RPC error
answering the same request id (found near the line's start or its end)::

    {"jsonrpc": "2.0", "id": 7, "error": {"code": -32000,
     "message": "result_too_large: the answer is 20971600 bytes; max_result_bytes is ..."}}

so the daemon's session neither decodes nor holds an answer it would refuse, and stays
usable. It exits with the server's status when the server's stdout ends.

It also ends the server with the daemon: on Linux it asks to be sent SIGTERM when its
parent dies (``PR_SET_PDEATHSIG``), and on SIGTERM kills its whole process group, so a
daemon killed with SIGKILL leaves no server running on.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import threading

CHUNK = 1 << 16
KEEP = 4096  # bytes kept of an oversized line's start and end, to find its id
_ID = re.compile(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.){0,200}")')
TOO_LARGE = -32000


def _error_for(head: bytes, tail: bytes, size: int, limit: int) -> bytes | None:
    """The JSON-RPC error answering the oversized line's request, or None (no id found)."""
    found = _ID.search(head)
    if found is None:
        matches = list(_ID.finditer(tail))
        found = matches[-1] if matches else None
    if found is None:
        return None
    request_id = json.loads(found.group(1))
    body = {"jsonrpc": "2.0", "id": request_id, "error": {
        "code": TOO_LARGE, "message": (f"result_too_large: the answer is {size} bytes; "
                                       f"max_result_bytes is {limit}")}}
    return json.dumps(body).encode() + b"\n"


def _write_all(sink: int, data: bytes) -> None:
    written = 0
    while written < len(data):
        written += os.write(sink, data[written:] if written else data)


def relay(source: int, sink: int, limit: int) -> None:
    """Copy lines from ``source`` to ``sink``; replace those over ``limit`` bytes."""
    line = bytearray()
    oversized = False
    head = b""
    tail = b""
    size = 0
    while True:
        chunk = os.read(source, CHUNK)
        if not chunk:
            return
        start = 0
        while start < len(chunk):
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if oversized:
                size += len(piece)
                tail = (tail + piece)[-KEEP:]
            elif len(line) + len(piece) > limit:  # from here on only its ends are kept
                oversized = True
                head = (bytes(line[:KEEP]) + piece[:KEEP])[:KEEP]
                tail = (bytes(line[-KEEP:]) + piece)[-KEEP:]
                size = len(line) + len(piece)
                line.clear()
            else:
                line += piece
            if end < 0:
                break
            if oversized:
                answer = _error_for(head, tail, size, limit)
                if answer is not None:
                    _write_all(sink, answer)
                sys.stderr.write(f"capd relay: dropped an answer of {size} bytes "
                                 f"(max_result_bytes {limit})\n")
                oversized, head, tail, size = False, b"", b"", 0
            else:
                line += b"\n"
                _write_all(sink, bytes(line))
                line.clear()
            start = end + 1


def main(argv: list[str]) -> int:
    """``--max-bytes N -- COMMAND...``: serve ``COMMAND`` behind the bound."""
    if len(argv) < 4 or argv[0] != "--max-bytes" or argv[2] != "--":
        sys.stderr.write("usage: _relay.py --max-bytes N -- COMMAND...\n")
        return 2
    limit = int(argv[1])
    _die_with_parent()
    server = subprocess.Popen(argv[3:], stdout=subprocess.PIPE)  # stdin, stderr: ours
    assert server.stdout is not None
    copier = threading.Thread(target=relay, args=(server.stdout.fileno(), 1, limit),
                              daemon=True)
    copier.start()
    copier.join()
    return server.wait()


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """SIGTERM when the daemon dies, and SIGTERM kills the process group (the server's)."""
    parent = os.getppid()

    def end_group(_signum: int, _frame: object) -> None:
        os.killpg(os.getpgrp(), signal.SIGKILL)

    signal.signal(signal.SIGTERM, end_group)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the server ends when its stdin does
        return
    if os.getppid() != parent:  # the daemon died before the request was made
        end_group(signal.SIGTERM, None)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
