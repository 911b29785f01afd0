"""Payload parity: for a row on both surfaces, `capd X --json` prints exactly what the MCP
tool answers as its structured result (the same daemon, the same arguments)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest

from tests.helpers.bridge import bridge, data
from tests.helpers.daemon import DaemonProcess, Start

pytestmark = pytest.mark.slow  # starts the real daemon, the CLI and the bridge


def cli_json(daemon: DaemonProcess, *args: str) -> Any:
    done = subprocess.run([sys.executable, "-m", "capd", *args, "--json", "--socket",
                           str(daemon.socket)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def without(body: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in keys}


def test_cli_json_and_mcp_structured_results_are_the_same(start: Start) -> None:
    daemon = start()

    async def through_mcp() -> dict[str, Any]:
        async with bridge(daemon.socket) as session:
            async def tool(name: str, arguments: dict[str, Any]) -> Any:
                return data(await session.call_tool(name, arguments))

            return {
                "list": await tool("list_capabilities", {"limit": 2}),
                "list_tag": await tool("list_capabilities", {"tag": "e2e", "limit": 50}),
                "search": await tool("search_capabilities", {"query": "echo text back",
                                                             "k": 3}),
                "get": await tool("get_capability", {"id": "e2e.echo"}),
                "preflight": await tool("preflight_calls", {"calls": [
                    {"capability": "e2e.echo", "params": {"text": "a"}},
                    {"capability": "e2e.nope", "params": {}}]}),
            }

    mcp = asyncio.run(through_mcp())
    assert mcp["list"] == cli_json(daemon, "list", "--limit", "2")
    assert mcp["list"]["next_cursor"] == "2"  # paging and counts survive on both surfaces
    assert "counts" in mcp["list"]
    assert mcp["list_tag"] == cli_json(daemon, "list", "--tag", "e2e", "--limit", "50")
    assert mcp["search"] == cli_json(daemon, "search", "-k", "3", "echo", "text", "back")
    assert mcp["get"] == cli_json(daemon, "show", "e2e.echo")
    assert mcp["preflight"] == cli_json(daemon, "preflight", "--params", json.dumps(
        {"calls": [{"capability": "e2e.echo", "params": {"text": "a"}},
                   {"capability": "e2e.nope", "params": {}}]}))

    async def invoke() -> Any:
        async with bridge(daemon.socket) as session:
            return data(await session.call_tool(
                "invoke_capability", {"id": "e2e.echo", "arguments": {"text": "same"}}))

    through_bridge = asyncio.run(invoke())
    through_cli = cli_json(daemon, "call", "e2e.echo", "-p", "text=same")
    varying = ("request_id", "duration_s")  # one call's own id and timing
    assert without(through_bridge, *varying) == without(through_cli, *varying)
