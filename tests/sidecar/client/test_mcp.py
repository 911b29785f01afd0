"""capd mcp driven by the official MCP client over stdio, against a real daemon."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from capd.sidecar._table import COMMANDS
from capd.sidecar.client._mcp import META_TOOLS
from tests.helpers.bridge import BRIEF, bridge, data
from tests.helpers.daemon import DaemonProcess, FlipServer, Start

pytestmark = pytest.mark.slow  # starts the real daemon or the CLI as processes








async def test_meta_tools_search_get_invoke(start: Start, web: FlipServer) -> None:
    """initialize, list tools, search, get, invoke: success, bad params, disabled, queued."""
    web.healthy = False
    daemon = await asyncio.to_thread(start, recheck_interval_s=300, probe_live_interval_s=300)
    async with bridge(daemon.socket) as session:
        tools = await session.list_tools()
        assert {t.name for t in tools.tools} == BRIEF
        found = data(await session.call_tool("search_capabilities",
                                             {"query": "echo text back", "k": 3}))
        assert found["results"][0]["name"] == "e2e.echo"
        manifest = data(await session.call_tool("get_capability", {"id": "e2e.echo"}))
        assert manifest["parameters"]["properties"]["text"]["type"] == "string"
        assert manifest["telemetry"] == {"calls": {}, "success_rate": None,
                                         "mean_duration_s": None}
        ok = await session.call_tool("invoke_capability",
                                     {"id": "e2e.echo", "arguments": {"text": "hi"}})
        assert (ok.is_error, data(ok)["status"], data(ok)["result"]["text"]) == (
            False, "success", "hi")
        observed = data(await session.call_tool("get_capability", {"id": "e2e.echo"}))
        assert observed["telemetry"]["calls"] == {"success": 1}
        assert observed["telemetry"]["success_rate"] == 1.0
        bad = await session.call_tool("invoke_capability",
                                      {"id": "e2e.slow", "arguments": {"seconds": "soon"}})
        assert bad.is_error
        assert "invalid parameters for 'e2e.slow'" in bad.content[0].text  # type: ignore[union-attr]
        disabled = await session.call_tool("invoke_capability", {"id": "e2e.web"})
        assert disabled.is_error
        assert data(disabled)["error_type"] == "capability_disabled"
        queued = await session.call_tool("invoke_capability",
                                         {"id": "e2e.flaky", "arguments": {"text": "w"}})
        assert queued.is_error is False
        assert data(queued)["queued"]
        listed = data(await session.call_tool("list_capabilities", {"limit": 2}))
        assert len(listed["capabilities"]) == 2
        assert listed["next_cursor"] == "2"
        rest = data(await session.call_tool("list_capabilities", {"cursor": "2"}))
        assert rest["next_cursor"] is None
        unknown = await session.call_tool("get_capability", {"id": "e2e.nope"})
        assert unknown.is_error


async def test_daemon_down_then_back(start: Start, short_tmp: Path) -> None:
    """With the daemon stopped each tool answers an error; after a restart calls work again."""
    daemon = await asyncio.to_thread(start)
    async with bridge(daemon.socket) as session:
        assert not (await session.call_tool("get_capability", {"id": "e2e.echo"})).is_error
        assert await asyncio.to_thread(daemon.stop) == 0
        down = await session.call_tool("search_capabilities", {"query": "echo"})
        assert down.is_error
        assert "capd is not reachable" in down.content[0].text  # type: ignore[union-attr]
        again = DaemonProcess(daemon.config, daemon.socket)
        await asyncio.to_thread(lambda: again.start().wait_ready())
        try:
            back = await session.call_tool("invoke_capability", {"id": "e2e.echo"})
            assert data(back)["status"] == "success"
        finally:
            await asyncio.to_thread(again.kill)


async def test_direct_mode_and_list_changed(start: Start, web: FlipServer) -> None:
    """--expose direct offers live capabilities as tools and announces list changes."""
    web.healthy = False
    daemon = await asyncio.to_thread(start, probe_live_interval_s=0.2)
    seen: list[str] = []
    async with bridge(daemon.socket, "--expose", "direct", "--tag", "e2e",
                      seen=seen) as session:
        names = {t.name for t in (await session.list_tools()).tools}
        assert {"e2e.echo", "e2e.flaky"} <= names
        assert "e2e.web" not in names
        echo = next(t for t in (await session.list_tools()).tools if t.name == "e2e.echo")
        assert echo.input_schema["properties"]["text"]["type"] == "string"
        direct = await session.call_tool("e2e.echo", {"text": "direct"})
        assert data(direct)["result"]["text"] == "direct"
        web.healthy = True
        async with asyncio.timeout(20):
            while "ToolListChangedNotification" not in seen:
                await asyncio.sleep(0.1)
        assert "e2e.web" in {t.name for t in (await session.list_tools()).tools}


async def test_profile_limits_every_tool(start: Start, short_tmp: Path) -> None:
    """A profile hides and refuses what it does not name."""
    daemon = await asyncio.to_thread(start)
    profile = short_tmp / "writer.toml"
    profile.write_text('name = "writer"\ncapabilities = ["e2e.echo"]\n')
    async with bridge(daemon.socket, "--profile", str(profile)) as session:
        found = data(await session.call_tool("search_capabilities", {"query": "sleep echo"}))
        assert [r["name"] for r in found["results"]] == ["e2e.echo"]
        listed = data(await session.call_tool("list_capabilities", {}))
        assert [c["name"] for c in listed["capabilities"]] == ["e2e.echo"]
        refused = await session.call_tool("invoke_capability", {"id": "e2e.slow"})
        assert refused.is_error
        # outside the grant: the same answer as a name never declared
        assert "unknown capability 'e2e.slow'" in refused.content[0].text  # type: ignore[union-attr]


def test_unknown_capability_in_a_profile_stops_the_bridge(start: Start, short_tmp: Path
                                                          ) -> None:
    """A profile naming a capability the daemon does not have is an error at start."""
    daemon = start()
    profile = short_tmp / "bad.toml"
    profile.write_text('capabilities = ["e2e.echo", "e2e.nope"]\n')
    done = subprocess.run([sys.executable, "-m", "capd", "mcp", "--socket",
                           str(daemon.socket), "--profile", str(profile)], input="",
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "unknown capability 'e2e.nope'" in done.stderr


def test_mcp_config_prints_the_client_entry(short_tmp: Path) -> None:
    """mcp-config prints a JSON mcpServers entry that launches the bridge with the profile."""
    profile = short_tmp / "p.toml"
    profile.write_text('name = "ops"\ntags = ["e2e"]\n')
    done = subprocess.run([sys.executable, "-m", "capd", "mcp-config", "--profile",
                           str(profile), "--socket", "/run/capd/capd.sock"],
                          capture_output=True, text=True, timeout=60, check=True)
    entry = json.loads(done.stdout)["mcpServers"]["capd-ops"]
    assert entry["args"] == ["mcp", "--socket", "/run/capd/capd.sock", "--profile",
                             str(profile.resolve())]


def test_mcp_tools_are_rendered_from_the_table() -> None:
    """The third surface: every MCP meta tool is a table row's, and no other exists."""
    assert set(META_TOOLS) == {row.mcp.name for row in COMMANDS if row.mcp}
    assert set(META_TOOLS) == {"search_capabilities", "get_capability", "list_capabilities",
                               "invoke_capability", "invoke_many", "preflight_calls",
                               "list_topologies", "get_topology", "expand_topology"}
    # operator-only rows say why they are not tools; none of them is one
    operator_only = {row.id: row.operator_only for row in COMMANDS if row.operator_only}
    assert set(operator_only) == {"consent-grant", "consent-list", "consent-revoke",
                                  "sessions", "sessions-reset", "token-create", "token-list",
                                  "token-revoke"}
    assert all(reason for reason in operator_only.values())


async def test_preflight_and_loop_detection_through_the_bridge(start: Start) -> None:
    """preflight_calls answers a plan in one round trip; the bridge's calls carry one
    session, so the fifth identical call is refused as a loop."""
    daemon = await asyncio.to_thread(start)
    async with bridge(daemon.socket) as session:
        plan = data(await session.call_tool("preflight_calls", {"calls": [
            {"capability": "e2e.echo", "params": {"text": "a"}},
            {"capability": "e2e.nope", "params": {}}]}))
        assert plan["ready"] == [0]
        assert [(r["index"], r["reason"]) for r in plan["refused"]] == [(1, "unknown")]
        answers = [await session.call_tool("invoke_capability",
                                           {"id": "e2e.echo", "arguments": {"text": "same"}})
                   for _ in range(5)]
        assert [a.is_error for a in answers] == [False] * 4 + [True]
        assert data(answers[2])["warnings"]
        assert data(answers[4])["error_type"] == "loop_detected"
    # a new bridge is a new session: not held up by the last one's loop
    async with bridge(daemon.socket) as session:
        again = await session.call_tool("invoke_capability",
                                        {"id": "e2e.echo", "arguments": {"text": "same"}})
        assert not again.is_error


async def test_the_brief_tool_set_is_terse_and_the_full_one_is_on_request(
        start: Start, web: FlipServer) -> None:
    """By default the bridge lists search, get and invoke in under 350 tokens (characters
    / 4) and still answers the other meta tools; --tools full lists every one, with every
    argument."""
    import json

    daemon = await asyncio.to_thread(start)
    async with bridge(daemon.socket) as session:
        brief = (await session.list_tools()).tools
        listed = await session.call_tool("list_capabilities", {"limit": 2})
    size = sum(len(json.dumps(t.model_dump(mode="json", by_alias=True, exclude_none=True)))
               for t in brief) / 4
    assert {t.name for t in brief} == BRIEF
    assert size <= 350, size
    assert listed.is_error is False
    assert len(data(listed)["capabilities"]) == 2
    async with bridge(daemon.socket, "--tools", "full") as session:
        full = (await session.list_tools()).tools
    assert {t.name for t in full} == set(META_TOOLS)
    search = next(t for t in full if t.name == "search_capabilities")
    assert {"tags", "safety", "latency_class"} <= set(search.input_schema["properties"])


def test_requests_in_flight_when_stdin_ends_are_answered(start: Start) -> None:
    """A client that writes its requests and closes stdin (a script, a pipe) gets every
    answer: a one-second call sent last is answered before the bridge exits."""
    daemon = start()
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "pipe", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "invoke_capability",
            "arguments": {"id": "e2e.slow", "arguments": {"seconds": 1}}}},
    ]
    done = subprocess.run(
        [sys.executable, "-m", "capd", "mcp", "--socket", str(daemon.socket)],
        input="".join(json.dumps(m) + "\n" for m in messages), capture_output=True, text=True,
        timeout=60)
    answers = {m["id"]: m for m in map(json.loads, done.stdout.splitlines()) if "id" in m}
    assert set(answers) == {1, 2, 3}, done.stdout
    assert answers[3]["result"]["structuredContent"]["result"] == "slept"
    assert done.returncode == 0
