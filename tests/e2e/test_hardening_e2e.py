"""The core promise under real conditions, against the real daemon on a real socket.

Nothing the user wrote blocks the loop; a write that may have landed is never
done twice; untyped network errors queue the write; bad input gets a problem
body, never a bare 500; one daemon per state directory; a full disk degrades.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from capd.sidecar.client._client import Response, _UnixConnection, request
from tests.helpers.daemon import DaemonProcess, FlipServer
from tests.helpers.disks import fill, tmpfs

pytestmark = pytest.mark.slow  # starts the real daemon or the CLI as processes

PACK = '''
import os
import socket
import time
from pathlib import Path

from pydantic import BaseModel, Field
from capd.registry import op

HERE = Path(__file__).parent


class Write(BaseModel):
    line: str = Field(description="The line to write.")
    seconds: float = Field(0.0, ge=0, le=30, description="Sleep this long first.")


class Empty(BaseModel):
    pass


class AnyValue(BaseModel):
    value: object = Field(None, description="Any JSON value.")


class Loose(BaseModel):
    model_config = {"extra": "ignore"}
    text: str = "x"


def blocking_probe() -> bool:
    """Blocks its thread (never the loop) while armed, until released."""
    if (HERE / "armed").exists():
        (HERE / "probe-started").touch()
        deadline = time.monotonic() + 20
        while not (HERE / "released").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    return True


@op("hard.slow_write")
def slow_write(params: Write, *, target: str) -> str:
    time.sleep(params.seconds)
    with open(target, "a", encoding="utf-8", newline="") as handle:
        handle.write(params.line + "\\n")
    return "written"


@op("hard.refused")
def refused(params: Write, *, target: str) -> str:
    with socket.create_connection(("127.0.0.1", int(os.environ["HARD_DEAD_PORT"])), 1):
        pass
    return "unreachable"


@op("hard.echo_any")
async def echo_any(params: AnyValue) -> object:
    return params.value


@op("hard.bigint")
def bigint(params: Empty) -> dict:
    return {"big": 2 ** 70, "small": 1}


@op("hard.circular")
def circular(params: Empty) -> dict:
    value: dict = {}
    value["self"] = value
    return value


@op("hard.loose")
async def loose(params: Loose) -> str:
    return params.text
'''

CAPS = '''
[[capability]]
name = "hard.slow_write"
op = "hard.slow_write"
summary = "Append a line after a delay; its thread outlives its timeout."
requires = ["local"]
mutates_state = true
retry_policy = "verify_first"
timeout_s = 1
options = { target = "{out}" }

[[capability.effects]]
kind = "file_contains"
path = "{target}"
line = "{line}"

[[capability]]
name = "hard.refused"
op = "hard.refused"
summary = "A write whose service refuses the connection."
requires = ["local", "web"]
mutates_state = true
retry_policy = "replay"
options = { target = "{out}" }

[[capability]]
name = "hard.echo_any"
op = "hard.echo_any"
summary = "Echo any JSON value."

[[capability]]
name = "hard.bigint"
op = "hard.bigint"
summary = "Answer an integer past 64 bits."

[[capability]]
name = "hard.circular"
op = "hard.circular"
summary = "Answer a value JSON cannot hold."

[[capability]]
name = "hard.loose"
op = "hard.loose"
summary = "A model that opts in to unknown keys."
'''


def write_config(folder: Path, web_port: int, state_dir: Path | None = None,
                 **settings: Any) -> Path:
    """The hardening pack, its declarations and capd.toml in ``folder``."""
    (folder / "hard_pack.py").write_text(PACK)
    (folder / "caps.toml").write_text(CAPS)
    values = {"recheck_cooldown_s": 0, "recheck_interval_s": 0.2,
              "probe_live_interval_s": 3600, "verify_grace_s": 0.2, "retry_base_s": 0.2,
              "drain_grace_s": 5, **settings}
    lines = ['plugins = ["hard_pack"]', 'plugin_paths = ["."]', 'declarations = ["caps.toml"]',
             "entry_points = false", f"state_dir = {json.dumps(str(state_dir or 'state'))}"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    lines.append(textwrap.dedent(f"""
        [vars]
        out = "{folder}/out.txt"

        [tools.local]
        kind = "python"
        target = "hard_pack:blocking_probe"
        timeout_s = 30

        [tools.web]
        kind = "http"
        url = "http://127.0.0.1:{web_port}/health"
        timeout_s = 1

        [tools.folder]
        kind = "path"
        path = "{folder}"
        timeout_s = 1
    """))
    config = folder / "capd.toml"
    config.write_text("\n".join(lines))
    return config


@pytest.fixture
def dead_port() -> int:
    """A port on 127.0.0.1 that refuses connections."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def hard(short_tmp: Path, web: FlipServer, dead_port: int
         ) -> Iterator[Callable[..., DaemonProcess]]:
    """Start the real daemon on the hardening pack; every one started is killed at the end."""
    started: list[DaemonProcess] = []

    def start(**settings: Any) -> DaemonProcess:
        config = write_config(short_tmp, web.port, **settings)
        daemon = DaemonProcess(config, short_tmp / "capd.sock",
                               env={"HARD_DEAD_PORT": str(dead_port)}).start().wait_ready()
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.kill()


def _raw_post(socket_path: Path, path: str, raw: bytes) -> Response:
    """POST bytes as they are (json.dumps cannot write what these tests send)."""
    conn = _UnixConnection(socket_path, 10)
    try:
        conn.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
        answer = conn.getresponse()
        data = answer.read()
    finally:
        conn.close()
    return Response(answer.status, answer.getheader("Content-Type") or "", json.loads(data), {})


def _wait_file(path: Path, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _job(daemon: DaemonProcess, job_id: str) -> dict[str, Any]:
    response = daemon.call("GET", f"/queue/{job_id}")
    assert response.status == 200, response.body
    body: dict[str, Any] = response.body
    return body


def _wait_job(daemon: DaemonProcess, job_id: str, states: set[str],
              timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = _job(daemon, job_id)
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, f"job stayed {job['state']}: {job}"
        time.sleep(0.05)


# ------------------------------------------------------------ the loop never waits


def test_a_blocking_python_probe_never_freezes_health_or_disables_healthy_tools(
    hard: Callable[..., DaemonProcess], short_tmp: Path
) -> None:
    """A plain probe blocked for 2 s during a reload: /health answers meanwhile, nothing healthy
    is disabled."""
    daemon = hard()
    (short_tmp / "armed").touch()
    outcome: dict[str, Any] = {}
    reloader = threading.Thread(
        target=lambda: outcome.update(r=daemon.call("POST", "/reload")), daemon=True)
    reloader.start()
    _wait_file(short_tmp / "probe-started")
    time.sleep(2.0)  # the probe's thread stays blocked this long (well past web's 1 s timeout)
    # If the probe ran on the loop, this request would wait for the release that follows it.
    health = request(daemon.socket, "GET", "/health", timeout_s=5)
    assert health.status in (200, 503)
    assert health.body["status"] in ("pass", "warn")
    assert not (short_tmp / "released").exists()
    (short_tmp / "released").touch()
    reloader.join(30)
    assert outcome["r"].status == 200, outcome["r"].body
    caps = {c["name"]: c for c in daemon.call("GET", "/capabilities").body["capabilities"]}
    assert caps["hard.refused"]["state"] == "live", caps["hard.refused"]


# ------------------------------------------------- a write is never done twice


def test_a_slow_plain_write_that_outlives_its_timeout_is_never_done_twice(
    hard: Callable[..., DaemonProcess], short_tmp: Path
) -> None:
    """verify_first waits for the abandoned thread; its landed line (with \\r, \\x85, \\u2028)
    is verified, not replayed."""
    daemon = hard()
    line = "landed\rlate\x85and\u2028odd"
    response = daemon.call("POST", "/call/hard.slow_write", {"line": line, "seconds": 3})
    assert response.status == 202, response.body
    assert "still running" in response.body["message"]
    job = _wait_job(daemon, response.body["queued"], {"done", "partial", "dead",
                                                       "needs_operator"})
    assert job["state"] == "done", job
    written = (short_tmp / "out.txt").read_bytes()
    assert written == (line + "\n").encode(), written
    kinds = [a["kind"] for a in job["trail"]]
    assert "postpone" in kinds, kinds
    verify = [a for a in job["trail"] if a["kind"] == "verify"]
    assert verify, job["trail"]
    assert verify[-1]["outcome"] == "verified", job["trail"]


def test_an_untyped_connection_refused_write_is_queued_and_its_tool_marked_down(
    hard: Callable[..., DaemonProcess], web: FlipServer
) -> None:
    """ConnectionRefusedError from a mutating op: 202 queued, and its network tool goes down."""
    daemon = hard()
    response = daemon.call("POST", "/call/hard.refused", {"line": "x"})
    assert response.status == 202, response.body
    assert response.body["status"] == "error_transient"
    assert response.body["error_type"] == "ConnectionRefusedError"
    assert response.body["queued"]
    caps = {c["name"]: c for c in daemon.call("GET", "/capabilities").body["capabilities"]}
    # the local tool stays up; the network tool it reached was marked down (the probe heals it)
    assert caps["hard.slow_write"]["state"] == "live"
    daemon.wait_event("passive_disable", where=lambda e: e.get("tools") == ["web"])


# ------------------------------------------------------------- bad input


def test_bad_input_gets_a_problem_body_never_a_bare_500(
    hard: Callable[..., DaemonProcess], short_tmp: Path
) -> None:
    """Deep nesting, null, unknown params and a bogus state are 400/422; a 2**70 result is 200."""
    daemon = hard()
    for depth in (300, 1000):
        raw = b'{"value":' + b"[" * depth + b"]" * depth + b"}"
        response = _raw_post(daemon.socket, "/call/hard.echo_any", raw)
        assert response.status == 400, (depth, response.body)
        assert "nests deeper" in response.body["detail"]
    shallow = daemon.call("POST", "/call/hard.echo_any", {"value": [[[[1]]]]})
    assert (shallow.status, shallow.body["result"]) == (200, [[[[1]]]])
    null = _raw_post(daemon.socket, "/call/hard.bigint", b"null")
    assert null.status == 400
    assert "null" in null.body["detail"]
    typo = daemon.call("POST", "/call/hard.slow_write", {"line": "x", "secnods": 1})
    assert typo.status == 422, typo.body
    assert typo.body["errors"][0]["loc"] == ["secnods"]
    assert not (short_tmp / "out.txt").exists()
    opted_in = daemon.call("POST", "/call/hard.loose", {"text": "y", "other": 1})
    assert (opted_in.status, opted_in.body["result"]) == (200, "y")
    bogus = daemon.call("GET", "/queue?state=bogus")
    assert bogus.status == 400
    assert "unknown state" in bogus.body["detail"]
    big = daemon.call("POST", "/call/hard.bigint", {})
    assert big.status == 200, big.body
    assert big.body["result"] == {"big": 2 ** 70, "small": 1}
    circular = daemon.call("POST", "/call/hard.circular", {})
    assert circular.status == 502, circular.body
    assert circular.body["error_type"] == "result_unencodable"
    assert "do not retry" in circular.body["message"]
    assert daemon.call("GET", "/livez").status == 200


# --------------------------------------------------- one daemon, its own folders


def test_a_second_daemon_on_the_same_state_dir_exits_naming_the_holder(
    hard: Callable[..., DaemonProcess], short_tmp: Path
) -> None:
    """Two daemons would sweep one queue: the second exits 1 with the first one's pid."""
    first = hard()
    assert first.proc is not None
    second = DaemonProcess(first.config, short_tmp / "other.sock").start()
    assert second.wait_exit(30) == 1
    assert f"pid {first.proc.pid}" in second.stderr, second.stderr
    assert "state directory" in second.stderr
    assert first.call("GET", "/livez").status == 200


def test_serve_without_a_config_exits_1_and_says_what_to_do(tmp_path: Path) -> None:
    """No --config, no CAPD_CONFIG, no ./capd.toml: exit 1, never an empty daemon."""
    env = {k: v for k, v in os.environ.items() if k != "CAPD_CONFIG"}
    done = subprocess.run([sys.executable, "-m", "capd", "serve", "--socket",
                           str(tmp_path / "s.sock")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done
    assert "no config found" in done.stderr
    assert "--config" in done.stderr
    assert not (tmp_path / "s.sock").exists()


def test_an_empty_queue_file_is_refused_not_reinitialised(
    short_tmp: Path, web: FlipServer
) -> None:
    """A zero-length queue.db may hold nothing capd wrote: the daemon refuses it and exits 1."""
    config = write_config(short_tmp, web.port)
    (short_tmp / "state").mkdir()
    (short_tmp / "state" / "queue.db").write_bytes(b"")
    daemon = DaemonProcess(config, short_tmp / "capd.sock").start()
    assert daemon.wait_exit(30) == 1
    assert "empty" in daemon.stderr, daemon.stderr
    assert (short_tmp / "state" / "queue.db").stat().st_size == 0


def test_a_world_writable_socket_folder_is_refused(short_tmp: Path, web: FlipServer) -> None:
    """A socket folder others may write in (no sticky bit) is refused with the fix named."""
    config = write_config(short_tmp, web.port)
    folder = short_tmp / "run"
    folder.mkdir()
    folder.chmod(0o777)
    daemon = DaemonProcess(config, folder / "capd.sock").start()
    assert daemon.wait_exit(30) == 1
    assert "writable by every user" in daemon.stderr
    assert "chmod 750" in daemon.stderr
    assert not (folder / "capd.sock").exists()


# ----------------------------------------------------------- a full disk


@pytest.fixture
def small_tmpfs(short_tmp: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, unmounted at the end."""
    with tmpfs(short_tmp / "disk", "4m") as mount:
        yield mount


def _fill(folder: Path) -> Path:
    """Write a filler file until the filesystem is full."""
    return fill(folder)


def test_a_full_disk_degrades_the_daemon_never_kills_it(
    short_tmp: Path, web: FlipServer, dead_port: int, small_tmpfs: Path
) -> None:
    """Disk full: health fails with the cause, writes say NOT queued: disk full, reads work;
    space back: it heals by itself."""
    # the disk's own limit, without the reserve kept for the sweep (tested on its own)
    config = write_config(short_tmp, web.port, state_dir=small_tmpfs / "state",
                          queue_reserve_bytes=0)
    daemon = DaemonProcess(config, short_tmp / "capd.sock",
                           env={"HARD_DEAD_PORT": str(dead_port)}).start().wait_ready()
    try:
        queued = daemon.call("POST", "/call/hard.refused", {"line": "before"})
        assert queued.status == 202, queued.body
        filler = _fill(small_tmpfs)
        refused = daemon.call("POST", "/call/hard.refused", {"line": "during"})
        assert refused.status == 503, refused.body
        assert refused.body["queued"] is None
        assert "NOT queued: disk full" in refused.body["message"], refused.body
        assert "cannot rollback" not in refused.body["message"]
        health = daemon.call("GET", "/health")
        assert health.status == 503, health.body
        assert health.body["status"] == "fail", health.body
        assert "disk full" in health.body["output"], health.body
        # the sweep hits the full disk too (it retries every job of the queue): still serving
        daemon.wait_event("sweep_storage_failed", timeout=20)
        assert daemon.call("GET", "/capabilities").status == 200
        listed = daemon.call("GET", "/queue")
        assert listed.status == 200
        assert len(listed.body["jobs"]) == 1
        filler.unlink()
        daemon.wait_until(lambda: daemon.call("POST", "/call/hard.refused",
                                              {"line": "after"}).status == 202, timeout=30)
        daemon.wait_until(lambda: daemon.call("GET", "/health").body["status"] != "fail",
                          timeout=30)
        assert daemon.proc is not None
        assert daemon.proc.poll() is None
        assert len(daemon.call("GET", "/queue").body["jobs"]) >= 2
    finally:
        daemon.kill()
        shutil.rmtree(small_tmpfs / "state", ignore_errors=True)
