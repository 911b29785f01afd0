"""Aliases resolve wherever a capability name does: registry, HTTP API, CLI and MCP bridge.

A bad alias (a clash with a name, one shared by two capabilities, a malformed
one) is a declaration error that leaves its capability out of the build.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from capd.registry import (
    BuildConfig,
    Capability,
    CommandProbe,
    DeclarationError,
    ProbeResult,
    Registry,
    ToolSpec,
    UnknownCapability,
    build,
)

from .daemon import E2E_CAPS, DaemonProcess, FlipServer, write_e2e_config
from .test_mcp import bridge, data

PLUGIN = '''
from pydantic import BaseModel, Field
from capd.registry import capability, op

class Echo(BaseModel):
    text: str = Field("x", description="What to echo.")

@op("alias.echo")
async def echo(params: Echo) -> str:
    return params.text

@capability("alias.shout", summary="Echo in capitals.", requires=["sh"],
            aliases=("alias.yell",))
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


@pytest.mark.parametrize(("aliases", "expected"), [
    ('["Notes.Add"]', "alias 'Notes.Add' is not a well-formed capability name"),
    ('["add"]', "alias 'add' is not a well-formed capability name"),
    ('["notes/add"]', "alias 'notes/add' is not a well-formed capability name"),
    ('["notes.odd", "notes.odd"]', "alias 'notes.odd' is listed twice"),
    ('["notes.odd2"]', "alias 'notes.odd2' repeats the capability's own name"),
])
async def test_a_malformed_alias_is_a_declaration_error(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path], aliases: str, expected: str
) -> None:
    """An alias that is not a well-formed, new name leaves its capability out, naming the field."""
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
    assert expected in str(error)
    assert "notes.odd2" not in registry
    assert sorted(registry.snapshot().live) == ["alias.shout", "notes.append", "notes.publish"]


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

ALIASED_CAPS = E2E_CAPS.replace('name = "e2e.echo"\n', 'name = "e2e.echo"\naliases = ["e2e.say"]\n')


@pytest.fixture
def aliased(short_tmp: Path, web: FlipServer) -> Iterator[DaemonProcess]:
    """The real daemon on the e2e pack, with e2e.echo also called e2e.say."""
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
    assert manifest.body["aliases"] == ["e2e.say"]
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
        assert "not in this agent's profile (sleeper)" in refused.content[0].text  # type: ignore[union-attr]
