"""[mcp] operator_tools: reload and recheck offered to agents as MCP tools, by choice.

Through the real daemon, the real bridge and the SDK client; the tool the recheck
restores is a real HTTP server on 127.0.0.1 whose health is flipped.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest

from capd.registry import ConfigError
from capd.sidecar.client._mcp import OPERATOR_TOOLS
from capd.sidecar.server import load_config
from capd.sidecar.server._config import McpConfig
from tests.helpers.bridge import BRIEF, bridge, data
from tests.helpers.daemon import DaemonProcess, FlipServer, write_e2e_config

pytestmark = pytest.mark.slow  # starts the real daemon, the CLI and the bridge


def serve(folder: Path, web: FlipServer, mcp: str = "") -> DaemonProcess:
    config = write_e2e_config(folder, web.port, recheck_interval_s=300,
                              probe_live_interval_s=300)
    config.write_text(config.read_text() + mcp)
    return DaemonProcess(config, folder / "capd.sock").start().wait_ready()


def cli_json(daemon: DaemonProcess, *args: str) -> Any:
    done = subprocess.run([sys.executable, "-m", "capd", *args, "--json", "--socket",
                           str(daemon.socket)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_config_names_exactly_the_rows_that_can_be_offered() -> None:
    allowed = McpConfig.model_fields["operator_tools"].annotation
    assert set(OPERATOR_TOOLS) == {"reload", "recheck"}
    assert set(get_args(get_args(allowed)[0])) == set(OPERATOR_TOOLS)


def test_an_unknown_operator_tool_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "capd.toml"
    config.write_text('[mcp]\noperator_tools = ["reload", "queue-purge"]\n')
    with pytest.raises(ConfigError, match=r"operator_tools.*'reload' or 'recheck'"):
        load_config(config)


def test_off_by_default(short_tmp: Path, web: FlipServer) -> None:
    daemon = serve(short_tmp, web)
    try:
        async def run() -> tuple[set[str], Any]:
            async with bridge(daemon.socket) as session:
                tools = {t.name for t in (await session.list_tools()).tools}
                return tools, await session.call_tool("reload", {})

        tools, refused = asyncio.run(run())
        assert tools == BRIEF
        assert refused.is_error
        assert "unknown tool 'reload'" in refused.content[0].text
    finally:
        daemon.kill()


def test_reload_answers_when_done_and_recheck_says_what_came_back(
        short_tmp: Path, web: FlipServer) -> None:
    web.healthy = False
    daemon = serve(short_tmp, web, '\n[mcp]\noperator_tools = ["reload", "recheck"]\n')
    try:
        async def run() -> dict[str, Any]:
            async with bridge(daemon.socket) as session:
                listed = {t.name: t for t in (await session.list_tools()).tools}
                still = data(await session.call_tool("recheck", {"id": "e2e.web"}))
                web.healthy = True
                back = data(await session.call_tool("recheck", {"id": "e2e.web",
                                                                "force": True}))
                reloaded = await session.call_tool("reload", {})
                missing = await session.call_tool("recheck", {})
                return {"listed": listed, "still": still, "back": back,
                        "reloaded": reloaded, "missing": missing}

        got = asyncio.run(run())
        assert set(got["listed"]) == BRIEF | {"reload", "recheck"}
        assert got["listed"]["recheck"].input_schema["required"] == ["id"]
        assert (got["still"]["state"], got["still"]["missing"]) == ("disabled", ["web"])
        assert (got["back"]["state"], got["back"]["restored"]) == ("live", ["e2e.web"])
        assert not got["reloaded"].is_error
        report = data(got["reloaded"])
        assert report["ok"] is True
        assert report["error"] is None
        assert report["generation"] == 1
        assert got["missing"].is_error
        assert "id: Field required" in got["missing"].content[0].text
        # the same payload as the CLI's --json (its own run's times aside)
        varying = ("started_at", "duration_s", "finished_at", "generation")
        through_cli = cli_json(daemon, "reload")
        assert {k: v for k, v in report.items() if k not in varying} == {
            k: v for k, v in through_cli.items() if k not in varying}
        # live by now: nothing to probe, nothing restored; the same shape as the tool's
        assert cli_json(daemon, "recheck", "e2e.web") == {
            "name": "e2e.web", "state": "live", "missing": [], "restored": [], "tools": []}
        assert set(got["back"]) == {"name", "state", "missing", "restored", "tools"}
    finally:
        daemon.kill()


def test_a_profile_limits_what_recheck_reaches(short_tmp: Path, web: FlipServer) -> None:
    daemon = serve(short_tmp, web, '\n[mcp]\noperator_tools = ["recheck"]\n')
    try:
        async def run() -> tuple[set[str], Any, Any]:
            async with bridge(daemon.socket, "--allow", "e2e.echo") as session:
                tools = {t.name for t in (await session.list_tools()).tools}
                outside = await session.call_tool("recheck", {"id": "e2e.web"})
                inside = await session.call_tool("recheck", {"id": "e2e.echo"})
                return tools, outside, inside

        tools, outside, inside = asyncio.run(run())
        assert "recheck" in tools
        assert "reload" not in tools
        assert outside.is_error
        assert "unknown capability 'e2e.web'" in outside.content[0].text
        assert not inside.is_error
        assert data(inside)["state"] == "live"
    finally:
        daemon.kill()
