"""User code that raises SystemExit or KeyboardInterrupt fails its call or reload, never
the daemon: ops (async and plain, an argparse CLI given a bad argument), before- and
after-hooks, probes, verify ops and a plugin imported at reload, through the real daemon."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.daemon import DaemonProcess

pytestmark = pytest.mark.slow  # starts the real daemon as a process

PACK = '''
import argparse
from pathlib import Path

from pydantic import BaseModel, field_validator
from capd.registry import TransientToolError, after_call, before_call, op

HERE = Path(__file__).parent


class Args(BaseModel):
    argv: list[str] = []


class Parsed(BaseModel):
    argv: str

    @field_validator("argv")
    @classmethod
    def parse(cls, value: str) -> str:
        parser = argparse.ArgumentParser(prog="validator")
        parser.add_argument("--name", required=True)
        return parser.parse_args(value.split()).name


@op("ex.validated")
async def validated(params: Parsed) -> str:
    return params.argv


@op("ex.async_exit")
async def async_exit(params: Args) -> str:
    raise SystemExit(3)


@op("ex.cli")
def cli(params: Args) -> str:
    parser = argparse.ArgumentParser(prog="tool")
    parser.add_argument("--name", required=True)
    return parser.parse_args(params.argv).name


@op("ex.interrupt")
async def interrupt(params: Args) -> str:
    raise KeyboardInterrupt


@op("ex.echo")
async def echo(params: Args) -> str:
    return "still here"


@op("ex.write")
async def write(params: Args) -> str:
    raise TransientToolError("the server is busy")


@op("ex.verify")
def verify(params: Args) -> bool:
    (HERE / "verified").touch()
    raise SystemExit(1)


@before_call("ex.hooked")
def exiting_hook(capability, params, caller):
    raise SystemExit(0)


@after_call("ex.observed")
async def interrupting_hook(capability, params, caller, result):
    raise KeyboardInterrupt


def exiting_probe() -> bool:
    raise SystemExit(4)
'''

CAPS = '''
[[capability]]
name = "ex.echo"
op = "ex.echo"
summary = "Answers while the daemon lives."

[[capability]]
name = "ex.async_exit"
op = "ex.async_exit"
summary = "An async op raising SystemExit."

[[capability]]
name = "ex.cli"
op = "ex.cli"
summary = "An argparse CLI run in process."

[[capability]]
name = "ex.validated"
op = "ex.validated"
summary = "An op whose parameter validator runs argparse."

[[capability]]
name = "ex.interrupt"
op = "ex.interrupt"
summary = "An op raising KeyboardInterrupt."
[[capability]]
name = "ex.hooked"
op = "ex.echo"
summary = "Runs behind a before-hook that exits."

[[capability]]
name = "ex.observed"
op = "ex.echo"
summary = "Runs before an after-hook that interrupts."

[[capability]]
name = "ex.probed"
op = "ex.echo"
summary = "Needs a tool whose probe exits."
requires = ["exiting"]

[[capability]]
name = "ex.verified"
op = "ex.write"
summary = "A write whose verify op exits."
mutates_state = true
retry_policy = "verify_first"
timeout_s = 1
[[capability.effects]]
kind = "op"
op = "ex.verify"
'''


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[DaemonProcess]:
    (short_tmp / "ex_pack.py").write_text(PACK)
    (short_tmp / "caps.toml").write_text(CAPS)
    config = short_tmp / "capd.toml"
    config.write_text(textwrap.dedent("""
        plugins = ["ex_pack"]
        plugin_paths = ["."]
        declarations = ["caps.toml"]
        entry_points = false
        state_dir = "state"
        retry_base_s = 0.2
        retry_cap_s = 0.5

        [policy]
        before = ["ex_pack:exiting_hook"]
        after = ["ex_pack:interrupting_hook"]

        [tools.exiting]
        kind = "python"
        target = "ex_pack:exiting_probe"
        timeout_s = 5
    """))
    started = DaemonProcess(config, short_tmp / "capd.sock").start().wait_ready()
    yield started
    started.kill()


def _alive(daemon: DaemonProcess) -> None:
    assert daemon.proc is not None
    assert daemon.proc.poll() is None, daemon.stderr
    answer = daemon.call("POST", "/call/ex.echo", {})
    assert (answer.status, answer.body["result"]) == (200, "still here")


@pytest.mark.parametrize(("name", "argv", "error_type"), [
    ("ex.async_exit", [], "SystemExit"),
    ("ex.cli", ["--bogus"], "SystemExit"),
    ("ex.interrupt", [], "KeyboardInterrupt"),
])
def test_an_op_that_exits_fails_its_call_only(daemon: DaemonProcess, name: str,
                                              argv: list[str], error_type: str) -> None:
    """An op raising SystemExit (an argparse CLI given a bad argument too) or
    KeyboardInterrupt answers error_permanent naming it; the daemon keeps serving."""
    answer = daemon.call("POST", f"/call/{name}", {"argv": argv})
    assert answer.body["status"] == "error_permanent", answer.body
    assert answer.body["error_type"] == error_type
    _alive(daemon)


def test_hooks_that_exit_refuse_or_are_logged(daemon: DaemonProcess) -> None:
    """A before-hook raising SystemExit refuses its call (hooks fail closed); an
    after-hook raising KeyboardInterrupt is logged and the answer stands."""
    hooked = daemon.call("POST", "/call/ex.hooked", {})
    assert hooked.body["status"] == "error_blocked"
    assert "SystemExit" in hooked.body["message"]
    observed = daemon.call("POST", "/call/ex.observed", {})
    assert (observed.status, observed.body["result"]) == (200, "still here")
    daemon.wait_event("after_hook_failed", where=lambda e: "KeyboardInterrupt" in e["error"])
    _alive(daemon)


def test_a_probe_that_exits_disables_its_capability(daemon: DaemonProcess) -> None:
    """A Python probe raising SystemExit is a failed probe: its capability is disabled
    with that reason, and a recheck probes it again without harm."""
    listed = daemon.call("GET", "/capabilities?state=disabled").body
    names = {c["name"] for c in listed["capabilities"]}
    assert "ex.probed" in names
    recheck = daemon.call("POST", "/recheck/ex.probed?force=true")
    assert recheck.status in (200, 503), recheck.body
    _alive(daemon)


def test_a_verify_op_that_exits_cannot_decide(daemon: DaemonProcess,
                                              short_tmp: Path) -> None:
    """A queued verify_first write whose verify op raises SystemExit is verified as
    'unknown' by the sweep and backs off; the daemon keeps serving."""
    queued = daemon.call("POST", "/call/ex.verified", {})
    assert queued.status == 202, queued.body
    job = queued.body["queued"]
    daemon.wait_until(lambda: (short_tmp / "verified").exists(), timeout=20)

    def verified() -> list[dict[str, object]]:
        trail = daemon.call("GET", f"/queue/{job}").body["trail"]
        return [a for a in trail if a["kind"] == "verify"]

    daemon.wait_until(lambda: bool(verified()), timeout=20)
    assert verified()[0]["outcome"] == "unknown"
    assert "SystemExit" in json.dumps(verified()[0]["detail"])
    _alive(daemon)
    shown = daemon.call("GET", f"/queue/{job}").body
    assert shown["state"] in ("pending", "leased"), shown


def test_a_plugin_that_exits_at_import_fails_the_reload(daemon: DaemonProcess,
                                                        short_tmp: Path) -> None:
    """A plugin raising SystemExit when imported at reload fails that reload (the old
    registry keeps serving, the reason reported); the daemon keeps serving."""
    (short_tmp / "ex_pack.py").write_text("raise SystemExit('bad plugin')\n" + PACK)
    done = subprocess.run([sys.executable, "-m", "capd", "reload", "--socket",
                           str(daemon.socket)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode != 0
    assert "SystemExit" in done.stdout + done.stderr
    _alive(daemon)
    health = daemon.call("GET", "/health").body
    assert "SystemExit" in json.dumps(health)


def test_a_parameter_validator_that_exits_is_invalid_parameters(
        daemon: DaemonProcess) -> None:
    """A plugin's pydantic validator running argparse on a bad value raises SystemExit: the
    call (alone, in a batch, in a pre-flight) answers invalid parameters; the daemon lives."""
    single = daemon.call("POST", "/call/ex.validated", {"argv": "--bogus"})
    assert single.status == 422, single.body
    assert "validator raised SystemExit" in json.dumps(single.body)
    batch = daemon.call("POST", "/calls", {"calls": [
        {"capability": "ex.validated", "params": {"argv": "--bogus"}},
        {"capability": "ex.validated", "params": {"argv": "--name ok"}}]})
    assert batch.status == 200, batch.body
    plan = daemon.call("POST", "/preflight", {"calls": [
        {"capability": "ex.validated", "params": {"argv": "--bogus"}}]})
    assert plan.body["refused"][0]["reason"] == "invalid_params", plan.body
    fine = daemon.call("POST", "/call/ex.validated", {"argv": "--name ok"})
    assert fine.body["result"] == "ok"
    _alive(daemon)
