"""Agent resolution: explicit entries, globs and tags expanded and shown, injections by context,
fail closed on anything that selects nothing; the claude and codex formats; `--allow`."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest
from pydantic import BaseModel

from capd.registry import (
    AgentSpec,
    Capability,
    ConfigError,
    InjectionSpec,
    McpProbe,
    PathProbe,
    ProbeResult,
    Registry,
    ToolSpec,
)
from capd.sidecar import UnknownAgent, UnresolvedAgent
from capd.sidecar._args import Params
from capd.sidecar._table import ResolveIn
from capd.sidecar.client._mcp import allow_profile
from capd.sidecar.server import load_config
from capd.sidecar.server._agents import (
    AgentResolution,
    BridgeLaunch,
    claude_config,
    codex_config,
    parse_context,
    resolve_agent,
)

BRIDGE = BridgeLaunch("/usr/bin/capd", Path("/run/capd/capd.sock"))


class Text(BaseModel):
    text: str = "x"


async def echo(params: Text) -> str:
    return params.text


def cap(name: str, *, tags: tuple[str, ...] = (), requires: tuple[str, ...] = (),
        aliases: tuple[str, ...] = ()) -> Capability:
    return Capability(name=name, summary=f"{name}.", parameters=Text, func=echo, tags=tags,
                      requires=requires, aliases=aliases)


def probe(tool: str, ok: bool) -> ProbeResult:
    return ProbeResult(tool=tool, ok=ok, latency_s=0.0, error=None if ok else "down",
                       checked_at=0.0)


@pytest.fixture
def registry() -> Registry:
    """Two upstream git tools (reached directly), notes (one disabled), a notifier."""
    tools: dict[str, ToolSpec] = {
        "git_mcp": McpProbe(command=("git-mcp", "--stdio"), env={"GIT_TOKEN": "t"}, direct=True),
        "web.search": McpProbe(url="https://search.example/mcp", direct=True),
        "time_mcp": McpProbe(command=("mcp-server-time",)),
        "vault": PathProbe(path="/nowhere"),
    }
    caps = [
        cap("git_mcp.diff", tags=("mcp", "git_mcp"), requires=("git_mcp",)),
        cap("git_mcp.log", tags=("mcp", "git_mcp"), requires=("git_mcp",)),
        cap("web.search", requires=("web.search",)),
        cap("time.now", tags=("mcp",), requires=("time_mcp",)),
        cap("notes.search", tags=("notes",), aliases=("notes.find",)),
        cap("notes.append", tags=("notes",), requires=("vault",)),
        cap("notify.user"),
    ]
    probes = {"git_mcp": probe("git_mcp", True), "web.search": probe("web.search", True),
              "time_mcp": probe("time_mcp", True), "vault": probe("vault", False)}
    built = Registry(caps, tools, probes)
    built.not_on_host = {"mac.say": "os is linux, needs darwin"}
    return built


def resolve(registry: Registry, *entries: str, context: dict[str, str] | None = None,
            injections: tuple[InjectionSpec, ...] = ()) -> AgentResolution:
    agents = {"reviewer": AgentSpec(description="Reviews diffs.", capabilities=entries)}
    return resolve_agent("reviewer", agents=agents, injections=injections, registry=registry,
                         context=context or {}, bridge=BRIDGE)


# ------------------------------------------------------------------------ entries


def test_an_explicit_list_gives_exactly_those_capabilities(registry: Registry) -> None:
    """Named capabilities, nothing implicit; the bridge is restricted to exactly them."""
    done = resolve(registry, "notes.search", "notify.user")
    assert done.capabilities == ("notes.search", "notify.user")
    assert [(s.entry, s.kind, s.capabilities) for s in done.expansion] == [
        ("notes.search", "name", ("notes.search",)), ("notify.user", "name", ("notify.user",))]
    assert done.servers == {"capd-reviewer": {
        "command": "/usr/bin/capd",
        "args": ["mcp", "--socket", "/run/capd/capd.sock", "--allow",
                 "notes.search,notify.user"]}}
    assert done.injected == ()
    assert done.disabled == {}


def test_an_alias_resolves_to_its_capability(registry: Registry) -> None:
    """An entry naming an alias selects the canonical capability."""
    assert resolve(registry, "notes.find").capabilities == ("notes.search",)


def test_a_glob_is_expanded_and_the_expansion_shown(registry: Registry) -> None:
    """`git_mcp.*` selects both git tools; the answer shows the glob and what it matched."""
    done = resolve(registry, "git_mcp.*")
    body = done.as_json()
    assert body["declared"] == ["git_mcp.*"]
    assert body["expansion"] == [{"entry": "git_mcp.*", "kind": "glob",
                                  "capabilities": ["git_mcp.diff", "git_mcp.log"]}]
    assert body["capabilities"] == ["git_mcp.diff", "git_mcp.log"]


def test_a_tag_is_expanded_and_disabled_ones_say_what_they_miss(registry: Registry) -> None:
    """`tag:notes` selects live and disabled notes capabilities; disabled lists missing tools."""
    done = resolve(registry, "tag:notes")
    assert done.expansion[0].kind == "tag"
    assert done.capabilities == ("notes.append", "notes.search")
    assert done.disabled == {"notes.append": ("vault",)}


def test_a_direct_upstream_is_served_through_the_bridge_never_raw(registry: Registry) -> None:
    """A capability needing a `direct = true` MCP tool is offered by the capd bridge as a
    tool of its own (--expose direct); the upstream's command, env and url are never
    handed out, so no tool the operator excluded or the agent did not declare is reached."""
    done = resolve(registry, "git_mcp.*", "web.search", "time.now")
    assert set(done.servers) == {"capd-reviewer"}
    args = done.servers["capd-reviewer"]["args"]
    assert args[-2:] == ["--expose", "direct"]
    assert args[args.index("--allow") + 1] == "git_mcp.diff,git_mcp.log,time.now,web.search"
    assert done.direct == {"git_mcp": ("git_mcp.diff", "git_mcp.log"),
                           "web.search": ("web.search",)}
    text = json.dumps(done.as_json())
    assert "git-mcp" not in text
    assert "GIT_TOKEN" not in text
    assert "search.example" not in text
    plain = resolve(registry, "notes.search")  # nothing direct: the meta tools only
    assert "--expose" not in plain.servers["capd-reviewer"]["args"]


# ---------------------------------------------------------------------- fail closed


def test_an_unknown_name_fails_closed_naming_it(registry: Registry) -> None:
    """An exact name not in the registry is an error with a suggestion, never skipped."""
    with pytest.raises(UnresolvedAgent) as caught:
        resolve(registry, "notes.search", "notes.serch")
    assert caught.value.problems == [{
        "entry": "notes.serch", "declared_in": "agents.reviewer",
        "detail": "unknown capability 'notes.serch' (did you mean 'notes.search', "
                  "'web.search', 'notify.user'?)"}]
    assert str(caught.value).startswith("agent 'reviewer' cannot be resolved: unknown "
                                        "capability 'notes.serch'")


def test_a_glob_or_tag_matching_nothing_fails_closed(registry: Registry) -> None:
    """Every entry that selects nothing is listed, in one error."""
    with pytest.raises(UnresolvedAgent) as caught:
        resolve(registry, "jira.*", "tag:tickets", "mac.say")
    assert [p["detail"] for p in caught.value.problems] == [
        "glob 'jira.*' matches no capability",
        "tag 'tickets' is on no capability",
        "capability 'mac.say' is not offered on this host (os is linux, needs darwin)",
    ]


def test_an_unknown_agent_suggests_the_close_one(registry: Registry) -> None:
    """An undeclared agent is UnknownAgent with a suggestion."""
    agents = {"reviewer": AgentSpec(capabilities=("notes.search",))}
    with pytest.raises(UnknownAgent, match=r"unknown agent 'reviewr' \(did you mean "
                       r"'reviewer'\?\)"):
        resolve_agent("reviewr", agents=agents, injections=(), registry=registry,
                      context={}, bridge=BRIDGE)


# ----------------------------------------------------------------------- injections

SILENT = InjectionSpec(when="silent", add=("notify.user",), why="a silent run still reports")
BATCH = InjectionSpec(when="mode=batch", add=("tag:notes",))


@pytest.mark.parametrize(("context", "injected"), [
    ({}, False),
    ({"silent": "true"}, True),
    ({"silent": "1"}, True),
    ({"silent": "yes"}, True),
    ({"silent": "false"}, False),
    ({"silent": "0"}, False),
    ({"silent": "No"}, False),
    ({"silent": ""}, False),
    ({"loud": "true"}, False),
])
def test_an_injection_is_added_only_in_its_context(registry: Registry, context: dict[str, str],
                                                   injected: bool) -> None:
    """`when = "silent"` matches a present key that is not false, 0, no or empty."""
    done = resolve(registry, "notes.search", context=context, injections=(SILENT,))
    assert ("notify.user" in done.capabilities) is injected
    assert bool(done.injected) is injected
    if injected:
        assert done.as_json()["injected"] == [{
            "injection": 0, "when": "silent", "why": "a silent run still reports",
            "add": ["notify.user"], "capabilities": ["notify.user"],
            "expansion": [{"entry": "notify.user", "kind": "name",
                           "capabilities": ["notify.user"]}]}]
        assert "notify.user" in done.servers["capd-reviewer"]["args"][-1]


def test_a_key_value_injection_matches_that_value_only(registry: Registry) -> None:
    """`when = "mode=batch"` matches mode=batch, not mode=interactive nor a bare mode."""
    def added(context: dict[str, str]) -> tuple[str, ...]:
        return resolve(registry, "notify.user", context=context,
                       injections=(BATCH,)).capabilities

    assert added({"mode": "batch"}) == ("notes.append", "notes.search", "notify.user")
    assert added({"mode": "interactive"}) == ("notify.user",)
    assert added({"mode": "true"}) == ("notify.user",)


def test_a_broken_injection_fails_every_resolution(registry: Registry) -> None:
    """An injection's unknown entry is found at once, even in a context it does not match."""
    broken = InjectionSpec(when="silent", add=("notify.usr",))
    with pytest.raises(UnresolvedAgent) as caught:
        resolve(registry, "notes.search", injections=(SILENT, broken))
    assert caught.value.problems[0]["declared_in"] == "injections[1]"
    assert "'notify.usr'" in caught.value.problems[0]["detail"]


@pytest.mark.parametrize(("text", "expected"), [
    ("silent=true,ticket=42", {"silent": "true", "ticket": "42"}),
    ("silent", {"silent": "true"}),
    ("query=a=b, ,x=", {"query": "a=b", "x": ""}),
    ("", {}),
    (None, {}),
])
def test_parse_context(text: str | None, expected: dict[str, str]) -> None:
    """k=v items split on commas; a bare key is true; a value may hold '='."""
    assert parse_context(text) == expected


def test_a_context_item_without_a_key_is_refused() -> None:
    with pytest.raises(ValueError, match="has no key"):
        parse_context("=true")


# -------------------------------------------------------------------------- formats


def test_claude_format_is_mcp_servers(registry: Registry) -> None:
    """`{"mcpServers": …}`, the shape capd mcp-config prints."""
    done = resolve(registry, "git_mcp.diff")
    assert claude_config(done) == {"mcpServers": dict(done.servers)}


def test_codex_format_is_toml_with_every_server(registry: Registry) -> None:
    """One [mcp_servers.NAME] per server; names needing quotes are quoted; it parses back."""
    done = resolve(registry, "git_mcp.*", "web.search")
    text = codex_config(done)
    assert text.startswith("[mcp_servers.capd-reviewer]\ncommand = \"/usr/bin/capd\"\n")
    parsed = tomllib.loads(text)["mcp_servers"]
    assert parsed == {"capd-reviewer": done.servers["capd-reviewer"]}
    odd = AgentResolution(agent="x", description="", context={}, expansion=(), injected=(),
                          capabilities=(), disabled={}, direct={},
                          servers={"web.search": {"type": "http", "url": "https://x/mcp"}})
    text = codex_config(odd)
    assert '[mcp_servers."web.search"]' in text
    assert tomllib.loads(text)["mcp_servers"]["web.search"] == {"url": "https://x/mcp"}


def test_codex_strings_survive_quotes_and_control_characters() -> None:
    """Values with quotes, backslashes, DEL and non-ASCII are valid TOML that reads back."""
    odd = 'a "quoted" \\ path\x7f\t\u00e9'
    done = AgentResolution(agent="x", description="", context={}, expansion=(), injected=(),
                           capabilities=(), disabled={}, direct={},
                           servers={"s": {"command": odd, "args": [odd], "env": {"K.1": odd}}})
    assert tomllib.loads(codex_config(done))["mcp_servers"]["s"] == {
        "command": odd, "args": [odd], "env": {"K.1": odd}}


# ---------------------------------------------------------------------- capd.toml


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "capd.toml"
    path.write_text(text)
    return path


def test_agents_and_injections_load_from_capd_toml(tmp_path: Path) -> None:
    """[agents.NAME] and [[injections]] are read, entries kept in order."""
    loaded = load_config(config(tmp_path, '''
[agents.reviewer]
description = "Reviews diffs."
capabilities = ["git_mcp.*", "notes.search", "tag:notes"]

[[injections]]
when = "silent"
add = ["notify.user"]
why = "a silent run still reports"
'''))
    assert loaded.agents["reviewer"].capabilities == ("git_mcp.*", "notes.search", "tag:notes")
    assert loaded.injections[0].why == "a silent run still reports"


@pytest.mark.parametrize(("text", "message"), [
    ('[agents.reviewer]\ncapabilities = []\n', "capabilities: Tuple should have at least 1"),
    ('[agents.reviewer]\ncapabilities = ["Notes"]\n', "'Notes' is not a capability name"),
    ('[agents.reviewer]\ncapabilities = ["tag:"]\n', "name the tag after 'tag:'"),
    ('[agents.reviewer]\ncapabilities = ["a.b", "a.b"]\n', "listed twice"),
    ('[agents.reviewer]\ncapabilities = ["a.b"]\nmodel = "x"\n', "model: unknown key"),
    ('[agents."two words"]\ncapabilities = ["a.b"]\n', "an agent's name is a letter"),
    ('[[injections]]\nwhen = "silent"\nadd = []\n', "add: Tuple should have at least 1"),
    ('[[injections]]\nwhen = "=x"\nadd = ["a.b"]\n', "use a context key"),
    ('[[injections]]\nadd = ["a.b"]\n', "when: Field required"),
])
def test_a_bad_agent_or_injection_is_a_config_error(tmp_path: Path, text: str,
                                                    message: str) -> None:
    """Malformed agents and injections stop the config load with one sentence."""
    with pytest.raises(ConfigError, match=message):
        load_config(config(tmp_path, text))


# ------------------------------------------------------------------------- --allow


def test_allow_restricts_the_bridge_to_exactly_the_names() -> None:
    """`--allow a,b` is a profile of exactly those names (aliases admitted as theirs)."""
    profile = allow_profile("notes.search, notify.user")
    assert profile.capabilities == {"notes.search", "notify.user"}
    assert profile.allows("notes.search", ["notes"])
    assert not profile.allows("notes.append", ["notes"])


def test_allow_takes_seed_aliases_and_at_names() -> None:
    """`--allow security-auditor,@code_review` names aliases as seed packs write them."""
    profile = allow_profile("security-auditor, @code_review")
    assert profile.capabilities == {"security-auditor", "code_review"}


@pytest.mark.parametrize("text", ["", " , ", "notes.*", "tag:notes"])
def test_allow_takes_names_only(text: str) -> None:
    """Globs and tags belong to `capd agent resolve`; the bridge takes names."""
    with pytest.raises(ValueError, match="capability"):
        allow_profile(text)


# ------------------------------------------------------- a caller bound to a profile


async def test_a_profile_bound_caller_sees_only_agents_inside_its_profile(
        tmp_path: Path, registry: Registry) -> None:
    """To a caller bound to a profile, an agent resolving to anything outside it is unknown,
    as a hidden capability is; the daemon's own user sees every agent."""
    from capd.sidecar.server import Caller, Daemon
    from capd.sidecar.server._agent_handlers import agent_resolve, agents_list
    from capd.sidecar.server._grant import Grant, Profile
    from capd.sidecar.server._services import Context

    daemon = Daemon(load_config(config(tmp_path, '''
[agents.reader]
capabilities = ["notes.search"]

[agents.releaser]
capabilities = ["notes.search", "git_mcp.*"]
''')), socket_path=tmp_path / "s.sock")
    try:
        daemon.generation = dataclasses.replace(daemon.generation, registry=registry)
        notes = Grant("agent", Profile("notes", ("notes.*",)), bound=True)

        def ctx(uid: int) -> Context:
            grant = notes if uid == 4242 else Grant()
            return Context(services=daemon, caller=Caller(uid=uid, grant=grant), request_id="t")

        bound = await agents_list(ctx(4242), Params())
        assert [a["agent"] for a in bound.body["agents"]] == ["reader"]
        with pytest.raises(UnknownAgent,
                           match=r"^unknown agent 'releaser' \(did you mean 'reader'\?\)$"):
            await agent_resolve(ctx(4242), ResolveIn(agent="releaser"))
        assert (await agent_resolve(ctx(4242), ResolveIn(agent="reader"))).status == 200
        unbound = await agents_list(ctx(1000), Params())
        assert [a["agent"] for a in unbound.body["agents"]] == ["reader", "releaser"]
    finally:
        daemon.op_executor.shutdown()
        daemon.user_executor.shutdown()
