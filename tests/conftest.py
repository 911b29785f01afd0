"""Shared fixtures: real servers on 127.0.0.1 and Unix sockets, real files."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import DaemonProcess, FlipServer, Start, write_e2e_config
from tests.helpers.peers import PEER
from tests.helpers.pg import PostgresServer, postgres_server
from tests.helpers.servers import EXAMPLES, HttpServer

# The CLI prints JSON when its stdout is a pipe, as in every subprocess of these tests; the
# tests that read its tables ask for them the way an operator's script would. The tests of
# the piped default itself take the variable out.
os.environ["CAPD_OUTPUT"] = "table"




@pytest.fixture
async def http_server() -> AsyncIterator[HttpServer]:
    server = HttpServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temp folder: Unix socket paths must stay under 108 bytes."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="capd-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def plugin_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str, str], Path]]:
    """Write a plugin module into a folder on sys.path; returns a writer."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    written: list[str] = []

    def write(name: str, source: str) -> Path:
        path = folder / f"{name}.py"
        path.write_text(textwrap.dedent(source), encoding="utf-8")
        written.append(name)
        return path

    yield write
    for name in written:
        sys.modules.pop(name, None)


@pytest.fixture
def example_copy(tmp_path: Path) -> Path:
    """A private copy of examples/ so tests never write into the repository."""
    target = tmp_path / "example"
    shutil.copytree(EXAMPLES, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target




@pytest.fixture
def web() -> Iterator[FlipServer]:
    """A real HTTP tool on 127.0.0.1 whose health the test flips."""
    with FlipServer() as server:
        yield server


@pytest.fixture
def start(short_tmp: Path, web: FlipServer) -> Iterator[Start]:
    """Start the real daemon on the e2e pack; every one started is killed at the end."""
    started: list[DaemonProcess] = []

    def start_daemon(env: dict[str, str] | None = None, **settings: Any) -> DaemonProcess:
        config = write_e2e_config(short_tmp, web.port, **settings)
        daemon = DaemonProcess(config, short_tmp / "capd.sock", env=env).start().wait_ready()
        started.append(daemon)
        return daemon

    yield start_daemon
    for daemon in started:
        daemon.kill()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server (Unix socket only) for the session."""
    with postgres_server() as server:
        yield server


@pytest.fixture
def pg_url(postgres: PostgresServer) -> str:
    """A new empty database on it, for one test."""
    return postgres.new_database()


@pytest.fixture(scope="module")
def peer_uid() -> Iterator[int]:
    """A second uid, created here and removed afterwards (the tests run as root in CI)."""
    if os.geteuid() != 0:
        pytest.skip("creating a second user needs root")
    try:
        yield pwd.getpwnam(PEER).pw_uid  # there before us: not ours to remove
        return
    except KeyError:
        pass
    _accounts("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PEER)
    try:
        yield pwd.getpwnam(PEER).pw_uid
    finally:
        _accounts("userdel", PEER)


def _accounts(*command: str) -> None:
    """Run useradd or userdel, again while another test worker holds the passwd lock
    (exit 10: it cannot lock /etc/passwd)."""
    for _ in range(100):
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 10:
            break
        time.sleep(0.1)
    assert done.returncode == 0, done.stderr
