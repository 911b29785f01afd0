"""sd_notify, the watchdog and socket activation, against real datagram and stream sockets."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capd.sidecar.client._client import request
from capd.sidecar.server._systemd import Notifier, run_watchdog, watchdog_interval_s
from tests.helpers.daemon import FlipServer, Start, write_e2e_config


class Listener:
    """A NOTIFY_SOCKET: a real datagram socket collecting what the daemon sends."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.path = path
        self.messages: list[str] = []

    def wait_for(self, field: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                message = self.sock.recv(4096).decode()
            except TimeoutError:
                continue
            self.messages.append(message)
            if field in message.split("\n"):
                return message
        raise AssertionError(f"no {field!r} in {self.messages}")

    def close(self) -> None:
        self.sock.close()


def test_abstract_notify_socket() -> None:
    """An @name NOTIFY_SOCKET is the abstract namespace."""
    name = f"capd-test-{os.getpid()}"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(b"\0" + name.encode())
    try:
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name})
        notifier.ready("3 live, 0 disabled")
        assert receiver.recv(1024) == b"READY=1\nSTATUS=3 live, 0 disabled"
        notifier.close()
    finally:
        receiver.close()


def test_nothing_happens_without_the_variables() -> None:
    """No NOTIFY_SOCKET: notify is a no-op; no WATCHDOG_USEC: no watchdog."""
    notifier = Notifier({})
    notifier.ready("x")
    assert (notifier.enabled, notifier.sent) == (False, [])
    assert watchdog_interval_s({}) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "4000000"}) == 2.0


async def test_watchdog_pings_at_half_the_interval(short_tmp: Path) -> None:
    """WATCHDOG=1 goes out once per half WATCHDOG_USEC (an injected sleep counts the waits)."""
    listener = Listener(short_tmp / "n.sock")
    notifier = Notifier({"NOTIFY_SOCKET": str(listener.path)})
    stop = asyncio.Event()
    waits: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 5:
            stop.set()

    interval = watchdog_interval_s({"WATCHDOG_USEC": "10000000"})
    assert interval == 5.0
    pings = await run_watchdog(notifier, interval, stop, sleep=fake_sleep)
    assert pings == 5
    assert waits == [5.0] * 5
    assert [listener.sock.recv(64) for _ in range(5)] == [b"WATCHDOG=1"] * 5
    listener.close()
    notifier.close()


@pytest.mark.slow
def test_daemon_notifies_ready_reloading_watchdog_and_stopping(
    start: Start, short_tmp: Path
) -> None:
    """The exact messages in order: READY after bind, RELOADING/READY around a reload, STOPPING."""
    listener = Listener(short_tmp / "notify.sock")
    try:
        daemon = start(env={"NOTIFY_SOCKET": str(listener.path), "WATCHDOG_USEC": "200000"})
        ready = listener.wait_for("READY=1")
        assert ready.split("\n")[0] == "READY=1"
        assert ready.split("\n")[1].startswith("STATUS=5 live, 0 disabled")
        assert daemon.socket.exists()  # READY came after the socket was bound
        listener.wait_for("WATCHDOG=1")
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        assert daemon.call("POST", "/reload").body["ok"] is True
        reloading = listener.wait_for("RELOADING=1").split("\n")
        usec = int(next(f for f in reloading if f.startswith("MONOTONIC_USEC="))[15:])
        assert before <= usec <= time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        listener.wait_for("READY=1")
        pings_before = sum(m == "WATCHDOG=1" for m in listener.messages)
        listener.wait_for("WATCHDOG=1")
        assert sum(m == "WATCHDOG=1" for m in listener.messages) > pings_before
        daemon.signal(signal.SIGTERM)
        listener.wait_for("STOPPING=1")
        assert daemon.wait_exit() == 0
        order = [m.split("\n")[0] for m in listener.messages if not m.startswith(
            ("WATCHDOG", "STATUS"))]
        assert order == ["READY=1", "RELOADING=1", "READY=1", "STOPPING=1"]
    finally:
        listener.close()


@pytest.mark.slow
def test_socket_activation_with_a_pre_bound_socket(short_tmp: Path, web: FlipServer) -> None:
    """LISTEN_FDS: the daemon serves on the socket it was handed and never unlinks it."""
    config = write_e2e_config(short_tmp, web.port)
    path = short_tmp / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    fd = listener.fileno()
    script = (f'LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=api exec "{sys.executable}" -m capd'
              f' serve --config "{config}" --socket "{short_tmp / "unused.sock"}" 3<&{fd}')
    proc = subprocess.Popen(["bash", "-c", script], pass_fds=(fd,), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    listener.close()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                reply = request(path, "GET", "/readyz", timeout_s=5)
                if reply.status == 200:
                    break
            except Exception:
                pass
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.1)
        status = request(path, "GET", "/status").body
        assert status["socket"] == str(path)
        assert not (short_tmp / "unused.sock").exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert path.exists()  # an inherited socket is never unlinked
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
