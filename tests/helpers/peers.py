"""Another uid on this machine, and a client running under it (the ``peer_uid`` fixture,
in ``conftest.py``, makes the user and removes it)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .daemon import DaemonProcess

PEER = "capd-test-peer" + (f"-{os.environ['PYTEST_XDIST_WORKER']}"
                           if "PYTEST_XDIST_WORKER" in os.environ else "")
"""The second user the tests make (one per test worker, when they run in parallel)."""


def curl_as(uid: int, socket_path: Path, path: str, body: str | None = None) -> str:
    """The HTTP status a client running under ``uid`` gets (a POST when ``body`` is given)."""
    data = ["-H", "Content-Type: application/json", "--data", body] if body is not None else []
    done = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
         shutil.which("curl") or "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
         *data, "--unix-socket", str(socket_path), f"http://capd{path}"],
        capture_output=True, text=True, timeout=30, check=False)
    return done.stdout


def open_up(daemon: DaemonProcess) -> None:
    """Let any uid reach the socket file, so the daemon's own check is what decides."""
    daemon.socket.parent.chmod(0o755)
    daemon.socket.chmod(0o666)
