"""Agents and topologies through the real daemon, the real CLI and the real MCP bridge."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.helpers.daemon import DaemonProcess, FlipServer, write_e2e_config
from tests.helpers.peers import curl_as, open_up

pytestmark = pytest.mark.slow  # starts the real daemon, the CLI and the bridge as processes

AGENTS = '''
[agents.reviewer]
description = "Reviews changes."
capabilities = ["e2e.echo", "e2e.s*", "tag:e2e"]

[agents.writer]
capabilities = ["e2e.flaky"]

[agents.broken]
capabilities = ["e2e.echo", "e2e.nope", "nope.*", "tag:nothing"]

[[injections]]
when = "silent"
add = ["e2e.hang"]
why = "a silent run must still be able to reach the user"
'''

TOPOLOGIES = '''
[[topology]]
id = "review"
title = "Parallel review"
summary = "Reviewers split the work; a lead merges it."
required_evidence = ["each share reviewed"]

[[topology.roles]]
id = "planner"
agent = "writer"

[[topology.roles]]
id = "reviewer"
title = "Reviewer"
responsibilities = ["review one share"]
agent = "reviewer"
count = 2
expected_artifacts = ["each share reviewed"]

[[topology.roles]]
id = "lead"
agent = "writer"

[[topology.phases]]
id = "review"
roles = ["reviewer", "lead"]
fanout = ["reviewer"]
fanin = ["lead"]

[[topology]]
id = "bad"
title = "Broken on purpose"

[[topology.roles]]
id = "a"
agent = "ghost"
count = 0

[[topology.groups]]
id = "g"
roles = ["b"]
'''


@pytest.fixture
def daemon(short_tmp: Path, web: FlipServer) -> Iterator[DaemonProcess]:
    """The e2e daemon with three agents, one injection and two topologies (one invalid)."""
    config = write_e2e_config(short_tmp, web.port)
    config.write_text(config.read_text() + AGENTS)
    caps = short_tmp / "caps.toml"
    caps.write_text(caps.read_text() + TOPOLOGIES)
    process = DaemonProcess(config, short_tmp / "capd.sock").start().wait_ready()
    yield process
    process.kill()


def capd(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "capd", *args, "--socket", str(daemon.socket)],
                          capture_output=True, text=True, timeout=60, check=False)


# -------------------------------------------------------------------------- agents


def test_resolve_shows_the_expansion_and_injects_only_in_context(daemon: DaemonProcess) -> None:
    """`capd agent resolve` expands globs and tags, shows them, and adds the injection only
    with --context silent=true; --json is the HTTP body."""
    plain = capd(daemon, "agent", "resolve", "reviewer", "--json")
    assert plain.returncode == 0, plain.stderr
    body = json.loads(plain.stdout)
    assert body == daemon.call("GET", "/agents/reviewer/resolve").body
    assert body["capabilities"] == ["e2e.echo", "e2e.flaky", "e2e.slow", "e2e.web"]
    assert [(e["entry"], e["kind"], e["capabilities"]) for e in body["expansion"]] == [
        ("e2e.echo", "name", ["e2e.echo"]), ("e2e.s*", "glob", ["e2e.slow"]),
        ("tag:e2e", "tag", ["e2e.echo", "e2e.flaky", "e2e.web"])]
    assert body["injected"] == []
    silent = json.loads(capd(daemon, "agent", "resolve", "reviewer", "--context", "silent=true",
                             "--context", "ticket=42", "--json").stdout)
    assert silent["context"] == {"silent": "true", "ticket": "42"}
    assert [(i["when"], i["why"], i["capabilities"]) for i in silent["injected"]] == [
        ("silent", "a silent run must still be able to reach the user", ["e2e.hang"])]
    assert "e2e.hang" in silent["capabilities"]
    args = silent["servers"]["capd-reviewer"]["args"]
    assert args == ["mcp", "--socket", str(daemon.socket), "--allow",
                    "e2e.echo,e2e.flaky,e2e.hang,e2e.slow,e2e.web"]
    off = json.loads(capd(daemon, "agent", "resolve", "reviewer", "--context", "silent=false",
                          "--json").stdout)
    assert off["injected"] == []


def test_claude_and_codex_formats(daemon: DaemonProcess) -> None:
    """--format claude prints {"mcpServers": …}; --format codex prints TOML that parses."""
    claude = capd(daemon, "agent", "resolve", "writer", "--format", "claude")
    assert claude.returncode == 0, claude.stderr
    servers = json.loads(claude.stdout)["mcpServers"]
    assert list(servers) == ["capd-writer"]
    assert servers["capd-writer"]["args"][-2:] == ["--allow", "e2e.flaky"]
    codex = capd(daemon, "agent", "resolve", "writer", "--format", "codex")
    assert codex.returncode == 0, codex.stderr
    assert codex.stdout.startswith("[mcp_servers.capd-writer]\n")
    assert tomllib.loads(codex.stdout)["mcp_servers"] == servers
    raw = daemon.call("GET", "/agents/writer/resolve?format=codex")
    assert raw.content_type == "application/toml"


def test_unknown_capabilities_exit_1_naming_each(daemon: DaemonProcess) -> None:
    """An agent whose entries select nothing fails closed: exit 1, every entry named;
    over HTTP a 422 problem body lists them."""
    done = capd(daemon, "agent", "resolve", "broken")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("capd: agent 'broken' cannot be resolved: unknown capability "
                                  "'e2e.nope'")
    assert "glob 'nope.*' matches no capability" in done.stderr
    assert "tag 'nothing' is on no capability" in done.stderr
    answer = daemon.call("GET", "/agents/broken/resolve")
    assert answer.status == 422
    assert answer.content_type == "application/problem+json"
    assert [p["entry"] for p in answer.body["unresolved"]] == ["e2e.nope", "nope.*",
                                                               "tag:nothing"]
    unknown = capd(daemon, "agent", "resolve", "reviewr")
    assert unknown.returncode == 1
    assert "unknown agent 'reviewr' (did you mean 'reviewer'?)" in unknown.stderr
    assert daemon.call("GET", "/agents/reviewr/resolve").status == 404
    bad_format = daemon.call("GET", "/agents/reviewer/resolve?format=yaml")
    assert (bad_format.status, bad_format.body["errors"][0]["loc"]) == (422, ["format"])


def test_list_and_show(daemon: DaemonProcess) -> None:
    """`agent list` prints agents and injections; `agent show` what each entry selects now."""
    listed = capd(daemon, "agent", "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].split() == ["AGENT", "CAPABILITIES"]
    assert "injection: when silent add e2e.hang" in listed.stdout
    shown = json.loads(capd(daemon, "agent", "show", "broken", "--json").stdout)
    assert shown["resolves"] is False
    nope = shown["expansion"][1]
    assert (nope["entry"], nope["kind"], nope["capabilities"]) == ("e2e.nope", "name", [])
    assert nope["problem"].startswith("unknown capability 'e2e.nope' (did you mean")
    assert shown["expansion"][0]["capabilities"] == ["e2e.echo"]


@asynccontextmanager
async def bridge(args: list[str]) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "capd", *args])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def data(result: types.CallToolResult) -> Any:
    assert result.structured_content is not None, result.content
    return result.structured_content


async def test_the_resolved_bridge_offers_exactly_the_agents_capabilities(
        daemon: DaemonProcess) -> None:
    """The bridge launched with the resolved args lists and calls only the agent's
    capabilities; the topology tools answer through it too."""
    done = await asyncio.to_thread(capd, daemon, "agent", "resolve", "writer", "--format",
                                   "claude")
    args = json.loads(done.stdout)["mcpServers"]["capd-writer"]["args"]
    async with bridge(args) as session:
        listed = data(await session.call_tool("list_capabilities", {}))
        assert [c["name"] for c in listed["capabilities"]] == ["e2e.flaky"]
        refused = await session.call_tool("invoke_capability",
                                          {"id": "e2e.echo", "arguments": {"text": "x"}})
        assert refused.is_error
        assert "unknown capability 'e2e.echo'" in refused.content[0].text  # type: ignore[union-attr]
        tools = {t.name for t in (await session.list_tools()).tools}
        assert tools == {"search_capabilities", "get_capability", "invoke_capability"}
        # the topology tools are in the full set, and answer when called in the brief one
        # every topology's agents reach beyond this bridge's --allow: to it they are
        # unknown, so are the topologies, and their configs are never handed out through it
        tops = data(await session.call_tool("list_topologies", {}))
        assert tops["topologies"] == []
        assert tops["errors"] == []
        expanded = await session.call_tool(
            "expand_topology", {"id": "review", "set": ["reviewer.count=5"],
                                "context": ["silent=true"]})
        assert expanded.is_error
        assert "unknown topology 'review'" in expanded.content[0].text  # type: ignore[union-attr]
        assert "e2e.echo" not in expanded.content[0].text  # type: ignore[union-attr]


def test_allow_naming_an_unknown_capability_stops_the_bridge(daemon: DaemonProcess) -> None:
    """`capd mcp --allow` checks every name against the daemon at start, like a profile; a
    bridge that cannot start says why on stderr and as the answer to the client's
    initialize (an MCP client shows that, not only "connection closed")."""
    initialize = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}}) + "\n"
    done = subprocess.run([sys.executable, "-m", "capd", "mcp", "--socket", str(daemon.socket),
                           "--allow", "e2e.echo,e2e.nope"], input=initialize,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "unknown capability 'e2e.nope'" in done.stderr
    answer = json.loads(done.stdout)
    assert answer["id"] == 1
    assert "unknown capability 'e2e.nope'" in answer["error"]["message"]
    both = subprocess.run([sys.executable, "-m", "capd", "mcp", "--allow", "e2e.echo",
                           "--profile", "p.toml"], input=initialize, capture_output=True,
                          text=True, timeout=60, check=False)
    assert both.returncode == 2
    assert "pass one of them" in both.stderr
    assert "pass one of them" in json.loads(both.stdout)["error"]["message"]


# ---------------------------------------------------------------------- topologies


def test_topology_list_show_and_validate(daemon: DaemonProcess) -> None:
    """list prints a table; validate of all exits 1 naming every problem of `bad`; validate
    of a sound one exits 0; an unknown id exits 1 with a suggestion."""
    listed = capd(daemon, "topology", "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == ["TOPOLOGY  INSTANCES  TITLE",
                                          "bad               0  Broken on purpose",
                                          "review            4  Parallel review"]
    every = capd(daemon, "topology", "validate")
    assert every.returncode == 1
    assert every.stdout.splitlines() == [
        "invalid bad",
        "  role 'a' names unknown agent 'ghost' (agents: broken, reviewer, writer)",
        "  role 'a' has count 0; a role needs at least 1 instance",
        "  group 'g' names unknown role 'b' (roles: a)",
        "ok review",
    ]
    good = capd(daemon, "topology", "validate", "review")
    assert (good.returncode, good.stdout) == (0, "ok review\n")
    answer = daemon.call("GET", "/topologies/validate")
    assert answer.status == 422
    assert answer.body["ok"] is False
    unknown = capd(daemon, "topology", "validate", "reveiw")
    assert unknown.returncode == 1
    assert unknown.stderr == "capd: unknown topology 'reveiw' (did you mean 'review'?)\n"
    assert daemon.call("GET", "/topologies/reveiw").status == 404
    shown = json.loads(capd(daemon, "topology", "show", "review", "--json").stdout)
    assert shown["roles"][1]["count"] == 2
    assert shown["phases"][0]["fanout"] == ["reviewer"]


def test_topology_expand_materialises_instances_with_their_config(
        daemon: DaemonProcess) -> None:
    """expand with --set reviewer.count=5 gives reviewer-1 … reviewer-5, each with its agent's
    servers; phases list instances; an invalid topology or override exits 1."""
    done = capd(daemon, "topology", "expand", "review", "--set", "reviewer.count=5",
                "--context", "silent=1", "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body == daemon.call(
        "GET", "/topologies/review/expand?set=reviewer.count%3D5&context=silent%3D1").body
    assert body["counts"] == {"planner": 1, "reviewer": 5, "lead": 1}
    reviewers = [i for i in body["instances"] if i["role"] == "reviewer"]
    assert [(i["id"], i["index"]) for i in reviewers] == [(f"reviewer-{n}", n)
                                                          for n in range(1, 6)]
    assert reviewers[0]["responsibilities"] == ["review one share"]
    assert reviewers[0]["servers"] == body["agents"]["reviewer"]["servers"]
    assert "e2e.hang" in reviewers[0]["capabilities"]  # the injection, in this context
    assert body["phases"] == [{
        "id": "review", "roles": ["reviewer", "lead"],
        "instances": [*(f"reviewer-{n}" for n in range(1, 6)), "lead"],
        "fanout": [f"reviewer-{n}" for n in range(1, 6)], "fanin": ["lead"],
        "required_evidence": [], "coordinator_decision_kinds": []}]
    invalid = capd(daemon, "topology", "expand", "bad")
    assert invalid.returncode == 1
    assert invalid.stderr.startswith("capd: topology 'bad' is invalid: role 'a' names unknown "
                                     "agent 'ghost'")
    zero = capd(daemon, "topology", "expand", "review", "--set", "reviewer.count=0")
    assert zero.returncode == 1
    assert "role 'reviewer' has count 0" in zero.stderr
    assert daemon.call("GET", "/topologies/bad/expand").status == 422


def test_the_bundled_topologies_are_sound_and_expand_with_their_seed_fields(
        example_copy: Path, tmp_path: Path) -> None:
    """map-reduce, debate and judge-panel ship with the example: they validate, show every
    seed field, and expand with --set mapper.count=N (the old mapperCount)."""
    config = example_copy / "capd.toml"
    env = {"CAPD_STATE_DIR": str(tmp_path / "state")}
    daemon = DaemonProcess(config, tmp_path / "capd.sock", env=env).start()
    try:
        daemon.wait_ready()
        valid = capd(daemon, "topology", "validate", "--json")
        assert valid.returncode == 0, valid.stdout
        assert {t["id"] for t in json.loads(valid.stdout)["topologies"]} == {
            "map-reduce", "debate", "judge-panel"}
        shown = json.loads(capd(daemon, "topology", "show", "map-reduce", "--json").stdout)
        assert shown["fanin_strategy"].startswith("the reducer merges")
        assert shown["phases"][0]["coordinator_decision_kinds"] == ["assign_shares",
                                                                    "retry_share"]
        expanded = json.loads(capd(daemon, "topology", "expand", "map-reduce", "--set",
                                   "mapper.count=5", "--json").stdout)
        mappers = [i for i in expanded["instances"] if i["role"] == "mapper"]
        assert len(mappers) == 5
        assert mappers[0]["expected_artifacts"] == ["findings per share"]
        assert expanded["verifier_gates"] == ["every share has findings"]
        panel = json.loads(capd(daemon, "topology", "expand", "judge-panel", "--set",
                                "judge.count=5", "--json").stdout)
        assert [i["id"] for i in panel["instances"] if i["role"] == "judge"] == [
            f"judge-{n}" for n in range(1, 6)]
    finally:
        daemon.kill()


def test_a_huge_expansion_from_a_bound_uid_is_refused_at_once(
        short_tmp: Path, web: FlipServer, peer_uid: int) -> None:
    """A profile-bound uid asking for reviewer.count=1000000 gets 422 naming the bound
    (1,000 instances in all), not a frozen daemon; 1,000 in all still expands; the
    daemon answers /health throughout."""
    config = write_e2e_config(short_tmp, web.port)
    config.write_text(config.read_text() + AGENTS + textwrap.dedent(f"""
        [profiles.bound]
        capabilities = ["e2e.*"]

        [[peers]]
        uid = {peer_uid}
        profile = "bound"
    """))
    caps = short_tmp / "caps.toml"
    caps.write_text(caps.read_text() + TOPOLOGIES)
    daemon = DaemonProcess(config, short_tmp / "capd.sock").start().wait_ready()
    try:
        open_up(daemon)
        huge = "/topologies/review/expand?set=reviewer.count%3D1000000"
        assert curl_as(peer_uid, daemon.socket, huge) == "422"
        refused = daemon.call("GET", huge)
        assert refused.status == 422
        assert "at most 1000" in json.dumps(refused.body)
        assert daemon.call("GET", "/health").status == 200
        full = daemon.call("GET", "/topologies/review/expand?set=reviewer.count%3D998")
        assert full.status == 200, full.body
        assert len(full.body["instances"]) == 1000
        assert curl_as(peer_uid, daemon.socket,
                       "/topologies/review/expand?set=reviewer.count%3D1001") == "422"
    finally:
        daemon.kill()
