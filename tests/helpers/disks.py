"""Small real file systems for the tests of a full disk: a tmpfs mounted for the test and
unmounted after, and a filler that takes its space."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

MNT_DETACH = 2


@contextlib.contextmanager
def tmpfs(target: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` (``2m``, ``32m``) mounted on ``target``, unmounted on exit;
    the test is skipped where mounting is not allowed (it needs root or CAP_SYS_ADMIN)."""
    if sys.platform != "linux":
        pytest.skip("mounting a small tmpfs needs Linux")
    libc = ctypes.CDLL(None, use_errno=True)
    target.mkdir(exist_ok=True)
    where = os.fsencode(target)
    if libc.mount(b"tmpfs", where, b"tmpfs", 0, f"size={size}".encode()) != 0:
        code = ctypes.get_errno()
        if code in (errno.EPERM, errno.EACCES):
            pytest.skip(f"cannot mount a tmpfs ({os.strerror(code)}): the disk-full tests need "
                        "root or CAP_SYS_ADMIN")
        pytest.fail(f"mount tmpfs on {target} failed: {os.strerror(code)}")
    try:
        yield target
    finally:
        if libc.umount2(where, 0) != 0:
            code = ctypes.get_errno()
            libc.umount2(where, MNT_DETACH)
            pytest.fail(f"{target} was still busy at unmount ({os.strerror(code)}): "
                        "a test left a file open")


def fill(folder: Path, leave_bytes: int = 0, name: str = "filler") -> Path:
    """Write a filler file in ``folder`` until its file system has at most ``leave_bytes``
    free (none by default); bounded by the file system's size."""
    filler = folder / name
    info = os.statvfs(folder)
    size = info.f_blocks * info.f_frsize
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (1 << 16, 1 << 12, 1 << 9):
            for _ in range(size // chunk + 2):
                st = os.statvfs(folder)
                if st.f_bavail * st.f_frsize - chunk < leave_bytes:
                    break
                try:
                    os.write(fd, b"\0" * chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return filler


def free_bytes(folder: Path) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize
