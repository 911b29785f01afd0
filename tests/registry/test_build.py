"""Building a registry from plugins, declarations and real probes."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

import pytest

from capd.registry import (
    BuildConfig,
    CommandProbe,
    PathProbe,
    PluginError,
    ProbeResult,
    ToolSpec,
    UnknownCapability,
    build,
)
from tests.helpers.servers import HttpServer

PLUGIN = '''
from pydantic import BaseModel, Field
from capd.registry import capability, op

class Echo(BaseModel):
    text: str = Field(description="What to echo.")

@op("demo.echo")
async def echo(params: Echo) -> str:
    return params.text

@capability("demo.shout", summary="Echo in capitals.", requires=["sh"], tags=("demo",))
async def shout(params: Echo) -> str:
    return params.text.upper()
'''

DECLARATIONS = """
[[capability]]
name = "demo.echo"
op = "demo.echo"
summary = "Echo text back."
requires = ["sh"]

[[capability]]
name = "demo.web"
op = "demo.echo"
summary = "Echo, but needs the web service."
requires = ["sh", "web"]
"""


def config(tmp_path: Path, tools: dict[str, ToolSpec], module: str) -> BuildConfig:
    decl = tmp_path / "decl.toml"
    decl.write_text(DECLARATIONS)
    return BuildConfig(plugins=(module,), declarations=(decl,), tools=tools, entry_points=False)


async def test_build_partitions_live_and_disabled_with_reasons(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path], http_server: HttpServer,
    free_port: int,
) -> None:
    """Capabilities whose tools all pass are live; the others carry missing tools and errors."""
    plugin_dir("demo_plugin_a", PLUGIN)
    from capd.registry import HttpProbe

    tools: dict[str, ToolSpec] = {
        "sh": CommandProbe(which="sh"),
        "web": HttpProbe(url=f"http://127.0.0.1:{free_port}/"),
    }
    registry = await build(config(tmp_path, tools, "demo_plugin_a"))
    snap = registry.snapshot()
    assert sorted(snap.live) == ["demo.echo", "demo.shout"]
    entry = snap.disabled["demo.web"]
    assert entry.missing == ("web",)
    assert entry.errors["web"].startswith(f"cannot connect to 127.0.0.1:{free_port}")
    assert registry.get("demo.web").op_id == "demo.echo"
    assert registry.get("demo.shout").op_id is None
    assert snap.errors == ()


async def test_each_tool_is_probed_once_however_many_capabilities_need_it(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path],
) -> None:
    """Distinct tools are probed once each, all started before any finishes."""
    plugin_dir("demo_plugin_b", PLUGIN)
    calls: list[str] = []
    gate = asyncio.Event()

    async def probe(tool: str, spec: ToolSpec) -> ProbeResult:
        calls.append(tool)
        if len(calls) == 2:
            gate.set()
        await gate.wait()
        return ProbeResult(tool=tool, ok=True, latency_s=0.0, checked_at=0.0)

    tools: dict[str, ToolSpec] = {"sh": CommandProbe(which="sh"), "web": CommandProbe(which="sh")}
    registry = await asyncio.wait_for(
        build(config(tmp_path, tools, "demo_plugin_b"), probe=probe), 5
    )
    assert sorted(calls) == ["sh", "web"]
    assert len(registry.snapshot().live) == 3


async def test_unknown_capability_fails_closed(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """get() of an unknown name raises UnknownCapability with suggestions, never a fallback."""
    plugin_dir("demo_plugin_c", PLUGIN)
    registry = await build(config(tmp_path, {"sh": CommandProbe(which="sh"),
                                             "web": CommandProbe(which="sh")}, "demo_plugin_c"))
    with pytest.raises(UnknownCapability, match=r"unknown capability 'demo.ecko' \(did you mean"):
        registry.get("demo.ecko")
    with pytest.raises(UnknownCapability):
        registry.is_live("nothing.here")
    assert "demo.echo" in registry


async def test_snapshot_is_immutable_and_detached(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """A snapshot cannot be mutated and does not change when the registry does."""
    plugin_dir("demo_plugin_d", PLUGIN)
    registry = await build(config(tmp_path, {"sh": CommandProbe(which="sh"),
                                             "web": CommandProbe(which="sh")}, "demo_plugin_d"))
    snap = registry.snapshot()
    assert isinstance(snap.live, MappingProxyType)
    with pytest.raises(TypeError):
        snap.live["x"] = snap.live["demo.echo"]  # type: ignore[index]
    registry.mark_tool_down("web", "gone")
    assert "demo.web" in snap.live
    assert "demo.web" in registry.snapshot().disabled


async def test_record_probe_restores_in_place_and_partial_recovery_updates_missing(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """A passing probe restores capabilities; a partial one narrows the missing list."""
    plugin_dir("demo_plugin_e", PLUGIN)
    tools: dict[str, ToolSpec] = {"sh": CommandProbe(which="capd-nope"),
                                  "web": CommandProbe(which="capd-nope")}
    registry = await build(config(tmp_path, tools, "demo_plugin_e"))
    assert registry.disabled_entry("demo.web") is not None
    restored, _ = registry.record_probe(ProbeResult(tool="sh", ok=True, latency_s=0,
                                                    checked_at=1))
    assert sorted(restored) == ["demo.echo", "demo.shout"]
    entry = registry.disabled_entry("demo.web")
    assert entry is not None
    assert entry.missing == ("web",)
    restored, _ = registry.record_probe(ProbeResult(tool="web", ok=True, latency_s=0,
                                                    checked_at=2))
    assert restored == ["demo.web"]
    assert registry.disabled_tools() == frozenset()


async def test_a_capability_requiring_an_undeclared_tool_is_a_declaration_error(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """requires naming no declared tool is reported and that capability is left out."""
    plugin_dir("demo_plugin_f", PLUGIN)
    tools: dict[str, ToolSpec] = {"sh": CommandProbe(which="sh")}
    registry = await build(config(tmp_path, tools, "demo_plugin_f"))
    snap = registry.snapshot()
    assert "demo.web" not in registry
    assert [str(e) for e in snap.errors] == [
        f"{tmp_path}/decl.toml: demo.web: requires unknown tool 'web'; "
        "declare it under [tools.<id>] in capd.toml or in a declaration file"
    ]


async def test_duplicate_names_keep_the_first_and_report_the_second(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """A second capability with the same name is an error naming both sources."""
    plugin_dir("demo_plugin_g", PLUGIN)
    cfg = config(tmp_path, {"sh": CommandProbe(which="sh"), "web": CommandProbe(which="sh")},
                 "demo_plugin_g")
    (tmp_path / "dup.toml").write_text(DECLARATIONS.split("[[capability]]")[1].join(
        ["[[capability]]", ""]))
    cfg = cfg.model_copy(update={"declarations": (*cfg.declarations, tmp_path / "dup.toml")})
    registry = await build(cfg)
    errors = [str(e) for e in registry.snapshot().errors]
    assert errors == [f"{tmp_path}/dup.toml: demo.echo: duplicate name: already declared by "
                      f"{tmp_path}/decl.toml"]


async def test_a_broken_plugin_raises_plugin_error(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """A plugin with a syntax error stops the build with the module, file and line."""
    path = plugin_dir("demo_plugin_broken", "def oops(:\n    pass\n")
    with pytest.raises(PluginError, match=rf"'demo_plugin_broken' failed to import: SyntaxError.*"
                       rf"{path.name}:1"):
        await build(BuildConfig(plugins=("demo_plugin_broken",), entry_points=False))


async def test_a_fresh_build_picks_up_an_edited_plugin(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """Two builds share no state: the second sees the edited op, the first keeps its own."""
    plugin_dir("demo_plugin_h", PLUGIN)
    tools: dict[str, ToolSpec] = {"sh": CommandProbe(which="sh"), "web": CommandProbe(which="sh")}
    first = await build(config(tmp_path, tools, "demo_plugin_h"))
    edited = PLUGIN.replace("return params.text\n", "return 'v2:' + params.text\n")
    plugin_dir("demo_plugin_h", edited)
    second = await build(config(tmp_path, tools, "demo_plugin_h"))
    from pydantic import BaseModel

    def params(reg: object) -> BaseModel:
        return reg.get("demo.echo").parameters(text="hi")  # type: ignore[attr-defined, no-any-return]

    assert await first.get("demo.echo").invoke(params(first)) == "hi"
    assert await second.get("demo.echo").invoke(params(second)) == "v2:hi"
    assert "demo_plugin_h" in sys.modules


async def test_path_tools_use_variables(tmp_path: Path) -> None:
    """A build with only tools and no capabilities still probes and reports them."""
    registry = await build(BuildConfig(tools={"vault": PathProbe(path=str(tmp_path))},
                                       entry_points=False))
    result = registry.probe_result("vault")
    assert result is not None
    assert result.ok


async def test_host_requirements_leave_a_capability_out_where_they_fail(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capability needing another OS, a missing binary or an unset variable is not offered."""
    plugin_dir("demo_plugin_host", PLUGIN)
    monkeypatch.delenv("CAPD_TEST_UNSET", raising=False)
    decl = tmp_path / "host.toml"
    decl.write_text("""
[[capability]]
name = "host.ok"
op = "demo.echo"
summary = "Needs sh, which is here."
host = { binaries = ["sh"] }

[[capability]]
name = "host.other_os"
op = "demo.echo"
summary = "Needs an OS this is not."
host = { os = ["plan9"] }

[[capability]]
name = "host.env"
op = "demo.echo"
summary = "Needs a variable."
host = { env = ["CAPD_TEST_UNSET"], binaries = ["capd-no-such-binary"] }
""")
    registry = await build(BuildConfig(plugins=("demo_plugin_host",), declarations=(decl,),
                                       entry_points=False))
    assert "host.ok" in registry
    assert "host.other_os" not in registry
    assert registry.not_on_host["host.other_os"].startswith("os is ")
    assert registry.not_on_host["host.env"] == (
        "'capd-no-such-binary' not on PATH; $CAPD_TEST_UNSET not set")
    assert not [e for e in registry.snapshot().errors if (e.capability or "").startswith("host.")]
