"""Per-call options, install hints and manifest fields through the real daemon: a shorter
timeout (Capd-Timeout, --timeout, MCP timeout_s), running a disabled capability anyway
(Capd-Run-Disabled, --run-disabled, MCP run_disabled), a missing tool's install_hint
wherever a disabled capability is shown, and owner/version/permissions/safety/context budget
in manifests and as a search filter, over the real socket, the CLI and the MCP bridge."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capd.sidecar.client._client import Response, request
from tests.helpers.bridge import bridge, data
from tests.helpers.daemon import DaemonProcess

pytestmark = pytest.mark.slow  # starts the real daemon, the CLI and the bridge as processes

PACK = '''
import asyncio

from pydantic import BaseModel
from capd.registry import op


class Nap(BaseModel):
    seconds: float = 0.0


class Line(BaseModel):
    line: str


@op("opt.nap")
async def nap(params: Nap) -> str:
    await asyncio.sleep(params.seconds)
    return "rested"


@op("opt.write")
def write(params: Line, *, target: str) -> str:
    with open(target, "a", encoding="utf-8") as handle:
        handle.write(params.line + "\\n")
    return "written"
'''

CAPS = '''
[[capability]]
name = "opt.nap"
op = "opt.nap"
summary = "Rest for a while, then answer."
timeout_s = 5
owner = "platform-team"
version = "1.2.0"
permissions = ["clock:sleep", "net:none"]
safety = "external_side_effects"
context_budget_tokens = 40

[[capability]]
name = "opt.offline_read"
op = "opt.nap"
summary = "A read whose tool is gone."
requires = ["gone"]

[[capability]]
name = "opt.offline_write"
op = "opt.write"
summary = "A write whose tool is gone."
requires = ["gone"]
mutates_state = true
options = { target = "{out}" }
'''


def write_config(folder: Path) -> Path:
    (folder / "opt_pack.py").write_text(PACK)
    (folder / "caps.toml").write_text(CAPS)
    config = folder / "capd.toml"
    config.write_text(textwrap.dedent(f"""
        plugins = ["opt_pack"]
        plugin_paths = ["."]
        declarations = ["caps.toml"]
        entry_points = false
        state_dir = "state"
        recheck_cooldown_s = 0
        recheck_interval_s = 3600
        probe_live_interval_s = 3600

        [vars]
        out = "{folder}/out.txt"

        [tools.gone]
        kind = "path"
        path = "{folder}/gone"
        timeout_s = 1
        install_hint = "apt install gone-tool"
    """))
    return config


@pytest.fixture
def opt(short_tmp: Path) -> Iterator[DaemonProcess]:
    daemon = DaemonProcess(write_config(short_tmp), short_tmp / "capd.sock").start()
    try:
        yield daemon.wait_ready()
    finally:
        daemon.kill()


def call(daemon: DaemonProcess, name: str, params: dict[str, Any], **headers: str) -> Response:
    sent = {key.replace("_", "-"): value for key, value in headers.items()}
    return request(daemon.socket, "POST", f"/call/{name}", body=params, headers=sent or None)


def cli(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "capd", *args, "--socket", str(daemon.socket)],
                          capture_output=True, text=True, timeout=60, check=False)


# ------------------------------------------------------------------------ timeouts


def test_a_call_timeout_header_shortens_the_capabilitys_own(opt: DaemonProcess) -> None:
    """Capd-Timeout under the declared timeout_s cuts the call off at the shorter limit."""
    cut = call(opt, "opt.nap", {"seconds": 3}, Capd_Timeout="0.3")
    assert (cut.status, cut.body["status"], cut.body["error_type"]) == (
        503, "error_transient", "timeout")
    assert "within 0.3s" in cut.body["message"]
    assert cut.body["duration_s"] < 3
    ok = call(opt, "opt.nap", {"seconds": 0.05}, Capd_Timeout="2.5")
    assert (ok.status, ok.body["result"]) == (200, "rested")


@pytest.mark.parametrize("value", ["9", "5.01"])
def test_a_call_timeout_above_the_limit_is_422_naming_it(
        opt: DaemonProcess, value: str) -> None:
    """A Capd-Timeout over the capability's timeout_s: 422 naming the limit."""
    refused = call(opt, "opt.nap", {}, Capd_Timeout=value)
    assert refused.status == 422
    assert refused.content_type.startswith("application/problem+json")
    assert (refused.body["title"], refused.body["limit_s"], refused.body["capability"]) == (
        "Invalid Timeout", 5, "opt.nap")
    assert "at most 5" in refused.body["detail"]


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan", "inf"])
def test_a_malformed_call_timeout_is_422_naming_the_header(
        opt: DaemonProcess, value: str) -> None:
    """A Capd-Timeout that is no number or not above 0 is refused naming the header,
    whatever the capability (one by that name or none)."""
    for name in ("opt.nap", "opt.napp"):
        refused = call(opt, name, {}, Capd_Timeout=value)
        assert (refused.status, refused.body["title"]) == (422, "Invalid Arguments")
        assert refused.body["errors"][0]["loc"] == ["Capd-Timeout"]
        assert refused.body["detail"].startswith("Capd-Timeout: ")


def test_the_cli_timeout_option_sends_the_header(opt: DaemonProcess) -> None:
    """capd call --timeout cuts the call off; over the limit it prints the 422's reason."""
    cut = cli(opt, "call", "opt.nap", "-p", "seconds:=3", "--timeout", "0.3", "--json")
    assert json.loads(cut.stdout)["error_type"] == "timeout"
    over = cli(opt, "call", "opt.nap", "--timeout", "60")
    assert over.returncode != 0
    assert "at most 5" in over.stderr
    assert "send a shorter --timeout" in over.stderr  # the CLI's words, not the header's
    assert "Capd-Timeout" not in over.stderr


async def test_the_mcp_timeout_argument_sends_the_header(opt: DaemonProcess) -> None:
    """invoke_capability's timeout_s cuts the call off through the bridge."""
    async with bridge(opt.socket) as session:
        answer = await session.call_tool("invoke_capability", {
            "id": "opt.nap", "arguments": {"seconds": 3}, "timeout_s": 0.3})
    assert answer.is_error
    assert data(answer)["error_type"] == "timeout"


# --------------------------------------------------------------------- run disabled


def test_a_disabled_read_runs_anyway_when_asked_with_a_warning(opt: DaemonProcess) -> None:
    """Capd-Run-Disabled runs a disabled read and says so; without it the call is refused."""
    plain = call(opt, "opt.offline_read", {})
    assert plain.body["error_type"] == "capability_disabled"
    anyway = call(opt, "opt.offline_read", {}, Capd_Run_Disabled="true")
    assert (anyway.status, anyway.body["result"]) == (200, "rested")
    assert any("ran while disabled" in w for w in anyway.body["warnings"])


def test_run_disabled_rechecks_first(opt: DaemonProcess, short_tmp: Path) -> None:
    """When the recheck finds the tool back, the call is an ordinary one (no warning)."""
    (short_tmp / "gone").mkdir()
    back = call(opt, "opt.offline_read", {}, Capd_Run_Disabled="true")
    assert (back.status, back.body["warnings"]) == (200, [])
    assert opt.call("GET", "/capabilities/opt.offline_read").body["state"] == "live"


def test_a_malformed_run_disabled_header_is_422_naming_it(opt: DaemonProcess) -> None:
    """Capd-Run-Disabled is true or false; anything else is refused naming the header."""
    bad = call(opt, "opt.offline_read", {}, Capd_Run_Disabled="maybe")
    assert (bad.status, bad.body["errors"][0]["loc"]) == (422, ["Capd-Run-Disabled"])


def test_a_disabled_write_needs_consent_to_run_anyway(opt: DaemonProcess,
                                                       short_tmp: Path) -> None:
    """A mutating capability runs disabled only under a grant of capd.run_disabled."""
    refused = call(opt, "opt.offline_write", {"line": "one"}, Capd_Run_Disabled="true")
    assert (refused.status, refused.body["status"], refused.body["error_type"]) == (
        403, "error_blocked", "consent_required")
    assert refused.body["missing_consent"] == ["capd.run_disabled"]
    assert "capd consent grant capd.run_disabled" in refused.body["message"]
    assert not (short_tmp / "out.txt").exists()
    granted = cli(opt, "consent", "grant", "capd.run_disabled", "--ttl", "1h")
    assert granted.returncode == 0, granted.stderr
    ran = cli(opt, "call", "opt.offline_write", "-p", "line=two", "--run-disabled", "--json")
    assert json.loads(ran.stdout)["result"] == "written"
    assert (short_tmp / "out.txt").read_text() == "two\n"
    plain = call(opt, "opt.offline_write", {"line": "three"})  # the grant alone runs nothing
    assert plain.body["error_type"] == "capability_disabled"
    assert (short_tmp / "out.txt").read_text() == "two\n"


async def test_the_mcp_run_disabled_argument_sends_the_header(opt: DaemonProcess) -> None:
    """invoke_capability's run_disabled runs a disabled read through the bridge."""
    async with bridge(opt.socket) as session:
        answer = await session.call_tool("invoke_capability", {
            "id": "opt.offline_read", "run_disabled": True})
    assert not answer.is_error
    assert data(answer)["result"] == "rested"




# -------------------------------------------------------------------- install hints

HINT = "apt install gone-tool"


def test_health_names_the_install_hint_of_a_missing_tool(opt: DaemonProcess) -> None:
    """/health's check of a disabled capability says how to install what it misses."""
    health = opt.call("GET", "/health").body
    check = health["checks"]["capability:opt.offline_read"][0]
    assert check["status"] == "warn"
    assert f"(install: {HINT})" in check["output"]


def test_manifest_and_search_carry_the_install_hint(opt: DaemonProcess) -> None:
    """The manifest and a search with include_disabled give each missing tool's hint."""
    shown = opt.call("GET", "/capabilities/opt.offline_write").body
    assert shown["disabled"]["install_hints"] == {"gone": HINT}
    found = opt.call("GET", "/search?q=tool+is+gone&include_disabled=true&k=10").body
    hits = {h["name"]: h for h in found["results"]}
    assert hits["opt.offline_read"]["disabled"]["install_hints"] == {"gone": HINT}
    text = cli(opt, "search", "--include-disabled", "a", "read", "whose", "tool", "is", "gone")
    assert f"(install gone: {HINT})" in text.stdout


def test_a_live_capability_has_no_install_hints(opt: DaemonProcess) -> None:
    """Only a disabled capability says what to install: a live one has no disabled view."""
    assert "disabled" not in opt.call("GET", "/capabilities/opt.nap").body


def test_capd_check_prints_the_install_hint(opt: DaemonProcess) -> None:
    """capd check (text and --json) names the hint beside the missing tool."""
    done = subprocess.run([sys.executable, "-m", "capd", "check", "--config", str(opt.config)],
                          capture_output=True, text=True, timeout=60, check=False,
                          cwd=opt.config.parent)
    line = next(x for x in done.stdout.splitlines() if "opt.offline_read" in x)
    assert "missing gone: " in line
    assert f"(install: {HINT})" in line
    report = subprocess.run([sys.executable, "-m", "capd", "check", "--config",
                             str(opt.config), "--json"], capture_output=True, text=True,
                            timeout=60, check=False, cwd=opt.config.parent)
    disabled = {d["name"]: d for d in json.loads(report.stdout)["disabled"]}
    assert disabled["opt.offline_write"]["install_hints"] == {"gone": HINT}


# ------------------------------------------------------------------ manifest fields


def test_the_manifest_carries_owner_version_permissions_safety_budget(
        opt: DaemonProcess) -> None:
    """Declared fields appear in the manifest; safety defaults from mutates_state."""
    nap = opt.call("GET", "/capabilities/opt.nap").body
    assert {k: nap[k] for k in ("owner", "version", "permissions", "safety",
                                "context_budget_tokens")} == {
        "owner": "platform-team", "version": "1.2.0", "permissions": ["clock:sleep", "net:none"],
        "safety": "external_side_effects", "context_budget_tokens": 40}
    read = opt.call("GET", "/capabilities/opt.offline_read").body
    write = opt.call("GET", "/capabilities/opt.offline_write").body
    assert (read["safety"], write["safety"]) == ("read_only", "writes")
    assert (read["owner"], read["permissions"], read["context_budget_tokens"]) == (None, [], None)


def test_search_filters_by_safety(opt: DaemonProcess) -> None:
    """GET /search?safety= and capd search --safety keep only that class."""
    def names(safety: str) -> set[str]:
        found = opt.call("GET", "/search?q=tool+gone+rest+answer&k=20"
                         f"&include_disabled=true&safety={safety}").body
        return {h["name"] for h in found["results"]}

    assert names("read_only") == {"opt.offline_read"}
    assert names("writes") == {"opt.offline_write"}
    assert names("destructive") == set()
    text = cli(opt, "search", "--safety", "external_side_effects", "rest", "then", "answer")
    assert "opt.nap" in text.stdout
    assert "opt.offline" not in text.stdout


def test_an_unknown_safety_filter_is_422_naming_the_classes(opt: DaemonProcess) -> None:
    """A safety filter outside the four classes is refused naming them."""
    bad = opt.call("GET", "/search?q=rest&safety=harmless")
    assert bad.status == 422
    assert "'read_only', 'writes', 'destructive' or 'external_side_effects'" in \
        bad.body["detail"]


def test_a_description_over_800_tokens_is_a_load_error_naming_it(short_tmp: Path) -> None:
    """capd check reports the over-long description against its capability; others load."""
    config = write_config(short_tmp)
    with (short_tmp / "caps.toml").open("a", encoding="utf-8") as handle:
        handle.write(f"""
[[capability]]
name = "opt.wordy"
op = "opt.nap"
summary = "Says too much."
description = "{'x' * 3201}"
""")
    done = subprocess.run([sys.executable, "-m", "capd", "check", "--config", str(config),
                           "--json"], capture_output=True, text=True, timeout=60, check=False,
                          cwd=short_tmp)
    report = json.loads(done.stdout)
    errors = [e for e in report["errors"] if e["capability"] == "opt.wordy"]
    assert len(errors) == 1
    assert "description is about 801 tokens" in errors[0]["message"]
    assert "opt.nap" in [c["name"] for c in report["live"]]
