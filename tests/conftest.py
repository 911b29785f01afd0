"""Shared fixtures: real servers on 127.0.0.1 and Unix sockets, real files."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web as aioweb

from .daemon import DaemonProcess, FlipServer, write_e2e_config
from .pg import PostgresServer, postgres_server

ROOT = Path(__file__).resolve().parent.parent

# The CLI prints JSON when its stdout is a pipe, as in every subprocess of these tests; the
# tests that read its tables ask for them the way an operator's script would. The tests of
# the piped default itself take the variable out.
os.environ["CAPD_OUTPUT"] = "table"
EXAMPLES = ROOT / "examples"


class HttpServer:
    """A real aiohttp server on 127.0.0.1 whose health can be flipped."""

    def __init__(self) -> None:
        self.healthy = True
        self.port = 0
        self.hits = 0
        self._runner: aioweb.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _health(self, _request: aioweb.Request) -> aioweb.Response:
        self.hits += 1
        return aioweb.json_response({"ok": self.healthy}, status=200 if self.healthy else 503)

    async def _slow(self, _request: aioweb.Request) -> aioweb.Response:
        await asyncio.sleep(5)
        return aioweb.Response(text="late")

    async def start(self) -> None:
        app = aioweb.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/slow", self._slow)
        self._runner = aioweb.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = aioweb.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


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


Start = Callable[..., DaemonProcess]


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
