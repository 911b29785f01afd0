"""The queue outlives a full disk, through the real daemon on a real small file system: new
jobs are refused under the reserve, and once space returns (callers calling all along)
the sweep finishes every acknowledged job and /health passes again."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import DaemonProcess
from tests.helpers.disks import fill, free_bytes, tmpfs

pytestmark = pytest.mark.slow  # the real daemon as a process

PACK = '''
from pathlib import Path

from pydantic import BaseModel, Field
from capd.registry import TransientToolError, op

UP = Path(__file__).with_name("backend-up")


class Line(BaseModel):
    text: str = Field(description="The line to write.")


@op("disk.write")
async def write(params: Line) -> str:
    if not UP.exists():
        raise TransientToolError("the backend is down")
    return "written"
'''

CAPS = '''
[[capability]]
name = "disk.write"
op = "disk.write"
summary = "Write a line to a backend that may be down (queued then)."
mutates_state = true
retry_policy = "replay"
'''

RESERVE = 6 << 20


@contextlib.contextmanager
def daemon_on_small_disk(folder: Path, reserve: int) -> Iterator[DaemonProcess]:
    """The daemon with its state on a real 24 MiB tmpfs, ``reserve`` bytes kept."""
    (folder / "disk_pack.py").write_text(PACK)
    (folder / "caps.toml").write_text(CAPS)
    with tmpfs(folder / "fs", "24m") as disk:
        (folder / "capd.toml").write_text(
            'plugins = ["disk_pack"]\nplugin_paths = ["."]\ndeclarations = ["caps.toml"]\n'
            f'entry_points = false\nstate_dir = "{disk}/state"\n'
            f"queue_reserve_bytes = {reserve}\nretry_base_s = 0.2\nretry_cap_s = 1\n"
            "retry_max_attempts = 1000\n[policy.loops]\nenabled = false\n")
        process = DaemonProcess(folder / "capd.toml", folder / "capd.sock").start()
        try:
            yield process.wait_ready()
        finally:
            process.kill()


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[DaemonProcess]:
    with daemon_on_small_disk(short_tmp, RESERVE) as process:
        yield process


def disk_check(daemon: DaemonProcess) -> tuple[str, dict[str, Any]]:
    body = daemon.call("GET", "/health").body
    return body["status"], body["checks"]["queue:disk"][0]


class Callers:
    """Callers writing 8 KiB lines all along: what was acknowledged (202, a job) and what
    was refused (503, NOT queued) or done at once (200)."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.daemon = daemon
        self.queued: list[str] = []
        self.refused: list[str] = []
        self.done = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            line = f"{n:08d}" + "x" * 8184  # each its own: not a loop
            answer = self.daemon.call("POST", "/call/disk.write", {"text": line})
            if answer.status == 202:
                self.queued.append(answer.body["queued"])
            elif answer.status == 200:
                self.done += 1
            else:
                self.refused.append(str(answer.body.get("message")))
                time.sleep(0.01)

    def __enter__(self) -> Callers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def wait(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(0.1)


def test_a_full_disk_then_freed_while_callers_call_loses_no_acknowledged_job(
        daemon: DaemonProcess, short_tmp: Path) -> None:
    disk = short_tmp / "fs"
    assert disk_check(daemon)[0] == "pass"
    big = fill(disk, leave_bytes=RESERVE + (3 << 20), name="big")  # most of the disk taken
    with Callers(daemon) as callers:
        # the backend is down: the writes are queued until the reserve is reached...
        wait(lambda: len(callers.refused) > 20, 60, "enqueues refused under the reserve")
        assert "NOT queued: disk nearly full" in callers.refused[-1]
        status, check = disk_check(daemon)
        assert (status, check["status"]) == ("warn", "warn")
        assert check["observedValue"] < RESERVE
        assert "new jobs are refused" in check["output"]
        acknowledged = list(callers.queued)
        assert len(acknowledged) > 50
        # ...then the disk fills up entirely: /health fails
        rest = fill(disk, name="rest")
        wait(lambda: disk_check(daemon)[1]["status"] == "fail", 10, "/health fail when full")
        # space returns and the backend comes back while the callers keep calling
        rest.unlink()
        big.unlink()
        (short_tmp / "backend-up").touch()

        def finished() -> bool:
            jobs = daemon.call("GET", "/queue?state=done&limit=1000").body["jobs"]
            return set(acknowledged) <= {j["id"] for j in jobs}

        wait(finished, 60, "every acknowledged job done")
        acknowledged = list(callers.queued)  # those queued after the first count, too
        wait(finished, 60, "every acknowledged job done")
    assert callers.done > 0  # the callers' own writes went through meanwhile
    wait(lambda: daemon.call("GET", "/health").body["status"] == "pass", 30,
         "/health back to pass")
    assert disk_check(daemon)[1]["observedValue"] > RESERVE
    stats = daemon.call("GET", "/queue/stats").body["by_state"]
    assert stats["pending"] == stats["leased"] == stats["dead"] == 0
    assert free_bytes(disk) > RESERVE


def test_with_a_small_reserve_callers_never_take_the_room_acknowledged_jobs_need(
        short_tmp: Path) -> None:
    """A 256 KiB reserve: the backend is down, the disk is filled and freed, and callers
    keep calling, so new jobs would fill it to the reserve line; they are refused before
    the room the acknowledged jobs need to finish is taken, and once the backend is back
    every acknowledged job finishes."""
    with daemon_on_small_disk(short_tmp, 256 << 10) as daemon:
        disk = short_tmp / "fs"
        with Callers(daemon) as callers:
            wait(lambda: len(callers.refused) > 20, 120, "enqueues refused near full")
            assert "may need" in callers.refused[-1]
            rest = fill(disk, name="rest")  # full, then freed, the callers calling on
            time.sleep(0.5)
            rest.unlink()
            wait(lambda: len(callers.refused) > 40, 60, "refused again once refilled")
        acknowledged = list(callers.queued)
        assert len(acknowledged) > 100
        (short_tmp / "backend-up").touch()

        def finished() -> bool:
            jobs = daemon.call("GET", "/queue?state=done&limit=1000").body["jobs"]
            return set(acknowledged) <= {j["id"] for j in jobs}

        wait(finished, 120, "every acknowledged job done")
        stats = daemon.call("GET", "/queue/stats").body["by_state"]
        assert stats["pending"] == stats["leased"] == stats["dead"] == 0
