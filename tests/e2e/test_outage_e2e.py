"""A write queued while its tool is down waits out the outage: through the real daemon,
a real HTTP tool that goes down and comes back, the real queue and CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import DaemonProcess, FlipServer

pytestmark = pytest.mark.slow  # the real daemon and the CLI as processes

PACK = '''
import urllib.request
from pathlib import Path

from pydantic import BaseModel, Field
from capd.registry import ToolUnavailable, op


class Line(BaseModel):
    line: str = Field(description="The line to write.")


@op("out.write")
def write(params: Line, *, url: str, target: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            answer.read()
    except OSError as exc:
        raise ToolUnavailable(f"the sync server is down: {exc}", tool="sync") from exc
    with open(target, "a", encoding="utf-8") as handle:
        handle.write(params.line + "\\n")
    return "written"
'''


def write_config(folder: Path, web: FlipServer, **settings: object) -> Path:
    """The out pack (a write through a real HTTP tool), its declaration and capd.toml, with
    fast retries and rechecks; ``settings`` added to capd.toml."""
    (folder / "out_pack.py").write_text(PACK)
    (folder / "caps.toml").write_text(textwrap.dedent(f"""
        [[capability]]
        name = "out.write"
        op = "out.write"
        summary = "Write a line through the sync server."
        requires = ["sync"]
        mutates_state = true
        retry_policy = "replay"
        [capability.options]
        url = "http://127.0.0.1:{web.port}/health"
        target = "{folder / 'out.txt'}"
    """))
    values = {"retry_base_s": 0.05, "retry_cap_s": 0.1, "retry_max_attempts": 3,
              "recheck_cooldown_s": 0.2, "recheck_interval_s": 0.2,
              "probe_live_interval_s": 0.2, **settings}
    config = folder / "capd.toml"
    config.write_text('plugins = ["out_pack"]\nplugin_paths = ["."]\n'
                      'declarations = ["caps.toml"]\nentry_points = false\n'
                      'state_dir = "state"\n'
                      + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())
                      + f'\n[tools.sync]\nkind = "http"\n'
                      f'url = "http://127.0.0.1:{web.port}/health"\ntimeout_s = 1\n')
    return config


@pytest.fixture
def daemon(short_tmp: Path, web: FlipServer) -> Iterator[DaemonProcess]:
    config = write_config(short_tmp, web)
    started = DaemonProcess(config, short_tmp / "capd.sock").start().wait_ready()
    yield started
    started.kill()


def job(daemon: DaemonProcess, job_id: str) -> dict[str, Any]:
    body: dict[str, Any] = daemon.call("GET", f"/queue/{job_id}").body
    return body


def test_a_write_queued_in_an_outage_waits_it_out_and_lands_once(
        daemon: DaemonProcess, web: FlipServer, short_tmp: Path) -> None:
    """With retry_max_attempts = 3 and an outage of many recheck cooldowns, the queued
    write spends no attempt while its tool is known down (the sweep still tries it on
    the cooldown), says what it waits for, and lands exactly once after the tool is back."""
    web.healthy = False
    daemon.wait_until(lambda: daemon.call("GET", "/capabilities/out.write").body.get(
        "disabled") is not None)
    queued = daemon.call("POST", "/call/out.write", {"line": "hello"})
    assert queued.status == 202, queued.body
    job_id = queued.body["queued"]

    def claims() -> int:
        return sum(a["kind"] == "claim" for a in job(daemon, job_id)["trail"])

    daemon.wait_until(lambda: claims() >= 6, timeout=30)  # twice the attempts allowed
    during = job(daemon, job_id)
    assert during["state"] in ("pending", "leased"), during
    assert during["attempts"] <= 1  # the try count, beside its trail
    assert during["waiting_for"].startswith("tool sync down since ")
    listed = subprocess.run([sys.executable, "-m", "capd", "queue", "list", "-o", "table",
                             "--socket", str(daemon.socket)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert "tool sync down since" in listed.stdout, listed.stdout
    assert not (short_tmp / "out.txt").exists()

    web.healthy = True
    daemon.wait_until(lambda: job(daemon, job_id)["state"] == "done", timeout=30)
    assert (short_tmp / "out.txt").read_text() == "hello\n"
    time.sleep(1)  # nothing replays a finished job again
    assert (short_tmp / "out.txt").read_text() == "hello\n"
    done = subprocess.run([sys.executable, "-m", "capd", "queue", "list", "-o", "json",
                           "--socket", str(daemon.socket)], capture_output=True, text=True,
                          timeout=60, check=False)
    [shown] = json.loads(done.stdout)["jobs"]
    assert "waiting_for" not in shown



def test_done_jobs_are_removed_after_the_retention(short_tmp: Path, web: FlipServer) -> None:
    """queue_retention_s = 1: a done job is gone from the queue soon after (logged as
    queue_expired); /health's queue check counts only the current jobs."""
    config = write_config(short_tmp, web, retry_cap_s=300.0, retry_max_attempts=8,
                          queue_retention_s=1)
    daemon = DaemonProcess(config, short_tmp / "capd.sock").start().wait_ready()
    try:
        web.healthy = False
        daemon.wait_until(lambda: daemon.call("GET", "/capabilities/out.write").body.get(
            "disabled") is not None)
        job_id = daemon.call("POST", "/call/out.write", {"line": "once"}).body["queued"]
        web.healthy = True
        daemon.wait_until(lambda: job(daemon, job_id).get("state") == "done", timeout=30)
        daemon.wait_until(lambda: daemon.call("GET", f"/queue/{job_id}").status == 404,
                          timeout=30)
        event = daemon.wait_event("queue_expired")
        assert event["removed"] >= 1
        health = daemon.call("GET", "/health").body
        assert "done" not in health["checks"]["queue:jobs"][0]["observedValue"]
        stats = daemon.call("GET", "/queue/stats").body
        assert stats["by_state"]["done"] == 0
    finally:
        daemon.kill()
