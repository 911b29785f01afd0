"""Start the real daemon as a subprocess and talk to it over its Unix socket."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from capd.sidecar.client._client import Response, request

from .servers import QuietHandler, ThreadedHttp


class DaemonProcess:
    """``capd serve`` in a subprocess; its JSON log lines are collected as they come."""

    def __init__(self, config: Path, socket: Path, env: dict[str, str] | None = None) -> None:
        self.config = config
        self.socket = socket
        self.env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
        self.events: list[dict[str, Any]] = []
        self.stderr = ""
        self._cond = threading.Condition()
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> DaemonProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "capd", "serve", "--config", str(self.config),
             "--socket", str(self.socket)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env,
        )
        self._readers = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for reader in self._readers:
            reader.start()
        return self

    def _close(self) -> None:
        assert self.proc is not None
        for reader in self._readers:
            reader.join(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def _read_stdout(self) -> None:
        assert self.proc is not None
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "unparsed", "line": line}
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def _read_stderr(self) -> None:
        assert self.proc is not None
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()

    def wait_event(self, name: str, timeout: float = 30.0,
                   where: Callable[[dict[str, Any]], bool] = lambda e: True) -> dict[str, Any]:
        """Block until a log event ``name`` (matching ``where``) has been printed."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self.events:
                    if event.get("event") == name and where(event):
                        return event
                left = deadline - time.monotonic()
                assert self.proc is not None
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(
                        f"no {name!r} event (exit={self.proc.poll()}); stderr: {self.stderr}; "
                        f"events: {self.events[-5:]}"
                    )
                self._cond.wait(min(left, 0.5))

    def wait_ready(self) -> DaemonProcess:
        self.wait_event("ready")
        return self

    def call(self, method: str, path: str, body: Any = None,
             headers: dict[str, str] | None = None) -> Response:
        return request(self.socket, method, path, body=body, headers=headers, timeout_s=30)

    def wait_until(self, check: Callable[[], bool], timeout: float = 15.0) -> None:
        """Poll ``check`` (bounded) for state the daemon reaches on its own schedule."""
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError("condition not reached in time")
            time.sleep(0.05)

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def stop(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self._close()
        return code

    def wait_exit(self, timeout: float = 20.0) -> int:
        """Wait for the process to exit on its own; return its status."""
        assert self.proc is not None
        code = self.proc.wait(timeout)
        self._close()
        return code

    def kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._close()


class FlipServer(ThreadedHttp):
    """A real HTTP server on 127.0.0.1 (in a thread) whose /health flips on command."""

    def __init__(self) -> None:
        self.healthy = True
        outer = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                status = 200 if outer.healthy else 503
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        super().__init__(Handler)


E2E_PACK = '''
import asyncio
import os

from pydantic import BaseModel, Field
from capd.registry import TransientToolError, op

VERSION = "v1"


class Text(BaseModel):
    text: str = Field("x", description="Text to echo.")


class Sleep(BaseModel):
    seconds: float = Field(1.0, ge=0, le=60, description="How long to sleep.")


@op("e2e.echo")
async def echo(params: Text) -> dict:
    return {"text": params.text, "version": VERSION}


@op("e2e.slow")
async def slow(params: Sleep) -> str:
    await asyncio.sleep(params.seconds)
    return "slept"


@op("e2e.flaky")
async def flaky(params: Text) -> None:
    raise TransientToolError("the backend is busy")


@op("e2e.hang")
def hang(params: Text) -> str:
    import time

    time.sleep(60)  # a plain op that never finishes in time
    return "too late"


async def gate_probe() -> bool:
    flag = os.environ.get("E2E_SLOW_FLAG", "")
    if flag and os.path.exists(flag):
        await asyncio.sleep(5)
    return True
'''

E2E_CAPS = '''
[[capability]]
name = "e2e.echo"
op = "e2e.echo"
summary = "Echo text and the plugin version."
requires = ["gate"]
tags = ["e2e"]

[[capability]]
name = "e2e.web"
op = "e2e.echo"
summary = "Echo, needing the web tool."
requires = ["web"]
tags = ["e2e"]

[[capability]]
name = "e2e.flaky"
op = "e2e.flaky"
summary = "A write whose backend is always busy, so it gets queued."
mutates_state = true
retry_policy = "replay"
tags = ["e2e"]

[[capability]]
name = "e2e.hang"
op = "e2e.hang"
summary = "A plain op that hangs past its timeout."
timeout_s = 1

[[capability]]
name = "e2e.slow"
op = "e2e.slow"
summary = "Sleep, then answer."
timeout_s = 30
'''


def write_e2e_config(folder: Path, web_port: int, **settings: Any) -> Path:
    """Write the e2e plugin, declarations and capd.toml into ``folder``."""
    (folder / "e2e_pack.py").write_text(E2E_PACK)
    (folder / "caps.toml").write_text(E2E_CAPS)
    values = {"recheck_cooldown_s": 0, "recheck_interval_s": 0.2,
              "probe_live_interval_s": 0.2, "drain_grace_s": 10, **settings}
    lines = ['plugins = ["e2e_pack"]', 'plugin_paths = ["."]', 'declarations = ["caps.toml"]',
             "entry_points = false", 'state_dir = "state"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    lines.append(textwrap.dedent(f"""
        [tools.web]
        kind = "http"
        url = "http://127.0.0.1:{web_port}/health"
        timeout_s = 1

        [tools.gate]
        kind = "python"
        target = "e2e_pack:gate_probe"
        timeout_s = 10
    """))
    config = folder / "capd.toml"
    config.write_text("\n".join(lines))
    return config


@contextlib.contextmanager
def daemons_on(folder: Path, write_config: Callable[[Path, str], Path]
               ) -> Iterator[Callable[..., DaemonProcess]]:
    """A starter of real daemons on ``write_config(folder, extra)``'s config and the
    socket ``folder/capd.sock``, each ready when it returns; all are killed on exit."""
    started: list[DaemonProcess] = []

    def start(extra: str = "") -> DaemonProcess:
        daemon = DaemonProcess(write_config(folder, extra), folder / "capd.sock").start()
        started.append(daemon)  # killed on exit even if it never becomes ready
        return daemon.wait_ready()

    try:
        yield start
    finally:
        for daemon in started:
            daemon.kill()


Start = Callable[..., DaemonProcess]
"""The ``start`` fixture: a real daemon on the e2e pack, ready when it returns."""
