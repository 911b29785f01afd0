"""Host-aware search through the real daemon: a capability's host_caps leave it out of
the search and list of a caller whose host falls short (counted apart), and what a
capability provides is matched by search."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.daemon import DaemonProcess, daemons_on, write_e2e_config

pytestmark = pytest.mark.slow  # the real daemon as a process

PY = sys.executable

CAPS = """
[[capability]]
name = "e2e.screenshot"
op = "e2e.echo"
summary = "Take a picture of the screen."
host_caps = { os = ["darwin", "linux"], gui = true }

[[capability]]
name = "e2e.pr"
op = "e2e.echo"
summary = "Open a pull request for the current branch."
host_caps = { tokens = ["GITHUB_TOKEN"], scm = ["git"] }
provides = ["code review", "merge"]
"""


@pytest.fixture
def up(short_tmp: Path) -> Iterator[Callable[..., DaemonProcess]]:
    def write(folder: Path, extra: str) -> Path:
        config = write_e2e_config(folder, 9)
        (folder / "caps.toml").write_text((folder / "caps.toml").read_text() + CAPS)
        return config

    with daemons_on(short_tmp, write) as start:
        yield start


def names(body: dict[str, object], key: str = "results") -> list[str]:
    return [r["name"] for r in body[key]]  # type: ignore[attr-defined,index]


def test_host_caps_filter_search_and_list_and_provides_is_matched(
        up: Callable[..., DaemonProcess]) -> None:
    daemon = up()
    # no host said: nothing is judged
    assert "e2e.screenshot" in names(daemon.call("GET", "/search?q=screen+picture").body)
    headless = daemon.call("GET", "/search?q=screen+picture&host_os=linux&host_gui=false").body
    assert "e2e.screenshot" not in names(headless)
    assert headless["not_for_host"] >= 1
    on_mac = daemon.call("GET", "/search?q=screen+picture&host_os=darwin&host_gui=true").body
    assert "e2e.screenshot" in names(on_mac)
    windows = daemon.call("GET", "/search?q=screen+picture&host_os=win32").body
    assert "e2e.screenshot" not in names(windows)
    # tokens and scm
    no_token = daemon.call("GET", "/search?q=pull+request&host_tokens=&host_scm=git").body
    assert "e2e.pr" not in names(no_token)
    with_token = daemon.call(
        "GET", "/search?q=pull+request&host_tokens=GITHUB_TOKEN&host_scm=git").body
    assert "e2e.pr" in names(with_token)
    listed = daemon.call("GET", "/capabilities?host_gui=false&host_tokens=").body
    assert "e2e.screenshot" not in names(listed, "capabilities")
    assert set(listed["not_for_host"]) == {"e2e.screenshot", "e2e.pr"}
    assert "graphical session" in listed["not_for_host"]["e2e.screenshot"]
    # provides: words found nowhere else in the capsule
    merged = daemon.call("GET", "/search?q=code+review&k=3").body
    assert names(merged)[0] == "e2e.pr"
    shown = daemon.call("GET", "/capabilities/e2e.pr").body
    assert shown["provides"] == ["code review", "merge"]
    cli = subprocess.run([PY, "-m", "capd", "search", "screen", "picture", "--host-gui",
                          "false", "--json", "--socket", str(daemon.socket)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert cli.returncode == 0, cli.stderr
    assert "e2e.screenshot" not in names(json.loads(cli.stdout))
