"""Declaration loading: every error class names the file, the capability and the field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel

from capd.registry import ConfigError, OpTable, load_declarations, op
from capd.registry._ops import OpSpec


class NoteParams(BaseModel):
    note: str
    line: str


@op("notes.append")
def append(params: NoteParams, *, vault: str = "/v") -> None:
    return None


@pytest.fixture
def ops() -> OpTable:
    table = OpTable()
    spec = append.__capd_op__  # type: ignore[attr-defined]
    assert isinstance(spec, OpSpec)
    table.ops[spec.id] = spec
    return table


GOOD = """
[[capability]]
name = "notes.append"
op = "notes.append"
summary = "Append a line."
requires = ["vault"]
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load(folder: Path, ops: OpTable) -> tuple[list[str], list[str]]:
    result = load_declarations([folder], ops, {"vault": "/v"}, label_root=folder.parent)
    return [c.name for c in result.capabilities], [str(e) for e in result.errors]


def test_a_good_declaration_loads(tmp_path: Path, ops: OpTable) -> None:
    """A valid declaration becomes a capability carrying its op id and source file."""
    write(tmp_path, "notes.toml", GOOD)
    result = load_declarations([tmp_path], ops, {}, label_root=tmp_path)
    assert result.errors == []
    (cap,) = result.capabilities
    assert (cap.name, cap.op_id, cap.source) == ("notes.append", "notes.append", "notes.toml")
    assert cap.parameters is NoteParams


def test_unknown_op_suggests_the_close_one(tmp_path: Path, ops: OpTable) -> None:
    """A misspelt op names the file, the capability and suggests the right op."""
    caps = tmp_path / "capabilities"
    caps.mkdir()
    write(caps, "notes.toml", GOOD.replace('op = "notes.append"', 'op = "notes.apend"'))
    names, errors = load(caps, ops)
    assert names == []
    assert errors == [
        "capabilities/notes.toml: notes.append: unknown op 'notes.apend' "
        "(did you mean 'notes.append'?)"
    ]


def test_one_bad_declaration_does_not_stop_the_others(tmp_path: Path, ops: OpTable) -> None:
    """A broken capability is reported; its neighbours in the same and other files load."""
    write(tmp_path, "a.toml", GOOD + GOOD.replace("notes.append\"\nop", "notes.broken\"\nop")
          .replace('summary = "Append a line."', "summary = 5"))
    write(tmp_path, "b.toml", GOOD.replace('name = "notes.append"', 'name = "notes.other"'))
    names, errors = load(tmp_path, ops)
    assert names == ["notes.append", "notes.other"]
    assert len(errors) == 1
    assert errors[0].startswith(f"{tmp_path.name}/a.toml: notes.broken: summary:")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[[capability]\nname = 1", "not valid TOML"),
        ("[capabilities]\nx = 1", "unknown top-level key 'capabilities'"),
        (GOOD + "colour = 'red'\n", "notes.append: colour: unknown field"),
        (GOOD.replace('requires = ["vault"]', 'requires = "vault"'), "notes.append: requires:"),
        (GOOD.replace('op = "notes.append"\n', ""), "missing field 'op'"),
        (GOOD + "func = 'x'\n", "field 'func' cannot be declared"),
        (GOOD.replace("notes.append\"\nop", "Notes\"\nop"), "Notes: name: String should match"),
        (GOOD + "mutates_state = false\nretry_policy = 'replay'\n",
         "only applies to a capability that mutates state"),
        (GOOD + "mutates_state = true\nretry_policy = 'verify_first'\n",
         "needs at least one declared effect"),
        (GOOD + "mutates_state = true\nretry_policy = 'verify_first'\n"
         "[[capability.effects]]\nkind = 'file_exists'\npath = '{nowhere}'\n",
         "effects[0].path: unknown placeholder {nowhere}"),
        (GOOD + "[[capability.effects]]\nkind = 'teleport'\n", "effects.0: Input tag 'teleport'"),
        (GOOD + "options = { vault = '{undefined_var}' }\n",
         "options: no value for placeholder {undefined_var}"),
        ("[tools.x]\nkind = 'http'\nurl = 'ftp://x'\n", "tool 'x': http.url: String should match"),
        ("capability = 3\n", "use [[capability]]"),
    ],
)
def test_each_declaration_error_class(tmp_path: Path, ops: OpTable, text: str,
                                      expected: str) -> None:
    """Each kind of broken declaration yields one clear error naming the file."""
    write(tmp_path, "bad.toml", text)
    _, errors = load(tmp_path, ops)
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"{tmp_path.name}/bad.toml: ")
    assert expected in errors[0]


def test_declaration_files_can_declare_tools(tmp_path: Path, ops: OpTable) -> None:
    """[tools.<id>] in a declaration file is validated with variables substituted."""
    write(tmp_path, "t.toml", "[tools.vault]\nkind = 'path'\npath = '{vault}/x'\n")
    result = load_declarations([tmp_path], ops, {"vault": "/srv"})
    assert result.errors == []
    assert result.tools["vault"].model_dump()["path"] == "/srv/x"


def test_missing_declarations_path_is_a_config_error(tmp_path: Path, ops: OpTable) -> None:
    """A declarations path that does not exist is a config error, not a silent skip."""
    with pytest.raises(ConfigError, match="does not exist"):
        load_declarations([tmp_path / "nope"], ops, {})
