"""The daemon's Unix socket: bound (stale-file detection, modes, the folder's owner) or
handed over by systemd, served, closed; and the descriptors its connections may take."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from .._errors import SidecarError, SocketInUse, UnsafeSocketFolder
from ._systemd import inherited_socket

if TYPE_CHECKING:
    from ._http import HttpServer

log = structlog.get_logger("capd.socket")

SOCKET_MODE = 0o660
DIR_MODE = 0o750


def is_answering(path: Path, timeout_s: float = 1.0) -> bool:
    """Whether something accepts connections on the Unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout_s)
        try:
            with contextlib.suppress(TimeoutError):  # a full backlog: still a live daemon
                probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        return True


def check_socket_folder(folder: Path) -> None:
    """Refuse a socket folder another user could tamper with, as tmux and ssh-agent do.

    The folder must belong to this process's uid (or root), and others may
    write in it only when its sticky bit keeps them from removing or renaming
    what is ours (as in ``/tmp``). Raises :class:`UnsafeSocketFolder`.
    """
    info = folder.stat()
    uid = os.geteuid()
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeSocketFolder(f"the socket folder {folder} is not a folder; pick --socket")
    if info.st_uid not in (uid, 0):
        raise UnsafeSocketFolder(
            f"the socket folder {folder} belongs to uid {info.st_uid}, not this daemon's uid "
            f"{uid}: its owner could replace the socket; remove it (rm -r {folder}) if you do not "
            "know who made it, or pick --socket in a folder you own")
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        raise UnsafeSocketFolder(
            f"the socket folder {folder} is writable by every user (mode "
            f"{stat.S_IMODE(info.st_mode):o}): anyone could replace the socket; run "
            f"chmod 750 {folder}, or pick --socket in a folder only you can write")


def bind_unix_socket(path: Path) -> socket.socket:
    """Bind and listen on ``path`` with mode 0660, in a 0750 folder we create if needed.

    A socket file left by a crash is replaced; a live daemon on ``path``
    raises :class:`SocketInUse`; a non-socket file there raises
    :class:`SidecarError` rather than being deleted; a folder another user
    owns, or anyone may write in, raises :class:`UnsafeSocketFolder`.
    """
    if len(os.fsencode(path)) >= 104:
        raise SidecarError(f"socket path {path} is too long for a Unix socket (max 103 bytes)")
    parent = path.parent
    if not parent.exists():
        parent.mkdir(parents=True, mode=DIR_MODE)
        os.chmod(parent, DIR_MODE)  # mkdir's mode is filtered by the umask
    check_socket_folder(parent)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise SidecarError(f"{path} exists and is not a socket; move it away or pick --socket")
        if is_answering(path):
            raise SocketInUse(
                f"another capd is already serving on {path}; stop it first or pick --socket"
            )
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o117)
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise SidecarError(f"cannot bind {path}: {exc.strerror}") from exc
    finally:
        os.umask(old_umask)
    os.chmod(path, SOCKET_MODE)
    sock.listen(512)
    sock.setblocking(False)
    return sock


@contextlib.asynccontextmanager
async def serve_unix_socket(path: Path, server: HttpServer) -> AsyncIterator[Path]:
    """Serve ``server`` on the socket systemd handed over, or on one bound at ``path``
    (refusing if another daemon answers there); yield the socket's path.

    On leaving: stop accepting and close the connections (responses being written get
    a moment), then remove the socket file bound here, never one systemd handed over.
    """
    sock = inherited_socket()
    inode = None
    if sock is not None:
        name = sock.getsockname()
        if isinstance(name, str) and name:
            path = Path(name)
        log.info("socket_inherited", socket=str(path))
    else:
        sock = bind_unix_socket(path)
        inode = path.lstat().st_ino  # to know the file at shutdown
    try:
        await server.start(sock)
        yield path
    finally:
        await server.close(grace_s=2.0)
        with contextlib.suppress(OSError):  # unlinked only if still the file bound here
            if inode is not None and path.lstat().st_ino == inode:
                path.unlink()


FD_RESERVE = 256
"""Descriptors kept out of the connection caps (queue, probes, subprocesses, logs)."""
DOOR_ACCEPT_SLACK = 512
"""Descriptors the HTTP front door may hold past its cap for a moment: connections
accepted in one go (its listen backlog) before the evicted ones are closed."""


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards ``wanted`` (never past the hard limit); return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("fd_limit_unchanged", soft=soft, wanted=target, error=str(exc))
            return soft
        return target
    return soft


def connection_caps(socket_max: int, door_max: int | None) -> tuple[int, int]:
    """How many connections the socket and the HTTP front door (``door_max``, None: no
    door) may hold, after raising the descriptor limit for both: when it cannot be raised
    far enough, fewer are admitted, the socket first, and descriptors stay in reserve."""
    door_wanted = door_max + DOOR_ACCEPT_SLACK if door_max is not None else 0
    fd_limit = raise_fd_limit(socket_max + door_wanted + FD_RESERVE)
    on_socket = max(16, min(socket_max, fd_limit - FD_RESERVE))
    if on_socket < socket_max:
        log.warning("fd_limit_low", limit=fd_limit, max_connections=on_socket,
                    configured=socket_max,
                    hint="raise LimitNOFILE= (or ulimit -n) above max_connections + 256")
    # the front door gets what the socket leaves: never the socket's descriptors
    on_door = max(16, fd_limit - FD_RESERVE - on_socket - DOOR_ACCEPT_SLACK)
    if door_max is not None and on_door < door_max:
        log.warning("fd_limit_low", limit=fd_limit, mcp_http_max_connections=on_door,
                    configured=door_max,
                    hint="raise LimitNOFILE= (or ulimit -n) for [mcp.http] max_connections")
    return on_socket, on_door
