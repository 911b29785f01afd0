"""A fleet on one PostgreSQL queue, through real daemons: a host lost with its disk loses
nothing it acknowledged. Two daemons (their own state folders) share the queue; a write
queued by the first while its tool is down is finished by the second once the tool is back,
after the first was killed -9, and the line lands exactly once."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.daemon import DaemonProcess

pytestmark = pytest.mark.slow  # real daemons and a real PostgreSQL server

PACK = '''
from pathlib import Path

from pydantic import BaseModel, Field
from capd.registry import op

LINES = Path(__file__).with_name("lines.txt")


class Line(BaseModel):
    text: str = Field(description="The line to append.")


@op("fleet.append")
def append(params: Line) -> str:
    with LINES.open("a") as handle:
        handle.write(params.text + "\\n")
    return "appended"
'''

CAPS = '''
[[capability]]
name = "fleet.append"
op = "fleet.append"
summary = "Append a line to the shared file (its backend must be up)."
requires = ["backend"]
mutates_state = true
retry_policy = "replay"
timeout_s = 2  # a lost host's lease ends 3 s after its claim (timeout + lease_grace_s)
'''


def write_host(folder: Path, name: str, queue_url: str, extra: str = "") -> Path:
    """One host's capd.toml: its own state folder, the shared queue, the pack beside."""
    host = folder / name
    host.mkdir()
    config = host / "capd.toml"
    config.write_text(
        'plugins = ["fleet_pack"]\n'
        f'plugin_paths = ["{folder}"]\ndeclarations = ["{folder / "caps.toml"}"]\n'
        f'entry_points = false\nstate_dir = "state"\nqueue_url = "{queue_url}"\n'
        "recheck_cooldown_s = 0\nrecheck_interval_s = 0.2\nretry_base_s = 0.2\n"
        f"retry_cap_s = 0.5\nlease_grace_s = 1\n{extra}"
        f'\n[tools.backend]\nkind = "path"\npath = "{folder / "backend-up"}"\n')
    return config


@pytest.fixture
def fleet(short_tmp: Path, pg_url: str) -> Iterator[Callable[..., DaemonProcess]]:
    (short_tmp / "fleet_pack.py").write_text(PACK)
    (short_tmp / "caps.toml").write_text(CAPS)
    started: list[DaemonProcess] = []

    def start(name: str, extra: str = "", wait: bool = True) -> DaemonProcess:
        config = write_host(short_tmp, name, pg_url, extra)
        daemon = DaemonProcess(config, short_tmp / f"{name}.sock").start()
        started.append(daemon)
        return daemon.wait_ready() if wait else daemon

    try:
        yield start
    finally:
        for daemon in started:
            daemon.kill()


def test_a_job_queued_on_a_lost_host_is_finished_by_another_exactly_once(
        fleet: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    first = fleet("first")
    second = fleet("second")
    assert second.call("GET", "/status").body["queue"]["path"].startswith("postgresql://")
    answer = first.call("POST", "/call/fleet.append", {"text": "exactly once"})
    assert answer.status == 202, answer.body  # the backend is down: queued, acknowledged
    job = answer.body["queued"]
    assert second.call("GET", f"/queue/{job}").body["state"] in ("pending", "leased")
    first.kill()  # the host is lost, its disk with it
    (short_tmp / "backend-up").touch()  # the tool comes back
    deadline = time.monotonic() + 60
    while second.call("GET", f"/queue/{job}").body["state"] != "done":
        assert time.monotonic() < deadline, second.call("GET", f"/queue/{job}").body
        time.sleep(0.1)
    assert (short_tmp / "lines.txt").read_text() == "exactly once\n"
    trail = second.call("GET", f"/queue/{job}").body["trail"]
    finished = [a for a in trail if a["kind"] == "complete"]
    assert len(finished) == 1
    claimed_by = {a["boot_id"] for a in trail if a["kind"] == "claim"}
    assert len(claimed_by) == 1  # one daemon claimed it: the second (the first never could)
    time.sleep(1)  # nothing replays it again
    assert (short_tmp / "lines.txt").read_text() == "exactly once\n"
    listed = json.loads(json.dumps(second.call("GET", "/queue?state=done").body))
    assert [j["id"] for j in listed["jobs"]] == [job]


def test_a_verify_first_capability_checked_by_local_files_is_refused_with_a_shared_queue(
        fleet: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    (short_tmp / "caps.toml").write_text(CAPS + f'''
[[capability]]
name = "fleet.note"
op = "fleet.append"
summary = "Append, verified by a local file."
mutates_state = true
retry_policy = "verify_first"

[[capability.effects]]
kind = "file_contains"
path = "{short_tmp / 'lines.txt'}"
line = "{{text}}"
''')
    daemon = fleet("lonely", wait=False)
    assert daemon.wait_exit(60) == 1
    assert "fleet.note verifies a replay only by this host's files" in daemon.stderr
    assert "queue_url is a shared queue" in daemon.stderr
