"""Aliases resolve wherever a capability name does: registry, HTTP API, CLI and MCP bridge.

An alias is written as seed packs write them (``security-auditor``, ``code_review``,
``v2.tool``), and ``@alias`` (or ``@name``) is the same lookup. A bad alias (a clash
with a name, one shared by two capabilities, a malformed one) is a declaration
error that leaves its capability out of the build.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from capd.registry import (
    AgentSpec,
    BuildConfig,
    Capability,
    CommandProbe,
    DeclarationError,
    ProbeResult,
    Registry,
    ToolSpec,
    UnknownCapability,
    build,
    select_capabilities,
)
from tests.helpers.bridge import bridge, data
from tests.helpers.daemon import E2E_CAPS, DaemonProcess, FlipServer, write_e2e_config

PLUGIN = '''
from pydantic import BaseModel, Field
from capd.registry import capability, op

class Echo(BaseModel):
    text: str = Field("x", description="What to echo.")

@op("alias.echo")
async def echo(params: Echo) -> str:
    return params.text

@capability("alias.shout", summary="Echo in capitals.", requires=["sh"],
            aliases=("alias.yell", "shout-loud"))
async def shout(params: Echo) -> str:
    return params.text.upper()
'''

GOOD = """
[[capability]]
name = "notes.append"
op = "alias.echo"
summary = "Append, by another name."
aliases = ["notes.add", "notes.jot"]
requires = ["sh"]

[[capability]]
name = "notes.publish"
op = "alias.echo"
summary = "Publish, needing the web."
aliases = ["notes.push"]
requires = ["sh", "web"]
"""

TOOLS: dict[str, ToolSpec] = {"sh": CommandProbe(which="sh"), "web": CommandProbe(which="sh")}


async def build_with(tmp_path: Path, plugin_dir: Callable[[str, str], Path], module: str,
                     declarations: str, ok_tools: frozenset[str] = frozenset({"sh", "web"})
                     ) -> Registry:
    plugin_dir(module, PLUGIN)
    decl = tmp_path / "decl.toml"
    decl.write_text(declarations)
    config = BuildConfig(plugins=(module,), declarations=(decl,), tools=TOOLS,
                         entry_points=False)

    async def probe(tool: str, spec: ToolSpec) -> ProbeResult:
        ok = tool in ok_tools
        return ProbeResult(tool=tool, ok=ok, latency_s=0.0, checked_at=0.0,
                           error=None if ok else "down on purpose")

    return await build(config, probe=probe)


def errors_of(registry: Registry) -> list[DeclarationError]:
    return list(registry.snapshot().errors)


# ------------------------------------------------------------------ registry


async def test_every_lookup_resolves_an_alias_to_its_capability(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """Every lookup (get, resolve, is_live, disabled_entry, `in`) takes an alias too."""
    registry = await build_with(tmp_path, plugin_dir, "alias_plugin_a", GOOD,
                                ok_tools=frozenset({"sh"}))
    assert errors_of(registry) == []
    assert registry.get("notes.add") is registry.get("notes.append")
    assert registry.get("notes.jot").name == "notes.append"
    assert registry.get("alias.yell").name == "alias.shout"  # declared in code
    assert registry.get("@shout-loud").name == "alias.shout"
    assert registry.resolve("notes.push") == "notes.publish"
    assert registry.resolve("notes.append") == "notes.append"
    assert registry.is_live("notes.add") is True
    assert registry.is_live("notes.push") is False
    assert registry.disabled_entry("notes.add") is None
    entry = registry.disabled_entry("notes.push")
    assert entry is not None
    assert entry.capability.name == "notes.publish"
    assert entry.missing == ("web",)
    assert "notes.add" in registry
    assert len(registry) == 3  # aliases are not extra capabilities
    assert sorted(registry.snapshot().live) == ["alias.shout", "notes.append"]


async def test_an_unknown_name_suggests_close_aliases(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """UnknownCapability's suggestions include aliases close to what was asked."""
    registry = await build_with(tmp_path, plugin_dir, "alias_plugin_b", GOOD)
    with pytest.raises(UnknownCapability) as caught:
        registry.get("notes.pusj")
    assert "notes.push" in caught.value.suggestions
    for lookup in (registry.is_live, registry.disabled_entry, registry.resolve):
        with pytest.raises(UnknownCapability):
            lookup("notes.nothing")
    assert "notes.nothing" not in registry


async def test_an_alias_that_names_another_capability_is_a_declaration_error(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """An alias equal to another capability's name leaves the aliasing capability out."""
    declarations = GOOD + """
[[capability]]
name = "notes.sneaky"
op = "alias.echo"
summary = "Tries to take over a name."
aliases = ["notes.append"]
"""
    registry = await build_with(tmp_path, plugin_dir, "alias_plugin_c", declarations)
    (error,) = errors_of(registry)
    assert (error.capability, error.field) == ("notes.sneaky", "aliases")
    assert "alias 'notes.append' is the name of another capability" in str(error)
    assert "notes.sneaky" not in registry
    assert registry.get("notes.append").summary == "Append, by another name."


async def test_an_alias_naming_a_later_capability_is_refused_too(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """The clash is found whatever the order: an alias of a name declared further down."""
    declarations = """
[[capability]]
name = "notes.first"
op = "alias.echo"
summary = "Aliases a name that comes later."
aliases = ["notes.second"]

[[capability]]
name = "notes.second"
op = "alias.echo"
summary = "Declared after the clash."
"""
    registry = await build_with(tmp_path, plugin_dir, "alias_plugin_d", declarations)
    (error,) = errors_of(registry)
    assert (error.capability, error.field) == ("notes.first", "aliases")
    assert "notes.first" not in registry
    assert registry.get("notes.second").name == "notes.second"


async def test_an_alias_two_capabilities_share_is_a_declaration_error(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """The second capability to claim an alias is left out; the first keeps it."""
    declarations = GOOD + """
[[capability]]
name = "notes.write"
op = "alias.echo"
summary = "Also wants to be notes.add."
aliases = ["notes.add"]
"""
    registry = await build_with(tmp_path, plugin_dir, "alias_plugin_e", declarations)
    (error,) = errors_of(registry)
    assert (error.capability, error.field) == ("notes.write", "aliases")
    assert "alias 'notes.add' is already an alias of 'notes.append'" in str(error)
    assert "decl.toml" in error.source
    assert "notes.write" not in registry
    assert registry.get("notes.add").name == "notes.append"


RULE = "an alias is 1 to 64 characters of lower-case letters, digits, '.', '_' and '-'"
LONG = "a" * 65


@pytest.mark.parametrize(("aliases", "expected"), [
    ('["Upper"]', f"alias 'Upper' holds 'U'; {RULE}"),
    ('["Notes.Add"]', f"alias 'Notes.Add' holds 'A', 'N'; {RULE}"),
    ('["has space"]', f"alias 'has space' holds ' '; {RULE}"),
    ('["-lead"]', f"alias '-lead' starts with '-'; {RULE}"),
    ('[".hidden"]', f"alias '.hidden' starts with '.'; {RULE}"),
    (f'["{LONG}"]', f"alias '{LONG}' is 65 characters long; {RULE}"),
    ('[""]', f"alias '' is empty; {RULE}"),
    ('["a/b"]', f"alias 'a/b' holds '/'; {RULE}"),
    ('["tab\\tbed"]', "alias 'tab\\tbed' holds '\\t'"),
    ('["@security-auditor"]', "alias '@security-auditor' starts with '@', which only marks an "
                              "alias where one is looked up: declare it as 'security-auditor'"),
    ('["notes.odd", "notes.odd"]', "alias 'notes.odd' is listed twice"),
    ('["notes.odd2"]', "alias 'notes.odd2' repeats the capability's own name"),
])
async def test_a_malformed_alias_is_a_declaration_error(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path], aliases: str, expected: str
) -> None:
    """A malformed alias leaves only its capability out, naming file, capability and alias."""
    declarations = GOOD + f"""
[[capability]]
name = "notes.odd2"
op = "alias.echo"
summary = "Has a bad alias."
aliases = {aliases}
"""
    registry = await build_with(tmp_path, plugin_dir, "alias_plugin_f", declarations)
    (error,) = errors_of(registry)
    assert (error.capability, error.field) == ("notes.odd2", "aliases")
    assert error.source.endswith("decl.toml")
    assert str(error).startswith(f"{error.source}: notes.odd2: aliases: ")
    assert expected in str(error)
    assert "notes.odd2" not in registry
    assert sorted(registry.snapshot().live) == ["alias.shout", "notes.append", "notes.publish"]


SEEDS = ("security-auditor", "code_review", "v2.tool")

SEEDED = GOOD + """
[[capability]]
name = "review.audit"
op = "alias.echo"
summary = "Audit a diff for security problems."
aliases = ["security-auditor", "code_review", "v2.tool"]
requires = ["sh"]
"""


async def test_a_seed_style_alias_resolves_by_itself_and_with_an_at(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """`security-auditor`, `code_review`, `v2.tool` load, and each resolves bare or as `@alias`."""
    registry = await build_with(tmp_path, plugin_dir, "alias_plugin_g", SEEDED,
                                ok_tools=frozenset({"sh"}))
    assert errors_of(registry) == []
    assert registry.get("review.audit").aliases == SEEDS
    for alias in SEEDS:
        for asked in (alias, f"@{alias}"):
            assert registry.resolve(asked) == "review.audit"
            assert registry.get(asked).name == "review.audit"
            assert registry.is_live(asked) is True
            assert registry.disabled_entry(asked) is None
            assert asked in registry
    assert registry.resolve("@review.audit") == "review.audit"  # a marked name, too
    entry = registry.disabled_entry("@notes.push")
    assert entry is not None
    assert entry.capability.name == "notes.publish"
    assert registry.is_live("@notes.publish") is False
    assert len(registry) == 4


async def test_a_marked_unknown_name_is_unknown_as_asked(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """`@` is taken off once: `@@alias` and a near miss are unknown, suggesting the alias."""
    registry = await build_with(tmp_path, plugin_dir, "alias_plugin_h", SEEDED)
    with pytest.raises(UnknownCapability) as caught:
        registry.get("@security-auditr")
    assert caught.value.name == "@security-auditr"
    assert "security-auditor" in caught.value.suggestions
    for asked in ("@@security-auditor", "@", "security-auditor@", "@Security-Auditor"):
        assert asked not in registry
        with pytest.raises(UnknownCapability):
            registry.resolve(asked)


async def test_a_seed_style_alias_two_capabilities_claim_is_refused_for_the_second(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """The second capability claiming `code_review` is left out; the first keeps it."""
    declarations = SEEDED + """
[[capability]]
name = "review.lint"
op = "alias.echo"
summary = "Also wants to be code_review."
aliases = ["code_review"]
"""
    registry = await build_with(tmp_path, plugin_dir, "alias_plugin_i", declarations)
    (error,) = errors_of(registry)
    assert (error.capability, error.field) == ("review.lint", "aliases")
    assert "alias 'code_review' is already an alias of 'review.audit'" in str(error)
    assert error.source.endswith("decl.toml")
    assert "review.lint" not in registry
    assert registry.get("@code_review").name == "review.audit"


async def test_a_seed_style_alias_equal_to_a_name_is_refused(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """`v2.tool` is also a well-formed name: as another capability's name it wins the alias."""
    declarations = SEEDED + """
[[capability]]
name = "v2.tool"
op = "alias.echo"
summary = "A capability really called v2.tool."
"""
    registry = await build_with(tmp_path, plugin_dir, "alias_plugin_j", declarations)
    (error,) = errors_of(registry)
    assert (error.capability, error.field) == ("review.audit", "aliases")
    assert "alias 'v2.tool' is the name of another capability" in str(error)
    assert "review.audit" not in registry
    assert "security-auditor" not in registry
    assert registry.get("@v2.tool").name == "v2.tool"


async def test_an_error_route_may_name_a_marked_alias(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """`try = ["@security-auditor", "@notes.add"]` builds a chain of canonical names."""
    declarations = SEEDED + """
[[capability]]
name = "review.quick"
op = "alias.echo"
summary = "A quick review that falls back to the audit."

[[capability.on_error]]
error_type = "*"
try = ["@security-auditor", "@notes.add"]
"""
    registry = await build_with(tmp_path, plugin_dir, "alias_plugin_k", declarations)
    assert errors_of(registry) == []
    assert registry.get("review.quick").fallbacks_for("timeout") == ("review.audit",
                                                                     "notes.append")


async def test_an_error_route_naming_its_own_marked_alias_is_refused(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """A capability is no fallback of itself, even as `@` one of its own aliases."""
    declarations = GOOD + """
[[capability]]
name = "review.audit"
op = "alias.echo"
summary = "Falls back to itself."
aliases = ["security-auditor"]

[[capability.on_error]]
error_type = "*"
try = ["@security-auditor"]
"""
    registry = await build_with(tmp_path, plugin_dir, "alias_plugin_l", declarations)
    (error,) = errors_of(registry)
    assert (error.capability, error.field) == ("review.audit", "on_error")
    assert "names the capability itself ('@security-auditor')" in str(error)


async def test_an_agent_entry_may_name_a_seed_alias_bare_or_marked(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """Agent entries take `security-auditor` and `@code_review` and select the capability."""
    registry = await build_with(tmp_path, plugin_dir, "alias_plugin_m", SEEDED)
    spec = AgentSpec(capabilities=("security-auditor", "@code_review", "@notes.append"))
    picked = [select_capabilities(registry, entry) for entry in spec.capabilities]
    assert [(s.capabilities, s.problem) for s in picked] == [
        (("review.audit",), None), (("review.audit",), None), (("notes.append",), None)]
    missed = select_capabilities(registry, "@security-auditr")
    assert missed.capabilities == ()
    assert "security-auditor" in (missed.problem or "")


@pytest.mark.parametrize("entry", ["Upper", "has space", "-lead", "@", "@-lead"])
def test_an_agent_entry_that_is_no_name_or_alias_is_refused(entry: str) -> None:
    """AgentSpec refuses an entry that is neither a name nor an alias, marked or not."""
    with pytest.raises(ValidationError, match="is not a capability name or alias"):
        AgentSpec(capabilities=(entry,))


async def test_search_puts_a_marked_alias_first(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """Searching `@security-auditor` finds its capability as an exact match."""
    registry = await build_with(tmp_path, plugin_dir, "alias_plugin_n", SEEDED)
    first = registry.search_index().search("@security-auditor", method="bm25")[0]
    assert (first.capability.name, first.exact) == ("review.audit", True)


@pytest.mark.parametrize("alias", [*SEEDS, "a", "7zip", "a" * 64, "x-1.y_2"])
def test_a_capability_takes_any_well_formed_alias(alias: str) -> None:
    """1 to 64 of a-z 0-9 . _ -, starting with a letter or digit, is an alias."""
    assert _cap("a.one", alias).aliases == (alias,)


@pytest.mark.parametrize("alias", ["Upper", "has space", "-lead", "a" * 65, "", "a/b",
                                   "@alias", "end\n"])
def test_a_capability_refuses_a_malformed_alias(alias: str) -> None:
    """Capability() itself refuses a malformed alias, naming it and the rule."""
    with pytest.raises(ValidationError, match="an alias is 1 to 64 characters") as caught:
        _cap("a.one", alias)
    assert repr(alias) in str(caught.value)


def _cap(name: str, *aliases: str) -> Capability:
    class Empty(BaseModel):
        pass

    async def func(params: Empty) -> None:
        return None

    return Capability(name=name, summary="x", parameters=Empty, func=func, aliases=aliases)


def test_a_registry_built_by_hand_refuses_clashing_aliases() -> None:
    """Registry() itself refuses an alias shared or equal to another name (ValueError)."""
    with pytest.raises(ValueError, match=r"already an alias of 'a\.one'"):
        Registry([_cap("a.one", "a.x"), _cap("a.two", "a.x")], {}, {})
    with pytest.raises(ValueError, match="is the name of another capability"):
        Registry([_cap("a.one", "a.two"), _cap("a.two")], {}, {})
    assert Registry([_cap("a.one", "a.x")], {}, {}).get("a.x").name == "a.one"


# ------------------------------------------------------------------ the real daemon

ALIASED_CAPS = E2E_CAPS.replace(
    'name = "e2e.echo"\n',
    'name = "e2e.echo"\naliases = ["e2e.say", "security-auditor", "code_review", "v2.tool"]\n')


@pytest.fixture
def aliased(short_tmp: Path, web: FlipServer) -> Iterator[DaemonProcess]:
    """The real daemon on the e2e pack, e2e.echo also called e2e.say and three seed aliases."""
    config = write_e2e_config(short_tmp, web.port)
    assert ALIASED_CAPS != E2E_CAPS
    (short_tmp / "caps.toml").write_text(ALIASED_CAPS)
    daemon = DaemonProcess(config, short_tmp / "capd.sock")
    try:
        yield daemon.start().wait_ready()
    finally:
        daemon.kill()


@pytest.mark.slow
def test_http_get_and_call_by_alias_answer_for_the_capability(aliased: DaemonProcess) -> None:
    """GET /capabilities/<alias> is the manifest, POST /call/<alias> runs it, both canonical."""
    manifest = aliased.call("GET", "/capabilities/e2e.say")
    assert manifest.status == 200, manifest.body
    assert manifest.body["name"] == "e2e.echo"
    assert manifest.body["aliases"] == ["e2e.say", *SEEDS]
    called = aliased.call("POST", "/call/e2e.say", {"text": "by alias"})
    assert called.status == 200, called.body
    assert called.body["capability"] == "e2e.echo"
    assert called.body["result"] == {"text": "by alias", "version": "v1"}
    telemetry = aliased.call("GET", "/capabilities/e2e.echo").body["telemetry"]
    assert telemetry["calls"] == {"success": 1}


@pytest.mark.slow
def test_http_unknown_name_suggests_the_alias(aliased: DaemonProcess) -> None:
    """A near miss of an alias is a 404 whose suggestions name the alias."""
    missed = aliased.call("GET", "/capabilities/e2e.sa")
    assert missed.status == 404
    assert "e2e.say" in missed.body["suggestions"]


@pytest.mark.slow
def test_http_takes_a_seed_alias_bare_marked_and_percent_encoded(aliased: DaemonProcess) -> None:
    """/call, /capabilities and /recheck take `alias`, `@alias` and `%40alias` alike."""
    for path in ("/call/security-auditor", "/call/@security-auditor",
                 "/call/%40security-auditor", "/call/%40code_review", "/call/@v2.tool",
                 "/call/%40e2e.echo"):
        called = aliased.call("POST", path, {"text": path})
        assert called.status == 200, (path, called.body)
        assert (called.body["capability"], called.body["result"]["text"]) == ("e2e.echo", path)
    for path in ("/capabilities/@security-auditor", "/capabilities/%40security-auditor",
                 "/capabilities/code_review"):
        shown = aliased.call("GET", path)
        assert (shown.status, shown.body["name"]) == (200, "e2e.echo"), path
    recheck = aliased.call("POST", "/recheck/%40security-auditor")
    assert (recheck.status, recheck.body["name"], recheck.body["state"]) == (
        200, "e2e.echo", "live")


@pytest.mark.slow
def test_http_unknown_marked_alias_is_a_404_suggesting_the_alias(aliased: DaemonProcess) -> None:
    """A near miss written with `@` is a 404 naming what was asked, suggesting the alias."""
    missed = aliased.call("POST", "/call/%40security-auditr", {})
    assert missed.status == 404, missed.body
    assert "security-auditor" in missed.body["suggestions"]
    assert "'@security-auditr'" in missed.body["detail"]


def capd(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "capd", *args, "--socket",
                           str(daemon.socket)], capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.mark.slow
def test_cli_show_and_call_take_an_alias(aliased: DaemonProcess) -> None:
    """`capd show ALIAS` and `capd call ALIAS` exit 0 and answer for the capability."""
    show = capd(aliased, "show", "e2e.say")
    assert show.returncode == 0, show.stderr
    assert "e2e.echo" in show.stdout
    call = capd(aliased, "call", "e2e.say", "-p", "text=cli", "--json")
    assert call.returncode == 0, call.stderr
    assert '"capability": "e2e.echo"' in call.stdout.replace('":"', '": "')


@pytest.mark.slow
def test_cli_show_and_call_take_a_marked_seed_alias(aliased: DaemonProcess) -> None:
    """`capd show @security-auditor` and `capd call @security-auditor` answer for e2e.echo."""
    show = capd(aliased, "show", "@security-auditor")
    assert show.returncode == 0, show.stderr
    assert "e2e.echo" in show.stdout
    for name in ("@security-auditor", "code_review", "@v2.tool"):
        call = capd(aliased, "call", name, "-p", f"text={name}", "--json")
        assert call.returncode == 0, (name, call.stderr)
        body = json.loads(call.stdout)
        assert (body["capability"], body["result"]["text"]) == ("e2e.echo", name)
    missed = capd(aliased, "call", "@security-auditr", "--json")
    assert missed.returncode != 0
    assert "security-auditor" in missed.stdout + missed.stderr


@pytest.mark.slow
async def test_mcp_bridge_takes_a_marked_seed_alias_as_an_id(
    aliased: DaemonProcess, short_tmp: Path
) -> None:
    """get_capability and invoke_capability take `@security-auditor`, with a profile or not."""
    async with bridge(aliased.socket) as session:
        got = await session.call_tool("get_capability", {"id": "@code_review"})
        assert data(got)["name"] == "e2e.echo"
        ok = await session.call_tool("invoke_capability",
                                     {"id": "@security-auditor", "arguments": {"text": "mcp"}})
        assert (ok.is_error, data(ok)["capability"], data(ok)["result"]["text"]) == (
            False, "e2e.echo", "mcp")
    by_alias = short_tmp / "seed.toml"
    by_alias.write_text('name = "auditor"\ncapabilities = ["security-auditor"]\n')
    async with bridge(aliased.socket, "--profile", str(by_alias)) as session:
        ok = await session.call_tool("invoke_capability", {"id": "@v2.tool"})
        assert (ok.is_error, data(ok)["capability"]) == (False, "e2e.echo")


@pytest.mark.slow
async def test_mcp_bridge_checks_an_alias_as_its_capability(
    aliased: DaemonProcess, short_tmp: Path
) -> None:
    """A profile naming the capability admits its alias; one naming neither refuses it."""
    allowed = short_tmp / "echo.toml"
    allowed.write_text('name = "echoer"\ncapabilities = ["e2e.echo"]\n')
    async with bridge(aliased.socket, "--profile", str(allowed)) as session:
        got = await session.call_tool("get_capability", {"id": "e2e.say"})
        assert data(got)["name"] == "e2e.echo"
        ok = await session.call_tool("invoke_capability",
                                     {"id": "e2e.say", "arguments": {"text": "mcp"}})
        assert (ok.is_error, data(ok)["capability"], data(ok)["result"]["text"]) == (
            False, "e2e.echo", "mcp")
    by_alias = short_tmp / "alias.toml"
    by_alias.write_text('name = "sayer"\ncapabilities = ["e2e.say"]\n')
    async with bridge(aliased.socket, "--profile", str(by_alias)) as session:
        ok = await session.call_tool("invoke_capability", {"id": "e2e.echo"})
        assert data(ok)["status"] == "success"
        listed = data(await session.call_tool("list_capabilities", {}))
        assert [c["name"] for c in listed["capabilities"]] == ["e2e.echo"]
    other = short_tmp / "slow.toml"
    other.write_text('name = "sleeper"\ncapabilities = ["e2e.slow"]\n')
    async with bridge(aliased.socket, "--profile", str(other)) as session:
        refused = await session.call_tool("invoke_capability", {"id": "e2e.say"})
        assert refused.is_error
        assert "unknown capability" in refused.content[0].text  # type: ignore[union-attr]
