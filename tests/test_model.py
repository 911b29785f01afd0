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
