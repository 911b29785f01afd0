"""Where things are by default: the socket, the config, the version. Shared by both sides."""

from __future__ import annotations

import os
import stat
from pathlib import Path

DEFAULT_CONFIG_ENV = "CAPD_CONFIG"
"""The environment variable naming capd.toml when ``--config`` is not given."""


SYSTEM_SOCKET = Path("/run/capd/capd.sock")
"""Where the system daemon (root's, the units') listens."""


def _user_runtime_dir() -> Path | None:
    """``$XDG_RUNTIME_DIR``, else ``/run/user/<uid>`` when the login manager made it for
    this user (a daemon started without the variable then meets a login shell's CLI)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime)
    folder = Path(f"/run/user/{os.getuid()}")
    try:
        info = folder.stat()
    except OSError:
        return None
    return folder if info.st_uid == os.getuid() and stat.S_ISDIR(info.st_mode) else None


def default_socket_path() -> Path:
    """``/run/capd/capd.sock`` as root, else ``$XDG_RUNTIME_DIR/capd/capd.sock`` (or
    ``/run/user/<uid>/capd/capd.sock``), else ``/tmp/capd-<uid>/capd.sock``."""
    if os.geteuid() == 0:
        return SYSTEM_SOCKET
    runtime = _user_runtime_dir()
    if runtime is not None:
        return runtime / "capd" / "capd.sock"
    return Path(f"/tmp/capd-{os.getuid()}") / "capd.sock"


def socket_candidates() -> list[Path]:
    """Every documented place this user's daemon may listen, the default first: the
    runtime folder's (with or without ``XDG_RUNTIME_DIR`` set), ``/tmp/capd-<uid>``, and
    the system daemon's."""
    uid = os.getuid()
    places = [default_socket_path()]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        places.append(Path(runtime) / "capd" / "capd.sock")
    places += [Path(f"/run/user/{uid}/capd/capd.sock"), Path(f"/tmp/capd-{uid}/capd.sock"),
               SYSTEM_SOCKET]
    return list(dict.fromkeys(places))


def find_socket() -> Path:
    """The socket of this user's daemon: the first documented place holding a socket in a
    folder only its owner (this user or root) can change; the default when none does."""
    for path in socket_candidates():
        try:
            if not stat.S_ISSOCK(path.stat().st_mode):
                continue
            folder = path.parent.stat()
        except OSError:
            continue
        if folder.st_uid in (os.getuid(), 0) and not folder.st_mode & 0o022:
            return path
    return default_socket_path()


def capd_version() -> str:
    """The installed package's version."""
    try:
        import importlib.metadata  # a few tens of milliseconds: only when asked

        return importlib.metadata.version("capd")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0+unknown"
