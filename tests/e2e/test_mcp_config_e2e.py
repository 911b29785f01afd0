"""`capd mcp-config --client` prints each client's own entry, read here as that client reads
it (its key, its fields) and then used as it would use it: the stdio entry's command line
launched and spoken to with the SDK's client, the HTTP entry's URL and headers (a VS Code
input filled in as VS Code fills it) sent to the daemon's front door."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import DaemonProcess, daemons_on, write_e2e_config

pytestmark = pytest.mark.slow  # the real daemon, the bridge and the front door

CAPD = str(Path(sys.executable).parent / "capd")  # the console script, as a user runs it
KEY = {"claude": "mcpServers", "claude-code": "mcpServers", "cursor": "mcpServers",
       "vscode": "servers"}
"""Where each client looks for its servers."""
FIELDS = {"claude": {"command", "args", "env"},
          "cursor": {"command", "args", "env", "url", "headers"},
          "claude-code": {"type", "command", "args", "env", "url", "headers"},
          "vscode": {"type", "command", "args", "env", "url", "headers"}}
"""The fields each client's entry may hold."""


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[tuple[DaemonProcess, str]]:
    port = _port()

    def write(folder: Path, extra: str) -> Path:
        config = write_e2e_config(folder, _port())
        config.write_text(config.read_text() + f'\n[profiles.reader]\ncapabilities = '
                          f'["e2e.echo"]\n\n[mcp.http]\nlisten = "127.0.0.1:{port}"\n' + extra)
        return config

    with daemons_on(short_tmp, write) as start:
        yield start(), f"http://127.0.0.1:{port}/mcp"


def mcp_config(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CAPD, "mcp-config", "--socket", str(daemon.socket), *args],
                          capture_output=True, text=True, timeout=60, check=False)


def entry(client: str, printed: str) -> dict[str, Any]:
    """The one server entry ``client`` reads from ``printed``, checked as it checks it."""
    document = json.loads(printed)
    servers = document[KEY[client]]
    assert list(servers) == ["capd"]
    server: dict[str, Any] = servers["capd"]
    assert set(server) <= FIELDS[client], server
    if client in ("claude-code", "vscode"):
        assert server["type"] == ("http" if "url" in server else "stdio")
    if "command" in server:
        assert isinstance(server["command"], str)
        assert all(isinstance(a, str) for a in server["args"])
    return server


async def tools_over_stdio(server: dict[str, Any]) -> set[str]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=server["command"], args=server["args"])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return {t.name for t in (await session.list_tools()).tools}


async def tools_over_http(server: dict[str, Any]) -> set[str]:
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with httpx2.AsyncClient(headers=server["headers"], timeout=30) as http, \
            streamable_http_client(server["url"], http_client=http) as streams, \
            ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        return {t.name for t in (await session.list_tools()).tools}


@pytest.mark.parametrize("client", sorted(KEY))
def test_each_clients_stdio_entry_launches_the_bridge(
        daemon: tuple[DaemonProcess, str], client: str) -> None:
    """The entry's command line, launched as the client launches it, is the bridge: it
    answers the MCP handshake and lists the meta tools."""
    printed = mcp_config(daemon[0], "--client", client)
    assert printed.returncode == 0, printed.stderr
    server = entry(client, printed.stdout)
    assert server["command"] == str(Path(CAPD).resolve())
    assert "search_capabilities" in asyncio.run(tools_over_stdio(server))


@pytest.mark.parametrize("client", ["claude-code", "cursor", "vscode"])
def test_each_clients_http_entry_reaches_the_front_door_with_its_token(
        daemon: tuple[DaemonProcess, str], client: str) -> None:
    """--http with --token: the URL and the bearer header the client sends get the front
    door's tools within the token's grant."""
    process, url = daemon
    made = subprocess.run([CAPD, "token", "create", "--profile", "reader", "--json",
                           "--socket", str(process.socket)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    token = json.loads(made.stdout)["token"]
    printed = mcp_config(process, "--client", client, "--http", url, "--token", token)
    assert printed.returncode == 0, printed.stderr
    server = entry(client, printed.stdout)
    assert server["url"] == url
    assert "search_capabilities" in asyncio.run(tools_over_http(server))


def test_vscode_asks_for_the_token_when_it_is_left_out(
        daemon: tuple[DaemonProcess, str]) -> None:
    """Without --token, VS Code's entry names a secret input; filled in, it reaches the
    front door. Another client without --token, or Claude Desktop over HTTP, is a usage
    error that says what to do."""
    process, url = daemon
    printed = mcp_config(process, "--client", "vscode", "--http", url)
    assert printed.returncode == 0, printed.stderr
    document = json.loads(printed.stdout)
    [prompt] = document["inputs"]
    assert (prompt["type"], prompt["password"]) == ("promptString", True)
    made = subprocess.run([CAPD, "token", "create", "--allow", "e2e.echo", "--json",
                           "--socket", str(process.socket)],
                          capture_output=True, text=True, timeout=60, check=False)
    token = json.loads(made.stdout)["token"]
    filled = json.loads(printed.stdout.replace(f"${{input:{prompt['id']}}}", token))
    assert "search_capabilities" in asyncio.run(tools_over_http(entry("vscode", json.dumps(
        {"servers": filled["servers"]}))))
    for args, said in ((("--client", "cursor", "--http", url), "needs --token"),
                       (("--client", "claude", "--http", url, "--token", "t"),
                        "starts local servers only"),
                       (("--http", url, "--token", "t"), "starts local servers only"),
                       (("--client", "vscode", "--http", "localhost:1/mcp"), "front door's URL"),
                       (("--http", url, "--token", "t", "--allow", "e2e.echo"),
                        "a token's profile or allow list is its reach")):
        refused = mcp_config(process, *args)
        assert refused.returncode == 2, (args, refused.stdout)
        assert said in refused.stderr, (args, refused.stderr)

