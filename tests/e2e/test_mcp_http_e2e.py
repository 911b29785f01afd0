"""The MCP front door over streamable HTTP, through the real daemon and the SDK client:
bearer tokens (created, listed, revoked with the CLI), a token's grant on every surface,
401 without one, 403 for a foreign Origin, a revoked token refused on its next request."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import DaemonProcess, daemons_on, write_e2e_config

pytestmark = pytest.mark.slow  # the real daemon, its HTTP front door and the SDK client

PY = sys.executable


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def up(short_tmp: Path, port: int) -> Iterator[Callable[..., DaemonProcess]]:
    def write(folder: Path, extra: str) -> Path:
        config = write_e2e_config(folder, free_port())
        config.write_text(config.read_text() + f"""
[profiles.reader]
capabilities = ["e2e.echo"]

[mcp.http]
listen = "127.0.0.1:{port}"
""" + extra)
        return config

    with daemons_on(short_tmp, write) as start:
        yield start


def capd(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "capd", *args, "--socket", str(daemon.socket)],
                          capture_output=True, text=True, timeout=60, check=False)


def make_token(daemon: DaemonProcess, *args: str) -> str:
    made = capd(daemon, "token", "create", *args, "--json")
    assert made.returncode == 0, made.stderr
    token: str = json.loads(made.stdout)["token"]
    return token


async def session_calls(url: str, token: str, work: Callable[[Any], Any]) -> Any:
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                  timeout=30) as http, \
            streamable_http_client(url, http_client=http) as streams, \
            ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        return await work(session)


def post(url: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}}).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_a_token_lists_searches_and_calls_within_its_grant(
        up: Callable[..., DaemonProcess], port: int) -> None:
    """An SDK client over streamable HTTP with a token bound to a profile lists the meta
    tools, searches and calls what the profile takes in; anything else is unknown."""
    daemon = up()
    token = make_token(daemon, "--profile", "reader", "--name", "reader-agent")
    url = f"http://127.0.0.1:{port}/mcp"

    async def work(session: Any) -> dict[str, Any]:
        tools = [t.name for t in (await session.list_tools()).tools]
        found = await session.call_tool("search_capabilities", {"query": "echo text"})
        called = await session.call_tool("invoke_capability", {
            "id": "e2e.echo", "arguments": {"text": "over http"}})
        hidden = await session.call_tool("invoke_capability", {
            "id": "e2e.slow", "arguments": {"seconds": 0}})
        listed = await session.call_tool("list_capabilities", {})
        return {"tools": tools, "found": found.structured_content,
                "called": called.structured_content, "hidden": hidden,
                "listed": listed.structured_content}

    seen = asyncio.run(session_calls(url, token, work))
    assert "invoke_capability" in seen["tools"]
    assert [r["name"] for r in seen["found"]["results"]] == ["e2e.echo"]
    assert seen["called"]["status"] == "success", seen["called"]
    assert seen["called"]["result"]["text"] == "over http"
    assert seen["hidden"].is_error is True
    assert "unknown capability" in seen["hidden"].content[0].text.lower()
    assert [c["name"] for c in seen["listed"]["capabilities"]] == ["e2e.echo"]
    listing = capd(daemon, "token", "list", "--json")
    assert listing.returncode == 0, listing.stderr
    [record] = json.loads(listing.stdout)["tokens"]
    assert (record["name"], record["profile"], record["state"]) == (
        "reader-agent", "reader", "active")
    assert record["last_used_at"] >= record["created_at"]  # the session's requests used it
    assert "hash" not in record
    assert "token" not in record
    assert token not in (Path(daemon.socket).parent / "state" / "tokens.json").read_text()


def test_no_token_a_bad_one_a_foreign_origin_and_a_revoked_one_are_refused(
        up: Callable[..., DaemonProcess], port: int) -> None:
    """401 with WWW-Authenticate without a token or with a bad one, 403 for a foreign
    Origin (before the token is even read), and a revoked token refused on its next
    request in a session it had opened."""
    daemon = up()
    url = f"http://127.0.0.1:{port}/mcp"
    status, headers, _body = post(url, {})
    assert status == 401
    assert headers["www-authenticate"].startswith('Bearer realm="capd"')
    status, headers, _body = post(url, {"Authorization": "Bearer capd_nope"})
    assert status == 401
    assert 'error="invalid_token"' in headers["www-authenticate"]
    token = make_token(daemon, "--allow", "e2e.echo", "--name", "short-lived")
    status, _headers, body = post(url, {"Authorization": f"Bearer {token}",
                                        "Origin": "http://evil.example"})
    assert status == 403, body
    status, _headers, _body = post(url, {"Authorization": f"Bearer {token}"})
    assert status == 200
    other = make_token(daemon, "--allow", "e2e.echo", "--name", "other")
    assert other != token

    async def revoked_mid_session(session: Any) -> Any:
        first = await session.call_tool("invoke_capability", {
            "id": "e2e.echo", "arguments": {"text": "before"}})
        assert first.structured_content["status"] == "success"
        revoke = await asyncio.to_thread(capd, daemon, "token", "revoke", "short-lived")
        assert revoke.returncode == 0, revoke.stderr
        from mcp.shared.exceptions import MCPError

        with pytest.raises(MCPError, match="error response"):  # the 401, as the SDK says it
            await session.call_tool("invoke_capability", {
                "id": "e2e.echo", "arguments": {"text": "after"}})
        return True

    assert asyncio.run(asyncio.wait_for(session_calls(url, token, revoked_mid_session), 60))
    status, headers, _body = post(url, {"Authorization": f"Bearer {token}"})
    assert status == 401
    assert "revoked" in headers["www-authenticate"]


def test_operator_rows_are_refused_to_a_token_and_tokens_need_the_operator(
        up: Callable[..., DaemonProcess], port: int) -> None:
    """A token's grant is an agent's: the front door offers no operator rows; an agent on
    the socket cannot make tokens (403); a token for an unknown profile is 404."""
    daemon = up("""
[[peers]]
gid = 4343
profile = "reader"
""")
    unknown = capd(daemon, "token", "create", "--profile", "nobody")
    assert unknown.returncode != 0
    assert "unknown profile" in unknown.stderr
    bare = capd(daemon, "token", "create")
    assert bare.returncode != 0
    assert "--profile or --allow" in bare.stderr
    for row in (["token", "list"], ["token", "create", "--profile", "reader"]):
        agent = subprocess.run(["setpriv", "--groups=4343", "--", PY, "-m", "capd", *row,
                                "--socket", str(daemon.socket)],
                               capture_output=True, text=True, timeout=60, check=False)
        assert agent.returncode != 0
        assert "for operators only" in agent.stderr, agent.stderr

    token = make_token(daemon, "--profile", "reader")

    async def tools(session: Any) -> list[str]:
        return [t.name for t in (await session.list_tools()).tools]

    names = asyncio.run(session_calls(f"http://127.0.0.1:{port}/mcp", token, tools))
    assert "reload" not in names
    assert "recheck" not in names


def test_half_sent_connections_never_keep_a_token_holder_out(
        up: Callable[..., DaemonProcess], port: int) -> None:
    """1,100 connections that send half a request head and hold it (a local user with no
    token) are evicted past the cap and closed at the head timeout; meanwhile a token
    holder is answered and the Unix socket serves."""
    daemon = up("head_timeout_s = 2\n")
    token = make_token(daemon, "--profile", "reader")
    held: list[socket.socket] = []
    try:
        for _ in range(1100):
            conn = socket.create_connection(("127.0.0.1", port), timeout=5)
            conn.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: applic")
            held.append(conn)
        status, _, body = post(f"http://127.0.0.1:{port}/mcp",
                               {"Authorization": f"Bearer {token}"})  # urlopen: 30 s at most
        assert status == 200, body
        assert daemon.call("GET", "/health").status == 200
        # the ones not evicted are closed once their head is 2 s late
        closed = 0
        for conn in held:
            conn.settimeout(10)
            try:
                closed += conn.recv(1) == b""
            except TimeoutError:  # still open: not closed
                pass
            except OSError:  # reset: closed all the same
                closed += 1
        assert closed == len(held)
    finally:
        for conn in held:
            conn.close()
    evicted = daemon.wait_event("mcp_http_connection_evicted")
    assert evicted["evicted"] >= 1


def test_mcp_http_follows_a_reload(up: Callable[..., DaemonProcess], port: int) -> None:
    """[mcp.http] changed at reload takes effect then: allowed_origins, a new listen (the
    old port closes), the table removed (no door) and added back; an address that cannot
    be bound fails the reload and the door serving keeps serving; status shows the door."""
    daemon = up()
    token = make_token(daemon, "--profile", "reader")
    config = Path(daemon.config)
    url = f"http://127.0.0.1:{port}/mcp"
    browser = {"Origin": "http://localhost:3000", "Authorization": f"Bearer {token}"}
    assert post(url, browser)[0] == 403
    text = config.read_text()
    config.write_text(text + 'allowed_origins = ["http://localhost:*"]\n')
    assert capd(daemon, "reload").returncode == 0
    assert post(url, browser)[0] == 200

    other = free_port()
    config.write_text(text.replace(f"127.0.0.1:{port}", f"127.0.0.1:{other}"))
    assert capd(daemon, "reload").returncode == 0
    assert post(f"http://127.0.0.1:{other}/mcp", {"Authorization": f"Bearer {token}"})[0] == 200
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    status = json.loads(capd(daemon, "status", "--json").stdout)
    assert status["mcp"]["http"]["listen"] == f"127.0.0.1:{other}"
    assert status["mcp"]["http"]["serving"] is True

    with socket.socket() as holder:  # an address another program holds
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        taken = holder.getsockname()[1]
        config.write_text(text.replace(f"127.0.0.1:{port}", f"127.0.0.1:{taken}"))
        failed = capd(daemon, "reload")
        assert failed.returncode == 1
        assert "[mcp.http] listen" in failed.stderr, failed.stderr
    assert post(f"http://127.0.0.1:{other}/mcp", {"Authorization": f"Bearer {token}"})[0] == 200

    config.write_text(text.split("[mcp.http]")[0])
    assert capd(daemon, "reload").returncode == 0
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", other), timeout=5).close()
    assert json.loads(capd(daemon, "status", "--json").stdout)["mcp"]["http"] is None
    config.write_text(text)
    assert capd(daemon, "reload").returncode == 0
    assert post(url, {"Authorization": f"Bearer {token}"})[0] == 200


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made by openssl for this test."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True,
                   timeout=60)
    return cert, key


def test_tls_handshakes_are_timed_and_a_bad_certificate_fails_the_reload(
        up: Callable[..., DaemonProcess], port: int, short_tmp: Path) -> None:
    """With TLS, connections that never start a handshake are closed at head_timeout_s (a
    handshake is bounded too); a token holder is served over TLS meanwhile; a reload that
    names a certificate that cannot be read fails, and the door keeps serving."""
    import ssl

    cert, key = _self_signed(short_tmp)
    daemon = up(f'tls_cert = "{cert}"\ntls_key = "{key}"\nhead_timeout_s = 1\n'
                "max_connections = 16\n")
    token = make_token(daemon, "--profile", "reader")
    # more silent connections than the cap: handshakes are counted and evicted like any
    # connection, and the listener keeps accepting (a refusal must never stop it)
    silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(50)]
    try:
        context = ssl.create_default_context(cafile=str(cert))
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}}).encode()
        request = urllib.request.Request(
            f"https://127.0.0.1:{port}/mcp", data=body, method="POST", headers={
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
                "Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30, context=context) as answer:
            assert answer.status == 200
        closed = 0
        for conn in silent:
            try:
                closed += conn.recv(1) == b""
            except TimeoutError:  # still open after 10 s: not closed
                pass
            except OSError:  # reset: closed all the same
                closed += 1
        assert closed == len(silent)
    finally:
        for conn in silent:
            conn.close()
    for conn in silent:
        conn.close()
    with urllib.request.urlopen(request, timeout=30, context=context) as answer:
        assert answer.status == 200  # still accepting after them
        assert answer.headers["Date"]  # as a server with a clock must say
    config = Path(daemon.config)
    config.write_text(config.read_text().replace(str(cert), str(short_tmp / "missing.pem")))
    failed = capd(daemon, "reload")
    assert failed.returncode == 1
    assert "tls_cert" in failed.stderr, failed.stderr
    status = json.loads(capd(daemon, "status", "--json").stdout)["mcp"]["http"]
    assert status["serving"] is True
    assert status["tls"] is True

