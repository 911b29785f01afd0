"""Hook markers: @before_call / @after_call mark functions; a build collects them like ops."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from capd.registry import (
    BuildConfig,
    HookSpec,
    PluginError,
    Registry,
    after_call,
    before_call,
    build,
)

PLUGIN = '''
from pydantic import BaseModel
from capd.registry import after_call, before_call, op

class Echo(BaseModel):
    text: str = "x"

@op("hook.echo")
async def echo(params: Echo) -> str:
    return params.text

@before_call()
def audit(capability, params, caller):
    return None

@after_call("notes.*")
async def record(capability, params, caller, result):
    return None

@before_call("web.*", name="gate")
async def gate(capability, params, caller):
    return None
'''

DECLARATION = """
[[capability]]
name = "hook.echo"
op = "hook.echo"
summary = "Echo text back."
"""


async def build_plugins(tmp_path: Path, *modules: str, declare: bool = True) -> Registry:
    """Build ``modules`` through the normal build, with DECLARATION unless ``declare`` is off."""
    decl = tmp_path / "decl.toml"
    decl.write_text(DECLARATION)
    return await build(BuildConfig(plugins=modules, declarations=(decl,) if declare else (),
                                   entry_points=False, label_root=tmp_path))


async def test_marked_hooks_are_collected_under_their_keys(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """Each marked function becomes a HookSpec keyed module:function, in definition order."""
    plugin_dir("hooks_plugin_a", PLUGIN)
    registry = await build_plugins(tmp_path, "hooks_plugin_a")
    assert registry.snapshot().errors == ()
    assert list(registry.hooks) == ["hooks_plugin_a:audit", "hooks_plugin_a:record", "gate"]
    audit = registry.hooks["hooks_plugin_a:audit"]
    assert (audit.name, audit.kind, audit.pattern) == ("hooks_plugin_a:audit", "before", "*")
    record = registry.hooks["hooks_plugin_a:record"]
    assert (record.kind, record.pattern) == ("after", "notes.*")
    import hooks_plugin_a  # type: ignore[import-not-found]  # written by the test

    assert audit.func is hooks_plugin_a.audit
    assert record.func is hooks_plugin_a.record
    assert "hook.echo" in registry


async def test_a_named_hook_is_keyed_by_its_name(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """name= replaces the module:function key; the spec still knows where it is defined."""
    plugin_dir("hooks_plugin_b", PLUGIN)
    registry = await build_plugins(tmp_path, "hooks_plugin_b")
    gate = registry.hooks["gate"]
    assert (gate.name, gate.kind, gate.pattern) == ("gate", "before", "web.*")
    assert gate.source == "hooks_plugin_b:gate"
    assert "hooks_plugin_b:gate" not in registry.hooks


async def test_two_hooks_with_one_key_are_a_declaration_error(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """The second hook claiming a key is reported and left out; the first and the rest build."""
    plugin_dir("hooks_plugin_c", PLUGIN + '''
@after_call(name="gate")
def second_gate(capability, params, caller, result):
    return None
''')
    registry = await build_plugins(tmp_path, "hooks_plugin_c")
    assert [str(e) for e in registry.snapshot().errors] == [
        "hooks_plugin_c:second_gate: hook name 'gate' is already taken by the before-hook "
        "hooks_plugin_c:gate; pass name= to tell them apart"
    ]
    assert registry.hooks["gate"].source == "hooks_plugin_c:gate"
    assert list(registry.hooks) == ["hooks_plugin_c:audit", "hooks_plugin_c:record", "gate"]
    assert "hook.echo" in registry


async def test_stacked_markers_without_names_clash_and_with_a_name_both_count(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """One function may be a before- and an after-hook, if one of the two is named."""
    plugin_dir("hooks_plugin_d", '''
from capd.registry import after_call, before_call

@after_call("a.*", name="around_after")
@before_call("a.*")
def around(capability, params, caller, result=None):
    return None

@after_call()
@before_call()
def twice(capability, params, caller, result=None):
    return None
''')
    registry = await build_plugins(tmp_path, "hooks_plugin_d", declare=False)
    assert [(k, h.kind) for k, h in registry.hooks.items()] == [
        ("hooks_plugin_d:around", "before"), ("around_after", "after"),
        ("hooks_plugin_d:twice", "before"),
    ]
    (error,) = registry.snapshot().errors
    assert str(error).startswith("hooks_plugin_d:twice: hook name 'hooks_plugin_d:twice' is "
                                 "already taken by the before-hook hooks_plugin_d:twice")


async def test_a_hook_met_in_two_scanned_modules_is_one_hook(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """A plugin that re-exports another plugin's hook does not make a duplicate."""
    plugin_dir("hooks_plugin_e", PLUGIN)
    plugin_dir("hooks_plugin_e2", "from hooks_plugin_e import audit, gate\n")
    registry = await build_plugins(tmp_path, "hooks_plugin_e", "hooks_plugin_e2")
    assert registry.snapshot().errors == ()
    assert list(registry.hooks) == ["hooks_plugin_e:audit", "hooks_plugin_e:record", "gate"]


async def test_a_rebuild_collects_hooks_afresh(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """An edited plugin's hooks reach the next build; the previous registry keeps its own."""
    plugin_dir("hooks_plugin_f", PLUGIN)
    first = await build_plugins(tmp_path, "hooks_plugin_f")
    plugin_dir("hooks_plugin_f", PLUGIN.replace('@after_call("notes.*")', '@after_call("tasks.*")')
               .replace('name="gate"', 'name="gate_v2"'))
    second = await build_plugins(tmp_path, "hooks_plugin_f")
    assert list(first.hooks) == ["hooks_plugin_f:audit", "hooks_plugin_f:record", "gate"]
    assert list(second.hooks) == ["hooks_plugin_f:audit", "hooks_plugin_f:record", "gate_v2"]
    assert first.hooks["hooks_plugin_f:record"].pattern == "notes.*"
    assert second.hooks["hooks_plugin_f:record"].pattern == "tasks.*"
    assert second.hooks["hooks_plugin_f:audit"].func is not first.hooks["hooks_plugin_f:audit"].func


async def test_hooks_are_never_global(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """A build of plugins that mark no hooks has none, whatever other builds imported."""
    plugin_dir("hooks_plugin_g", PLUGIN)
    plugin_dir("hooks_plugin_g_plain", "from capd.registry import op\n")
    with_hooks = await build_plugins(tmp_path, "hooks_plugin_g")
    without = await build_plugins(tmp_path, "hooks_plugin_g_plain", declare=False)
    assert len(with_hooks.hooks) == 3
    assert dict(without.hooks) == {}
    assert without.snapshot().errors == ()
    with pytest.raises(TypeError):
        without.hooks["x"] = with_hooks.hooks["gate"]  # type: ignore[index]


def test_matches_is_a_case_sensitive_glob_over_capability_names() -> None:
    """fnmatch semantics: '*' matches anything, 'notes.*' its namespace, case counts."""

    def hook(capability: Any, params: Any, caller: Any) -> None:
        return None

    every = HookSpec(name="every", kind="before", pattern="*", func=hook)
    notes = HookSpec(name="notes", kind="before", pattern="notes.*", func=hook)
    one = HookSpec(name="one", kind="before", pattern="web.fetch?", func=hook)
    assert every.matches("notes.append")
    assert every.matches("web.fetch")
    assert notes.matches("notes.append")
    assert not notes.matches("web.fetch")
    assert not notes.matches("Notes.append")
    assert not notes.matches("notesx.append")
    assert one.matches("web.fetch2")
    assert not one.matches("web.fetch")


def test_a_marker_returns_the_function_itself() -> None:
    """Marking attaches a spec; the function is unchanged and still callable."""

    def hook(capability: Any, params: Any, caller: Any) -> str:
        return "called"

    marked = before_call("a.*")(hook)
    assert marked is hook
    assert marked(None, None, None) == "called"


@pytest.mark.parametrize("pattern", ["", "   "])
def test_an_empty_pattern_is_refused_when_decorating(pattern: str) -> None:
    """before_call('') and after_call('') fail at once with what to write instead."""
    with pytest.raises(ValueError, match=r"pattern must be a non-empty glob.*'notes\.\*' or '\*'"):
        before_call(pattern)
    with pytest.raises(ValueError, match="after_call: pattern must be a non-empty glob"):
        after_call(pattern)


def test_an_empty_name_is_refused_when_decorating() -> None:
    """name='' is a mistake, not a request for the default key."""
    with pytest.raises(ValueError, match="before_call: name must not be empty"):
        before_call(name="")


def test_a_marker_without_parentheses_says_so() -> None:
    """@before_call on its own (no call) is a TypeError telling the fix."""

    def hook(capability: Any, params: Any, caller: Any) -> None:
        return None

    with pytest.raises(TypeError, match=r"use @before_call\(\) or @before_call\('<pattern>'\)"):
        before_call(hook)  # type: ignore[arg-type]


def test_a_hook_that_cannot_take_its_arguments_is_refused() -> None:
    """A before-hook takes three arguments, an after-hook four; otherwise a clear TypeError."""

    def three(capability: Any, params: Any, caller: Any) -> None:
        return None

    def none() -> None:
        return None

    with pytest.raises(TypeError, match=r"after_call hook .*three must accept \(capability, "
                       r"params, caller, result\)"):
        after_call()(three)
    with pytest.raises(TypeError, match=r"before_call hook .*none must accept"):
        before_call()(none)


def test_a_hook_spec_validates_what_it_is_given() -> None:
    """A HookSpec built by hand is held to the same rules as one a marker builds."""
    with pytest.raises(ValueError, match="pattern must be a non-empty glob"):
        HookSpec(name="x", kind="before", pattern="", func=print)
    with pytest.raises(ValueError, match="kind must be 'before' or 'after'"):
        HookSpec(name="x", kind="during", pattern="*", func=print)  # type: ignore[arg-type]


async def test_a_plugin_with_an_empty_pattern_fails_to_import_with_the_reason(
    tmp_path: Path, plugin_dir: Callable[[str, str], Path]
) -> None:
    """The decoration error surfaces as the plugin's import error, naming file and line."""
    path = plugin_dir("hooks_plugin_bad", '''
from capd.registry import before_call

@before_call("")
def audit(capability, params, caller):
    return None
''')
    where = re.escape(f"({path}:4)")
    with pytest.raises(PluginError, match=rf"'hooks_plugin_bad' failed to import: ValueError: "
                       rf"before_call: pattern must be a non-empty glob.*{where}"):
        await build_plugins(tmp_path, "hooks_plugin_bad")


def test_a_registry_built_by_hand_takes_hooks() -> None:
    """Registry(hooks=...) serves them read-only; without them it has none."""

    def hook(capability: Any, params: Any, caller: Any) -> None:
        return None

    spec = HookSpec(name="h", kind="before", pattern="*", func=hook)
    assert dict(Registry([], {}, {}, hooks={"h": spec}).hooks) == {"h": spec}
    assert dict(Registry([], {}, {}).hooks) == {}
