"""The servers the dispatch benches drive: the peers' sources, and capd as an operator runs it.

Every server listens on a Unix socket in a temporary folder, runs pinned to the
bench core (``_harness.spawn``), logs to a file (never to a pipe this process
would have to drain), and answers ``POST /call/...`` with the same small JSON
body. The peers do no work beyond HTTP: they are what an HTTP stack costs, and
the raw asyncio Protocol server is the ceiling for any Python server on this
loop (it parses only the head's end and Content-Length).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from bench._harness import REPO, spawn, wait_http

RAW_SERVER = textwrap.dedent('''
    import asyncio, sys, uvloop

    BODY = b'{"status":"success","result":null}'
    ANSWER = (b"HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\nContent-Length: "
              + str(len(BODY)).encode() + b"\\r\\n\\r\\n" + BODY)

    class Http(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport
            self.buf = bytearray()

        def data_received(self, data):
            buf = self.buf
            buf += data
            while (end := buf.find(b"\\r\\n\\r\\n")) >= 0:
                head = bytes(buf[:end]).lower()
                at = head.find(b"\\ncontent-length:")
                if at >= 0:
                    stop = head.find(b"\\r", at + 16)
                    length = int(head[at + 16:stop if stop > 0 else end])
                else:
                    length = 0
                if len(buf) < end + 4 + length:
                    return
                del buf[:end + 4 + length]
                self.transport.write(ANSWER)

    async def main():
        server = await asyncio.get_running_loop().create_unix_server(Http, sys.argv[1])
        async with server:
            await server.serve_forever()

    uvloop.run(main())
''')

AIOHTTP_SERVER = textwrap.dedent('''
    import asyncio, json, sys, uvloop
    from aiohttp import web

    async def call(request):
        await request.read()
        return web.Response(text=json.dumps({"status": "success", "result": None}),
                            content_type="application/json")

    async def main():
        app = web.Application()
        app.router.add_post("/call/{name}", call)
        app.router.add_get("/health", call)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.UnixSite(runner, sys.argv[1]).start()
        await asyncio.Event().wait()

    uvloop.run(main())
''')

# A bare ASGI app, the same for uvicorn and granian: read the body, answer the JSON.
ASGI_APP = textwrap.dedent('''
    BODY = b'{"status":"success","result":null}'
    HEADERS = [(b"content-type", b"application/json"),
               (b"content-length", str(len(BODY)).encode())]

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        await send({"type": "http.response.body", "body": BODY})
''')


# capd's own HTTP server (flow control, deadlines, the buffer budget, peer credentials)
# with a handler that answers the same fixed body: what capd's HTTP layer costs alone.
CAPD_HTTP_SERVER = textwrap.dedent('''
    import asyncio, os, socket, sys, uvloop
    from capd.sidecar.server._api import peer_credentials
    from capd.sidecar.server._http import HttpResponse, HttpServer, ServerHooks

    BODY = b'{"status":"success","result":null}'

    async def handler(request):
        return HttpResponse(200, BODY)

    async def main():
        hooks = ServerHooks(handler=handler, peer_of=peer_credentials,
                            too_large=lambda: HttpResponse(413),
                            malformed=lambda detail: HttpResponse(400), max_body_bytes=1 << 20)
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(sys.argv[1])
        sock.listen(1024)
        await HttpServer(hooks).start(sock)
        await asyncio.Event().wait()

    uvloop.run(main())
''')


def installed(module: str) -> bool:
    """Whether ``module`` can be imported by the bench's interpreter."""
    return importlib.util.find_spec(module) is not None


@dataclass
class Server:
    """A running server: its process, socket and log file."""

    name: str
    proc: subprocess.Popen[bytes]
    sock: str
    log: Path


def start_peer(kind: str, folder: Path) -> Server:
    """Start the peer ``kind`` (raw, aiohttp, uvicorn, granian or capd-http) in ``folder``;
    wait for it."""
    folder.mkdir(parents=True, exist_ok=True)
    sock, log = str(folder / f"{kind}.sock"), folder / f"{kind}.log"
    python = sys.executable
    if kind == "raw":
        (folder / "raw_server.py").write_text(RAW_SERVER)
        argv = [python, str(folder / "raw_server.py"), sock]
    elif kind == "aiohttp":
        (folder / "aiohttp_server.py").write_text(AIOHTTP_SERVER)
        argv = [python, str(folder / "aiohttp_server.py"), sock]
    elif kind == "uvicorn":
        (folder / "bench_asgi.py").write_text(ASGI_APP)
        argv = [python, "-m", "uvicorn", "bench_asgi:app", "--uds", sock, "--http",
                "httptools", "--loop", "uvloop", "--lifespan", "off", "--no-access-log",
                "--log-level", "warning"]
    elif kind == "capd-http":
        (folder / "capd_http_server.py").write_text(CAPD_HTTP_SERVER)
        argv = [python, str(folder / "capd_http_server.py"), sock]
    elif kind == "granian":
        (folder / "bench_asgi.py").write_text(ASGI_APP)
        argv = [python, "-m", "granian", "--interface", "asgi", "--uds", sock, "--loop",
                "uvloop", "--workers", "1", "--runtime-threads", "1", "--no-ws",
                "--http", "1", "--no-access-log", "--log-level", "warning",
                "bench_asgi:app"]
    else:
        raise ValueError(f"unknown peer {kind!r}")
    proc = spawn(argv, cwd=folder, log=log)
    wait_http(sock, proc, "/health", log=log)
    return Server(kind, proc, sock, log)


def write_capd(folder: Path, *, pack: str, caps: str, config: str) -> Path:
    """A capd config folder: the plugin pack, its declarations, capd.toml; returns the config."""
    folder.mkdir(parents=True)
    (folder / "bench_pack.py").write_text(pack)
    (folder / "caps.toml").write_text(caps)
    (folder / "capd.toml").write_text(f'state_dir = "{folder}/state"\n' + config)
    return folder / "capd.toml"


def start_capd(folder: Path, *, pack: str, caps: str, config: str,
               env: dict[str, str] | None = None, root: Path = REPO) -> Server:
    """`capd serve` on a fresh config in ``folder``, ready (its build done) when this returns.

    The daemon logs one line per call to a file, as it would to journald.
    """
    path = write_capd(folder, pack=pack, caps=caps, config=config)
    sock, log = str(folder / "capd.sock"), folder / "capd.log"
    env = {**(env or os.environ), "PYTHONPATH": str(root)}
    proc = spawn([sys.executable, "-m", "capd", "serve", "--config", str(path), "--socket", sock],
                 cwd=folder, env=env, log=log)
    deadline = time.monotonic() + 60
    while b'"event":"ready"' not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"capd did not become ready; log: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    wait_http(sock, proc, "/health", log=log)
    return Server("capd", proc, sock, log)
