"""Binding the daemon's Unix socket: stale-file detection, modes, the folder's owner."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path

from .._errors import SidecarError, SocketInUse, UnsafeSocketFolder

SOCKET_MODE = 0o660
DIR_MODE = 0o750


def is_answering(path: Path, timeout_s: float = 1.0) -> bool:
    """Whether something accepts connections on the Unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout_s)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except TimeoutError:
            return True  # a listener with a full backlog is still a live daemon
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


def socket_inode(path: Path) -> int:
    """The inode of the socket file at ``path`` (to recognise it at shutdown)."""
    return path.lstat().st_ino


def remove_socket(path: Path, inode: int) -> None:
    """Unlink ``path`` only if it is still the socket file we bound (inode ``inode``)."""
    with contextlib.suppress(OSError):
        if path.lstat().st_ino == inode:
            path.unlink()
