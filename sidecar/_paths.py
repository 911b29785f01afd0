"""Where things are by default: the socket, the config, the version. Shared by both sides."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_CONFIG_ENV = "CAPD_CONFIG"
"""The environment variable naming capd.toml when ``--config`` is not given."""


def default_socket_path() -> Path:
    """``/run/capd/capd.sock`` as root, else ``$XDG_RUNTIME_DIR/capd/capd.sock``."""
    if os.geteuid() == 0:
        return Path("/run/capd/capd.sock")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "capd" / "capd.sock"
    return Path(f"/tmp/capd-{os.getuid()}") / "capd.sock"


def capd_version() -> str:
    """The installed package's version."""
    try:
        import importlib.metadata  # a few tens of milliseconds: only when asked

        return importlib.metadata.version("capd")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0+unknown"
