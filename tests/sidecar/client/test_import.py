"""`capd import` takes the MCP servers a client's config file holds into capd.toml: a diff
first, nothing written without --yes (or a yes on a terminal), what cannot be taken named
with why; what it writes loads, and a real server imported is live at the next build."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the CLI as a process, a real MCP server probed by check

CAPD = str(Path(sys.executable).parent / "capd")
TIME_SERVER = str(Path(sys.executable).parent / "mcp-server-time")


def capd(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CAPD, *args], capture_output=True, text=True, timeout=120,
                          check=False, cwd=cwd, stdin=subprocess.DEVNULL)


def test_import_shows_the_diff_writes_on_yes_and_the_servers_serve(tmp_path: Path) -> None:
    (tmp_path / "claude_desktop_config.json").write_text(json.dumps({"mcpServers": {
        "time-server": {"command": TIME_SERVER, "args": ["--local-timezone", "UTC"]},
        "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer x"}},
        "capd": {"command": "/usr/local/bin/capd", "args": ["mcp"]},
        "old": {"type": "sse", "url": "http://127.0.0.1:1/sse"}}}))
    config = tmp_path / "capd.toml"
    config.write_text("plugins = []  # kept as it is\n")
    shown = capd("import", "claude_desktop_config.json", "--config", "capd.toml", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "+[tools.time_server]" in shown.stdout
    assert '+command = ["' + TIME_SERVER + '", "--local-timezone", "UTC"]' in shown.stdout
    assert "nothing written" in shown.stderr
    assert config.read_text() == "plugins = []  # kept as it is\n"
    for said in ("left out 'remote': sends headers", "left out 'capd': capd's own bridge",
                 "left out 'old': transport 'sse'"):
        assert said in shown.stderr
    written = capd("import", "claude_desktop_config.json", "--config", "capd.toml", "--yes",
                   cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert config.read_text().startswith("plugins = []  # kept as it is\n")
    checked = capd("check", "--config", "capd.toml", "-o", "json", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    live = {c["name"] for c in json.loads(checked.stdout)["live"]}
    assert {"time_server.get_current_time", "time_server.convert_time"} <= live
    again = capd("import", "claude_desktop_config.json", "--config", "capd.toml", "--yes",
                 cwd=tmp_path)
    assert again.returncode == 1
    assert "[tools.time_server] is in capd.toml already" in again.stderr
    assert "nothing to import" in again.stderr


def test_vscode_servers_import_and_a_file_without_servers_is_refused(tmp_path: Path) -> None:
    (tmp_path / "mcp.json").write_text(json.dumps({"servers": {
        "Git Tools": {"type": "stdio", "command": "uvx", "args": ["mcp-server-git"],
                      "env": {"GIT_DIR": "/srv/repo"}}}}))
    made = capd("import", "mcp.json", "--config", "capd.toml", "--yes", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    text = (tmp_path / "capd.toml").read_text()
    assert '[tools.git_tools]\nkind = "mcp"\ncommand = ["uvx", "mcp-server-git"]\n' \
           'env = { "GIT_DIR" = "/srv/repo" }' in text
    (tmp_path / "empty.json").write_text('{"theme": "dark"}')
    refused = capd("import", "empty.json", "--config", "capd.toml", cwd=tmp_path)
    assert refused.returncode == 1
    assert "no mcpServers (or servers) object" in refused.stderr
    broken = capd("import", "nope.json", "--config", "capd.toml", cwd=tmp_path)
    assert broken.returncode == 1
    assert "nope.json" in broken.stderr


def test_what_a_file_says_cannot_write_tables_and_the_file_keeps_its_mode(
        tmp_path: Path) -> None:
    """A name or value holding newlines, quotes or escapes stays inside its string; two
    names with one id keep the first; the file written keeps its mode, behind a link too."""
    (tmp_path / "evil.json").write_text(json.dumps({"mcpServers": {
        'x\n[profiles.pwn]\ncapabilities = ["*"]\n#': {"command": "a\"]\n[peers]", "args": []},
        "a-b": {"command": "one"}, "a_b": {"command": "two"},
        "keys": {"command": "srv", "env": {"API_KEY": "s3cr\u00e9t\u001b[2J"}}}}))
    real = tmp_path / "real.toml"
    real.write_text("plugins = []\n")
    real.chmod(0o600)
    (tmp_path / "capd.toml").symlink_to(real)
    done = capd("import", "evil.json", "--config", "capd.toml", "--yes", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "capd.toml").is_symlink()
    assert real.stat().st_mode & 0o777 == 0o600
    import tomllib

    loaded = tomllib.loads(real.read_text())
    assert set(loaded) == {"plugins", "tools"}  # no [profiles] or [peers] table came in
    assert loaded["tools"]["x_profiles_pwn_capabilities"]["command"] == ['a"]\n[peers]']
    assert loaded["tools"]["a_b"]["command"] == ["one"]
    assert "its id a_b is 'a-b''s too" in done.stderr
    assert loaded["tools"]["keys"]["env"] == {"API_KEY": "s3cr\u00e9t\u001b[2J"}
    assert "\x1b" not in done.stdout  # the diff shows an escape, never sends one
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".real.toml.")]
