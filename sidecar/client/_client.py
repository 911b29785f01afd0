"""A small blocking HTTP/1.1 client over the daemon's Unix socket, for the CLI."""

from __future__ import annotations

import http.client
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import DaemonUnreachable


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout_s: float) -> None:
        super().__init__("capd", timeout=timeout_s)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(str(self._path))
        except BaseException:  # refused, denied, absent: the socket is ours to close
            sock.close()
            raise
        self.sock = sock


@dataclass(frozen=True)
class Response:
    """A daemon's answer: status, content type and the decoded body."""

    status: int
    content_type: str
    body: Any
    headers: dict[str, str]


def request(
    socket_path: Path,
    method: str,
    path: str,
    *,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 300.0,
) -> Response:
    """Send one request to the daemon; raise :class:`DaemonUnreachable` if nothing answers."""
    conn = _UnixConnection(socket_path, timeout_s)
    payload = None if body is None else json.dumps(body).encode()
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    try:
        conn.request(method, path, body=payload, headers=all_headers)
        raw = conn.getresponse()
        data = raw.read()
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise DaemonUnreachable(
            f"is the daemon running? (socket: {socket_path}: {exc.strerror})"
        ) from exc
    except PermissionError as exc:
        raise DaemonUnreachable(
            f"permission denied on the socket {socket_path}: this user may not use that "
            f"daemon; its operator can let uid {os.getuid()} in with allow_uids (or a gid "
            "in allow_gids, such as the capd group: usermod -aG capd USER, then log in "
            "again), or pass --socket for your own daemon's socket"
        ) from exc
    except TimeoutError as exc:
        raise DaemonUnreachable(
            f"the daemon did not answer within {timeout_s:g}s (socket: {socket_path})"
        ) from exc
    except OSError as exc:
        raise DaemonUnreachable(
            f"cannot talk to the daemon (socket: {socket_path}): {exc.strerror or exc}"
        ) from exc
    finally:
        conn.close()
    content_type = raw.getheader("Content-Type", "")
    try:
        decoded: Any = json.loads(data) if data else None
    except ValueError:
        decoded = data.decode(errors="replace")
    return Response(raw.status, content_type, decoded, dict(raw.getheaders()))
