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
    assert "missing sync_server: cannot connect to 127.0.0.1:9" in disabled[0]
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
    """CAPD_VARS__VAULT moves the vault: a missing one disables every notes capability."""
    done = run("check", "--config", str(example_copy / "capd.toml"), "--json",
               env={"CAPD_VARS__VAULT": str(tmp_path / "nowhere")})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["live"] == []
    assert report["tools"]["vault"]["error"] == f"{tmp_path / 'nowhere'} does not exist"


def test_unknown_config_key_exits_1_naming_the_key(tmp_path: Path) -> None:
    """An unknown key in capd.toml is an error on stderr naming it; exit 1."""
    config = tmp_path / "capd.toml"
    config.write_text("plugins = []\nrecheck_coldown_s = 3\n")
    done = run("check", "--config", str(config))
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == f"capd: {config}: recheck_coldown_s: unknown key\n"


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


def test_usage_error_exits_2() -> None:
    """An unknown subcommand is a usage error: exit 2."""
    done = run("frobnicate")
    assert done.returncode == 2
