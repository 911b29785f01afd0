"""`capd check` as a user runs it: a real subprocess on a copy of the bundled example."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts the real daemon or the CLI as processes

CAPD = [sys.executable, "-m", "capd"]


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private state dir: the example's vault is seeded there, never in ~ or /var/lib."""
    folder = tmp_path / "state"
    monkeypatch.setenv("CAPD_STATE_DIR", str(folder))
    return folder


def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None
        ) -> subprocess.CompletedProcess[str]:
    merged = {**os.environ, **(env or {})}
    return subprocess.run([*CAPD, *args], capture_output=True, text=True, env=merged,
                          cwd=cwd, timeout=60, check=False)


def test_console_script_is_installed() -> None:
    """The `capd` console script sits beside the interpreter and answers --help."""
    script = Path(sys.executable).parent / "capd"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=30,
                          check=False)
    assert done.returncode == 0
    assert "check" in done.stdout


def test_check_on_the_example_shows_live_and_disabled(example_copy: Path) -> None:
    """The bundled example has live capabilities and one disabled with its missing tool named."""
    done = run("check", "--config", str(example_copy / "capd.toml"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("live") and "notes.append" in line for line in lines)
    disabled = [line for line in lines if line.startswith("disabled")]
    assert len(disabled) == 1
    assert "notes.publish" in disabled[0]
    assert "missing sync_server: " in disabled[0]
    assert "nothing listens on " in disabled[0]
    assert "sync-server.sock (no such socket)" in disabled[0]  # in the state dir: nobody else's
    assert "4 live, 1 disabled, 0 declaration error(s)" in done.stdout


def test_check_json(example_copy: Path) -> None:
    """--json prints the same facts as JSON."""
    done = run("check", "--config", str(example_copy / "capd.toml"), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [c["name"] for c in report["live"]] == [
        "notes.append", "notes.create", "notes.search", "notes.snapshot"]
    (disabled,) = report["disabled"]
    assert disabled["name"] == "notes.publish"
    assert disabled["missing"] == ["sync_server"]
    assert report["tools"]["vault"]["ok"] is True
    assert report["counts"] == {"live": 4, "disabled": 1, "errors": 0}


def test_env_overrides_the_file(example_copy: Path, tmp_path: Path) -> None:
    """CAPD_VARS__VAULT moves the vault; with no seed a missing one disables every notes op
    (nothing live then: exit 1)."""
    done = run("check", "--config", str(example_copy / "capd.toml"), "--json",
               env={"CAPD_VARS__VAULT": str(tmp_path / "nowhere"), "CAPD_SEED": "[]"})
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["live"] == []
    assert report["tools"]["vault"]["error"] == f"{tmp_path / 'nowhere'} does not exist"


def test_the_example_vault_is_seeded_into_the_state_dir(example_copy: Path, state_dir: Path
                                                        ) -> None:
    """check copies the bundled vault to {state_dir}/example-vault once; the copy is kept."""
    done = run("check", "--config", str(example_copy / "capd.toml"), "--json")
    assert done.returncode == 0, done.stderr
    vault = state_dir / "example-vault"
    assert json.loads(done.stdout)["tools"]["vault"]["ok"] is True
    assert (vault / "welcome.md").read_bytes() == (
        example_copy / "vault" / "welcome.md").read_bytes()
    # private by default: the state dir and the copy are the owner's alone
    assert state_dir.stat().st_mode & 0o777 == 0o700
    assert vault.stat().st_mode & 0o777 == 0o700
    assert (vault / "welcome.md").stat().st_mode & 0o777 == 0o600
    (vault / "welcome.md").write_text("mine\n")
    again = run("check", "--config", str(example_copy / "capd.toml"))
    assert again.returncode == 0, again.stderr
    assert (vault / "welcome.md").read_text() == "mine\n"


def test_a_seed_whose_source_is_missing_exits_1_naming_both(tmp_path: Path) -> None:
    """A [[seed]] with no source folder is a config error naming the source and the path."""
    config = tmp_path / "capd.toml"
    config.write_text('[[seed]]\npath = "{state_dir}/v"\nsource = "nope"\n')
    done = run("check", "--config", str(config))
    assert done.returncode == 1
    assert done.stderr == (f"capd: {config}: seed 0: {tmp_path / 'nope'} is not a folder "
                           f"(it would be copied to {tmp_path / 'state' / 'v'}, which does "
                           "not exist)\n")


def test_unknown_environment_variables_are_warned_about_with_a_suggestion(
    example_copy: Path, tmp_path: Path
) -> None:
    """A misspelt CAPD_* variable is named on stderr with the closest key; the run goes on."""
    done = run("check", "--config", str(example_copy / "capd.toml"), "--json",
               env={"CAPD_RECHECK_COLDOWN_S": "5", "CAPD_VAR__VAULT": "/srv/notes",
                    "CAPD_ZZZ": "1"})
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)  # stdout stays the report alone
    seeded = tmp_path / "state" / "example-vault"
    assert done.stderr.splitlines()[-1] == (
        f"capd: seeded {seeded} (as the daemon's first start would)")
    assert done.stderr.splitlines()[:-1] == [
        "capd: warning: CAPD_RECHECK_COLDOWN_S is not a capd setting and is ignored "
        "(did you mean CAPD_RECHECK_COOLDOWN_S?)",
        "capd: warning: CAPD_VAR__VAULT is not a capd setting and is ignored "
        "(did you mean CAPD_VARS__VAULT?)",
        "capd: warning: CAPD_ZZZ is not a capd setting and is ignored",
    ]


def test_variables_capd_reads_are_not_warned_about(example_copy: Path, tmp_path: Path) -> None:
    """CAPD_CONFIG, CAPD_SOCKET, CAPD_STATE_DIR and nested keys are known: no warning."""
    done = run("check", "--json", cwd=tmp_path,
               env={"CAPD_CONFIG": str(example_copy / "capd.toml"),
                    "CAPD_SOCKET": str(tmp_path / "s.sock"),
                    "CAPD_STATE_DIR": str(tmp_path / "state"),
                    "CAPD_VARS__VAULT": str(tmp_path / "v"),
                    "capd_recheck_cooldown_s": "5"})
    assert done.returncode == 0, done.stderr
    # no warning: only the seeding, said as the daemon would log it
    assert done.stderr == (f"capd: seeded {tmp_path / 'v'} (as the daemon's first start "
                           "would)\n")


def test_unknown_config_key_exits_1_naming_the_key(tmp_path: Path) -> None:
    """An unknown key in capd.toml is an error on stderr naming it; exit 1."""
    config = tmp_path / "capd.toml"
    config.write_text("plugins = []\nrecheck_coldown_s = 3\n")
    done = run("check", "--config", str(config))
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == (f"capd: {config}: recheck_coldown_s: unknown key "
                           "(did you mean recheck_cooldown_s?)\n")


def test_bad_config_cases_exit_1_with_a_reason(tmp_path: Path) -> None:
    """Missing file, bad TOML, bad tool spec, missing declaration folder, broken plugin."""
    cases = {
        "missing": (None, "not found; pass --config PATH"),
        "toml": ("plugins = [", "not valid TOML"),
        "tool": ("[tools.x]\nkind = 'tcp'\n", "tool 'x': tcp.port: Field required"),
        "decl": ("declarations = ['nope']\n", "declarations: "),
        "plugin": ("plugins = ['capd_missing_plugin']\n",
                   "plugin 'capd_missing_plugin' failed to import: ModuleNotFoundError"),
    }
    for name, (text, expected) in cases.items():
        config = tmp_path / f"{name}.toml"
        if text is not None:
            config.write_text(text)
        done = run("check", "--config", str(config))
        assert done.returncode == 1, name
        assert expected in done.stderr, (name, done.stderr)
        assert "Traceback" not in done.stderr


def test_declaration_errors_are_listed_and_strict_fails(example_copy: Path) -> None:
    """A broken declaration is reported; the rest builds; --strict turns it into exit 1."""
    decl = example_copy / "capabilities" / "broken.toml"
    decl.write_text('[[capability]]\nname = "notes.typo"\nop = "notes.apend"\nsummary = "x"\n')
    done = run("check", "--config", str(example_copy / "capd.toml"))
    assert done.returncode == 0
    assert ("error: capabilities/broken.toml: notes.typo: unknown op 'notes.apend' "
            "(did you mean 'notes.append'?)") in done.stdout
    assert "4 live, 1 disabled, 1 declaration error(s)" in done.stdout
    strict = run("check", "--config", str(example_copy / "capd.toml"), "--strict")
    assert strict.returncode == 1


def test_a_declaration_file_that_does_not_load_fails_check(example_copy: Path) -> None:
    """One stray byte makes a file not valid TOML: check reports it and exits 1 without
    --strict (the build failed for that file); the rest is still listed."""
    decl = example_copy / "capabilities" / "broken.toml"
    decl.write_bytes(b'[[capability]]\nname = "notes.x"\x00\n')
    done = run("check", "--config", str(example_copy / "capd.toml"))
    assert done.returncode == 1
    assert "capabilities/broken.toml: not valid TOML" in done.stdout
    assert "the file did not load" in done.stderr
    assert "notes.append" in done.stdout
    as_json = run("check", "--json", "--config", str(example_copy / "capd.toml"))
    assert as_json.returncode == 1
    [error] = json.loads(as_json.stdout)["errors"]
    assert error["whole_file"] is True


def test_nothing_live_fails_check(tmp_path: Path) -> None:
    """A configuration under which no capability is live exits 1, saying so."""
    (tmp_path / "caps.toml").write_text(
        '[tools.gone]\nkind = "path"\npath = "/nonexistent/capd-test"\n\n'
        '[[capability]]\nname = "t.x"\nop = "capd.echo"\nsummary = "x"\n'
        'requires = ["gone"]\n')
    config = tmp_path / "capd.toml"
    config.write_text('declarations = ["caps.toml"]\nentry_points = false\n'
                      'state_dir = "s"\n')
    done = run("check", "--config", str(config))
    assert done.returncode == 1
    assert "nothing is live" in done.stderr


def test_a_misspelt_tool_or_plugin_gets_a_did_you_mean(tmp_path: Path) -> None:
    """A capability requiring `sync_servr` when `sync_server` is declared, and a plugin
    `my_pak` when `my_pack` is importable, are named with the close name."""
    (tmp_path / "my_pack.py").write_text(
        "from pydantic import BaseModel\nfrom capd.registry import op\n\n\n"
        "class P(BaseModel):\n    x: int = 0\n\n\n@op('my.op')\n"
        "def my_op(params: P) -> int:\n    return params.x\n")
    (tmp_path / "caps.toml").write_text(
        '[tools.sync_server]\nkind = "path"\npath = "/"\n\n'
        '[[capability]]\nname = "my.x"\nop = "my.op"\nsummary = "x"\n'
        'requires = ["sync_servr"]\n\n'
        '[[capability]]\nname = "my.y"\nop = "my.op"\nsummary = "y"\n')
    config = tmp_path / "capd.toml"
    config.write_text('plugins = ["my_pack"]\nplugin_paths = ["."]\n'
                      'declarations = ["caps.toml"]\nentry_points = false\nstate_dir = "s"\n')
    done = run("check", "--config", str(config))
    assert "requires unknown tool 'sync_servr' (did you mean 'sync_server'?)" in done.stdout
    config.write_text(config.read_text().replace('"my_pack"', '"my_pak"'))
    misspelt = run("check", "--config", str(config))
    assert misspelt.returncode == 1
    assert "(did you mean 'my_pack'?)" in misspelt.stderr, misspelt.stderr


def test_usage_error_exits_2() -> None:
    """An unknown subcommand is a usage error: exit 2."""
    done = run("frobnicate")
    assert done.returncode == 2


def test_a_parameter_without_a_description_warns_and_fails_strict(tmp_path: Path) -> None:
    """Every parameter of a tool needs a description: `capd check` warns naming the
    capability and the field (nested ones too); `--strict` exits 1 for it."""
    (tmp_path / "terse_pack.py").write_text('''
from pydantic import BaseModel, Field

from capd.registry import op


class Where(BaseModel):
    city: str


class Params(BaseModel):
    note: str = Field(description="The note to write.")
    count: int = 1
    where: Where = Field(description="Where it is.")


@op("terse.write")
def write(params: Params) -> str:
    return params.note
''')
    (tmp_path / "caps.toml").write_text('''
[[capability]]
name = "terse.write"
op = "terse.write"
summary = "Write a note."
''')
    (tmp_path / "capd.toml").write_text('plugins = ["terse_pack"]\nplugin_paths = ["."]\n'
                                        'declarations = ["caps.toml"]\nentry_points = false\n'
                                        f'state_dir = "{tmp_path / "state"}"\n')
    told = run("check", "--config", str(tmp_path / "capd.toml"))
    assert told.returncode == 0, told.stderr
    assert "warning: terse.write: parameter 'count' has no description" in told.stdout
    assert "parameter 'where.city' has no description" in told.stdout
    assert "'note'" not in told.stdout
    strict = run("check", "--strict", "--json", "--config", str(tmp_path / "capd.toml"))
    assert strict.returncode == 1
    fields = {(w["capability"], w["field"]) for w in json.loads(strict.stdout)["warnings"]}
    assert fields == {("terse.write", "count"), ("terse.write", "where.city")}
