"""A streamed call over the Unix socket, read as it comes (NDJSON over chunked HTTP)."""

from __future__ import annotations

import json
import socket
from typing import Any

from .daemon import DaemonProcess


def stream_call(daemon: DaemonProcess, name: str, params: dict[str, Any],
                headers: dict[str, str] | None = None, *, close_after: int | None = None
                ) -> tuple[str, list[dict[str, Any]]]:
    """POST /call/NAME asking for a stream, over a raw socket: (the head, the lines);
    with ``close_after``, the connection is closed once that many lines have come."""
    body = json.dumps(params).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    request = (f"POST /call/{name} HTTP/1.1\r\nHost: capd\r\nAccept: application/x-ndjson\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}"
               "Connection: close\r\n\r\n").encode() + body
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(60)
        sock.connect(str(daemon.socket))
        sock.sendall(request)
        data = b""
        head = ""
        lines: list[dict[str, Any]] = []
        while True:
            piece = sock.recv(65536)
            if not piece:
                break
            data += piece
            if not head and b"\r\n\r\n" in data:
                raw_head, data = data.split(b"\r\n\r\n", 1)
                head = raw_head.decode()
            if head and "chunked" in head.lower():
                lines = [json.loads(line) for line in dechunk(data).splitlines() if line]
                if close_after is not None and len(lines) >= close_after:
                    return head, lines
    if head and "chunked" not in head.lower():
        return head, [json.loads(data)]
    return head, [json.loads(line) for line in dechunk(data).splitlines() if line]


def dechunk(data: bytes) -> bytes:
    out = b""
    while True:
        size_end = data.find(b"\r\n")
        if size_end < 0:
            return out
        size = int(data[:size_end], 16)
        if size == 0 or len(data) < size_end + 2 + size:
            return out
        out += data[size_end + 2:size_end + 2 + size]
        data = data[size_end + 4 + size:]
