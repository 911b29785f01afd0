"""The daemon serves before its search index exists: a search waits for the index, a
call and /health do not, and an index that failed to build is tried again.

The daemon runs in this process (so the index build can be held at the edge, the
one fake here) on a real Unix socket, answered over real HTTP.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from capd.registry import Registry
from capd.sidecar.server._config import load_config
from capd.sidecar.server._daemon import Daemon


async def http(sock: Path, method: str, path: str, body: bytes = b"") -> tuple[int, Any]:
    reader, writer = await asyncio.open_unix_connection(str(sock))
    try:
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: capd\r\nConnection: close\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        raw = await reader.read()
    finally:
        writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload) if payload else None


@pytest.fixture
async def held_daemon(example_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                      ) -> Any:
    """The example daemon with its start-up index build held until ``release`` is set."""
    release = threading.Event()
    fail_first = {"left": 0}
    real = Registry.prepare_search

    def held(self: Registry, cache_dir: Path | None = None) -> Any:
        if not release.wait(timeout=30):
            raise TimeoutError("the test never released the index build")
        if fail_first["left"]:
            fail_first["left"] -= 1
            raise RuntimeError("embedding weights unreadable")
        return real(self, cache_dir)

    monkeypatch.setattr(Registry, "prepare_search", held)
    monkeypatch.setenv("CAPD_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("CAPD_VARS__VAULT", str(example_copy / "vault"))
    daemon = Daemon(load_config(example_copy / "capd.toml"), socket_path=tmp_path / "d.sock")
    task = asyncio.create_task(daemon.run())
    for _ in range(500):
        if daemon.state == "ready":
            break
        await asyncio.sleep(0.01)
    assert daemon.state == "ready"
    # Set when a search reaches the index (and waits for it while the build is held).
    arrived = asyncio.Event()
    real_index = daemon.search.index

    async def search_index(grant: Any = None) -> Any:
        arrived.set()
        return await real_index(grant)

    daemon.search.index = search_index  # type: ignore[method-assign]
    try:
        yield daemon, release, fail_first, arrived
    finally:
        release.set()
        daemon.request_stop()
        assert await asyncio.wait_for(task, timeout=15) == 0
        daemon.op_executor.shutdown()
        daemon.user_executor.shutdown()


async def test_health_and_calls_answer_while_the_index_builds(held_daemon: Any) -> None:
    daemon, release, _, arrived = held_daemon
    sock = daemon.socket_path
    status, body = await http(sock, "GET", "/health")
    assert status == 200
    assert body["status"] == "warn"  # the example's publishing service is missing on purpose
    status, result = await http(sock, "POST", "/call/notes.search", b'{"query": "milk"}')
    assert (status, result["status"]) == (200, "success")
    search = asyncio.create_task(http(sock, "GET", "/search?q=find+notes+containing+text"))
    await asyncio.wait_for(arrived.wait(), timeout=10)  # it waits on the held build
    assert not search.done(), "the search answered before its index existed"
    release.set()
    status, found = await asyncio.wait_for(search, timeout=20)
    assert status == 200
    assert found["results"][0]["name"] == "notes.search"


async def test_a_failed_index_build_is_a_503_and_the_next_search_retries(
        held_daemon: Any) -> None:
    daemon, release, fail_first, arrived = held_daemon
    fail_first["left"] = 1  # the start-up build fails, while a search waits for it
    search = asyncio.create_task(
        http(daemon.socket_path, "GET", "/search?q=find+notes+containing+text"))
    await asyncio.wait_for(arrived.wait(), timeout=10)  # it waits on the held build
    release.set()
    status, body = await asyncio.wait_for(search, timeout=20)
    assert status == 503
    assert "embedding weights unreadable" in body["detail"]
    assert "next search tries again" in body["detail"]
    status, found = await http(daemon.socket_path, "GET", "/search?q=find+notes+containing+text")
    assert status == 200
    assert found["results"][0]["name"] == "notes.search"


def test_success_boosts_are_made_again_at_most_every_max_age(tmp_path: Path) -> None:
    """The search boost from call outcomes is cached: recomputed after max_age_s only."""
    from capd.sidecar.server._gateway import ToolResult

    def outcome(status: str) -> ToolResult:
        return ToolResult.model_construct(status=status, capability="a.b", duration_s=0.0,
                                          request_id="r")

    daemon = Daemon(load_config(None), socket_path=tmp_path / "s.sock")
    try:
        daemon.gateway.stats.record(outcome("success"))
        first = daemon.search.boosts()
        assert first == {"a.b": 0.75 + 0.25 * 2 / 3}
        daemon.gateway.stats.record(outcome("error_permanent"))
        assert daemon.search.boosts() is first  # within a second: the same mapping
        assert daemon.search.boosts(max_age_s=0) == {"a.b": 0.75 + 0.25 * 2 / 4}
    finally:
        daemon.op_executor.shutdown()
        daemon.user_executor.shutdown()
