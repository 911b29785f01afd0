"""A declaration file that does not load fails the reload, and a queued job whose
capability a reload took away waits for it rather than being parked: through the real
daemon, its CLI and its queue."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import E2E_CAPS, DaemonProcess, FlipServer, daemons_on, write_e2e_config

pytestmark = pytest.mark.slow  # the real daemon and the CLI as processes


@pytest.fixture
def up(short_tmp: Path, web: FlipServer) -> Iterator[Callable[..., DaemonProcess]]:
    def write(folder: Path, extra: str) -> Path:
        return write_e2e_config(folder, web.port, retry_base_s=0.2, retry_cap_s=0.5,
                                retry_max_attempts=1000)

    with daemons_on(short_tmp, write) as start:
        yield start


def reload(daemon: DaemonProcess) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "capd", "reload", "--socket",
                           str(daemon.socket)], capture_output=True, text=True, timeout=60,
                          check=False)


def job(daemon: DaemonProcess, job_id: str) -> dict[str, Any]:
    body: dict[str, Any] = daemon.call("GET", f"/queue/{job_id}").body
    return body


def test_a_stray_byte_fails_the_reload_and_a_removed_capabilitys_job_waits(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """A stray byte in caps.toml fails the reload naming the file (every capability of it
    still serves, its queued job still pending); a valid edit that removes the capability
    leaves its job pending with why, never parked; putting it back resumes the job on the
    recheck schedule."""
    daemon = up()
    queued = daemon.call("POST", "/call/e2e.flaky", {"text": "keep me"})
    assert queued.status == 202, queued.body
    job_id = queued.body["queued"]
    caps = short_tmp / "caps.toml"

    caps.write_bytes(E2E_CAPS.encode() + b"\x00")
    failed = reload(daemon)
    assert failed.returncode != 0
    assert "caps.toml: not valid TOML" in failed.stdout + failed.stderr
    assert "fails the reload" in failed.stdout + failed.stderr
    assert daemon.call("POST", "/call/e2e.echo", {"text": "still"}).status == 200
    assert daemon.call("GET", "/capabilities/e2e.flaky").status == 200
    assert job(daemon, job_id)["state"] in ("pending", "leased")

    without = E2E_CAPS.replace('name = "e2e.flaky"', 'name = "e2e.flaky_renamed"')
    caps.write_text(without)
    done = reload(daemon)
    assert done.returncode == 0, done.stderr

    def waiting() -> bool:
        trail = job(daemon, job_id)["trail"]
        return any("left the registry" in (a.get("detail") or "") for a in trail)

    daemon.wait_until(waiting, timeout=20)
    assert job(daemon, job_id)["state"] == "pending"

    caps.write_text(E2E_CAPS)
    assert reload(daemon).returncode == 0
    claims_before = sum(a["kind"] == "claim" for a in job(daemon, job_id)["trail"])
    # the sweep looks again on the recheck schedule (recheck_interval_s, 0.2 s here)
    daemon.wait_until(lambda: sum(a["kind"] == "claim" for a in job(daemon, job_id)["trail"])
                      > claims_before, timeout=20)
    assert job(daemon, job_id)["state"] != "needs_operator"
