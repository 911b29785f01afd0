"""`capd export`: every capability's tool definition in one provider's format, through the
real daemon serving a private copy of the bundled example."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capd.sidecar._table import PROVIDER_FORMATS
from tests.helpers.daemon import DaemonProcess
from tests.helpers.servers import TESTS

GOLDEN = TESTS / "fixtures" / "provider_formats"

pytestmark = pytest.mark.slow

PROFILE = """
[profiles.readers]
capabilities = ["notes.search"]
"""

CLASH = """
[[capability]]
name = "notes.find__text"
op = "notes.search"
summary = "Find notes holding a text (one spelling)."
requires = ["vault"]
options = { vault = "{vault}" }

[[capability]]
name = "notes__find.text"
op = "notes.search"
summary = "Find notes holding a text (another spelling)."
requires = ["vault"]
options = { vault = "{vault}" }
"""


def _serve(example: Path, short_tmp: Path) -> DaemonProcess:
    return DaemonProcess(example / "capd.toml", short_tmp / "capd.sock",
                         env={"CAPD_STATE_DIR": str(short_tmp / "state")}).start().wait_ready()


@pytest.fixture
def daemon(example_copy: Path, short_tmp: Path) -> Iterator[DaemonProcess]:
    with (example_copy / "capd.toml").open("a") as config:
        config.write(PROFILE)
    served = _serve(example_copy, short_tmp)
    try:
        yield served
    finally:
        served.kill()


def export(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "capd", "export", *args,
                           "--socket", str(daemon.socket)],
                          capture_output=True, text=True, timeout=60, check=False)


def _name(form: str, tool: dict[str, Any]) -> str:
    return str(tool["function"]["name"] if form == "openai" else tool["name"])


def test_each_format_exports_the_golden_set(daemon: DaemonProcess) -> None:
    """With disabled ones, the export is every golden tool, in name order; without, the
    disabled notes.publish is left out."""
    for form in PROVIDER_FORMATS:
        golden = json.loads((GOLDEN / f"{form}.json").read_text())
        everything = export(daemon, "--format", form, "--include-disabled")
        assert everything.returncode == 0, everything.stderr
        assert json.loads(everything.stdout) == golden
        live = export(daemon, "--format", form)
        assert live.returncode == 0, live.stderr
        assert json.loads(live.stdout) == [
            t for t in golden if _name(form, t) not in ("notes.publish", "notes__publish")]


def test_a_profile_exports_only_what_it_takes_in(daemon: DaemonProcess) -> None:
    done = export(daemon, "--format", "anthropic", "--profile", "readers", "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert (body["format"], body["profile"], body["count"]) == ("anthropic", "readers", 1)
    assert [t["name"] for t in body["tools"]] == ["notes__search"]
    assert body["skipped"] == []


def test_bad_requests_say_what_to_do(daemon: DaemonProcess) -> None:
    typo = export(daemon, "--format", "openai", "--profile", "reader")
    assert typo.returncode != 0
    assert "unknown profile 'reader' (did you mean 'readers'?)" in typo.stderr
    assert typo.stdout == ""
    missing = export(daemon)  # a usage error: the CLI says so itself
    assert missing.returncode == 2
    assert "the following arguments are required: --format" in missing.stderr
    bare = daemon.call("GET", "/export")  # the API says what to send
    assert (bare.status, bare.body["errors"][0]["loc"]) == (422, ["format"])
    assert "format: Field required" in bare.body["detail"]
    answer = daemon.call("GET", "/export?format=gemini")
    assert answer.status == 422
    assert "format: Input should be 'openai', 'anthropic' or 'mcp'" in answer.body["detail"]
    unknown = daemon.call("GET", "/export?format=mcp&profile=nobody")
    assert (unknown.status, unknown.body["suggestions"]) == (404, [])


def test_names_that_map_to_one_tool_name_refuse_the_export(example_copy: Path,
                                                            short_tmp: Path) -> None:
    """notes.find__text and notes__find.text both become notes__find__text for OpenAI
    and Anthropic: the export is refused naming both; MCP keeps dots and exports."""
    (example_copy / "capabilities" / "clash.toml").write_text(CLASH)
    daemon = _serve(example_copy, short_tmp)
    try:
        refused = daemon.call("GET", "/export?format=openai")
        assert refused.status == 409, refused.body
        assert refused.body["clashes"] == {
            "notes__find__text": ["notes.find__text", "notes__find.text"]}
        cli = export(daemon, "--format", "anthropic")
        assert cli.returncode != 0
        assert "would share a tool name" in cli.stderr
        mcp = export(daemon, "--format", "mcp")
        assert mcp.returncode == 0, mcp.stderr
        names = [t["name"] for t in json.loads(mcp.stdout)]
        assert {"notes.find__text", "notes__find.text"} <= set(names)
    finally:
        daemon.kill()
