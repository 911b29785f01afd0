"""The Capability model's validation rules and safe templates."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from capd.registry import Capability, TemplateError, placeholders, render


class NoteParams(BaseModel):
    note: str
    line: str


def _fn(params: NoteParams) -> None:
    return None


def make(**overrides: Any) -> Capability:
    fields: dict[str, Any] = {
        "name": "notes.append", "summary": "Append.", "parameters": NoteParams, "func": _fn,
    }
    fields.update(overrides)
    return Capability(**fields)


@pytest.mark.parametrize("name", ["notes.append", "a.b.c", "gh.pr-list", "x1.y_2"])
def test_dot_namespaced_names_are_accepted(name: str) -> None:
    """Well-formed dot-namespaced names validate."""
    assert make(name=name).name == name


@pytest.mark.parametrize("name", ["notes", "Notes.append", ".append", "notes.", "a..b", "a b.c"])
def test_malformed_names_are_rejected(name: str) -> None:
    """Names without a namespace or with bad characters are rejected."""
    with pytest.raises(ValidationError, match="name"):
        make(name=name)


def test_capability_is_frozen() -> None:
    """A built capability cannot be mutated."""
    cap = make()
    with pytest.raises(ValidationError):
        cap.summary = "changed"  # type: ignore[misc]


def test_replay_without_mutates_state_is_rejected() -> None:
    """A replay/verify_first policy on a non-mutating capability is an error."""
    effect = {"kind": "file_exists", "path": "/tmp/{note}"}
    with pytest.raises(ValidationError, match="only applies to a capability that mutates"):
        make(retry_policy="replay", effects=[effect])
    with pytest.raises(ValidationError, match="only applies to a capability that mutates"):
        make(retry_policy="verify_first", effects=[effect])


def test_verify_first_needs_effects() -> None:
    """verify_first with nothing to verify is an error."""
    with pytest.raises(ValidationError, match="needs at least one declared effect"):
        make(mutates_state=True, retry_policy="verify_first")


def test_effect_placeholders_must_name_params_or_options() -> None:
    """An effect naming an unknown placeholder fails at load, listing the known names."""
    with pytest.raises(ValidationError, match=r"unknown placeholder \{nope\}; known names are"):
        make(mutates_state=True, retry_policy="verify_first",
             effects=[{"kind": "file_contains", "path": "{nope}.md", "line": "{line}"}])


def test_effect_placeholders_may_use_options() -> None:
    """Options are substitutable names too."""
    cap = make(mutates_state=True, retry_policy="verify_first", options={"vault": "/v"},
               effects=[{"kind": "file_contains", "path": "{vault}/{note}.md", "line": "{line}"}])
    assert cap.effects[0].kind == "file_contains"


@pytest.mark.parametrize("template", ["{note.__class__}", "{note[0]}", "{note!r}", "{note:>10}"])
def test_unsafe_placeholders_are_refused(template: str) -> None:
    """Attribute access, indexing, conversions and format specs are refused."""
    with pytest.raises(TemplateError, match="not a plain name"):
        placeholders(template)


def test_render_substitutes_and_keeps_escaped_braces() -> None:
    """Rendering substitutes names and keeps {{ }} literal; a missing name raises."""
    assert render("{a}/{{b}}", {"a": "x"}) == "x/{b}"
    with pytest.raises(TemplateError, match="no value for placeholder"):
        render("{a}", {})


async def test_invoke_passes_options_and_runs_sync_ops_in_a_thread() -> None:
    """invoke calls func(params, **options); a plain function runs off the loop."""
    import threading

    seen: dict[str, Any] = {}

    def op(params: NoteParams, *, vault: str) -> str:
        seen["thread"] = threading.current_thread() is threading.main_thread()
        return f"{vault}/{params.note}"

    cap = make(func=op, options={"vault": "/v"})
    assert await cap.invoke(NoteParams(note="a", line="b")) == "/v/a"
    assert seen["thread"] is False


def test_a_tool_may_carry_an_install_hint() -> None:
    """install_hint is on every probe kind; an empty one is refused."""
    from capd.registry import CommandProbe, PathProbe

    assert CommandProbe(which="git", install_hint="apt install git").install_hint == (
        "apt install git")
    assert PathProbe(path="/x").install_hint is None
    with pytest.raises(ValidationError, match="install_hint"):
        CommandProbe(which="git", install_hint="")


def test_safety_defaults_from_mutates_state_and_a_declared_one_wins() -> None:
    """read_only when not mutating, writes when mutating; a declared class is kept."""
    assert make().safety == "read_only"
    assert make(mutates_state=True).safety == "writes"
    assert make(mutates_state=True, safety="destructive").safety == "destructive"
    with pytest.raises(ValidationError, match="safety"):
        make(safety="harmless")


def test_a_description_fits_800_tokens() -> None:
    """800 tokens (3200 characters) load; one more character is refused with the count."""
    assert len(make(description="x" * 3200).description) == 3200
    with pytest.raises(ValidationError, match="description is about 801 tokens"):
        make(description="x" * 3201)


def test_context_budget_is_positive() -> None:
    """context_budget_tokens is optional and, when given, above zero."""
    assert make().context_budget_tokens is None
    with pytest.raises(ValidationError, match="context_budget_tokens"):
        make(context_budget_tokens=0)


def test_an_upstream_tool_is_destructive_only_when_its_annotations_say_so() -> None:
    """destructiveHint makes a writing MCP tool destructive; a long description is cut."""
    import mcp_types as types

    from capd.registry import McpProbe
    from capd.registry._upstream import upstream_capabilities

    schema = {"type": "object", "properties": {}}
    tools = [
        types.Tool(name="wipe", input_schema=schema, description="Wipe it.",
                   annotations=types.ToolAnnotations(destructive_hint=True)),
        types.Tool(name="put", input_schema=schema, description="Put it. " * 900),
        types.Tool(name="get", input_schema=schema, description="Get it.",
                   annotations=types.ToolAnnotations(read_only_hint=True,
                                                     destructive_hint=True)),
    ]

    async def never(*_: Any) -> Any:
        raise AssertionError("not called")

    caps = {c.name.rsplit(".", 1)[1]: c for c in upstream_capabilities(
        "up", McpProbe(command=("x",)), tools, never, "test")}
    assert {n: c.safety for n, c in caps.items()} == {
        "wipe": "destructive", "put": "writes", "get": "read_only"}
    assert len(caps["put"].description) <= 3200
