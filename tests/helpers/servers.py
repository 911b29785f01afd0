"""Real servers on 127.0.0.1 for the tests, and where the repository is."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

from aiohttp import web as aioweb

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = ROOT / "examples"
TESTS = ROOT / "tests"
"""The tests' folder: fixtures, golden files, the npm MCP servers."""


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing (the tests' output is theirs)."""

    def log_message(self, *args: Any) -> None:
        return


class ThreadedHttp:
    """A real threaded HTTP server on 127.0.0.1 answering with ``handler``; served from
    ``with`` (or :meth:`start`) until its end (or :meth:`close`)."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> Self:
        self.thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


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
