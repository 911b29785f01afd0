"""Latency tiers that route, through the real daemon: an inner capability's budget is a
load-time rule, search's K follows the tier, and POST /calls runs calls at once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.daemon import DaemonProcess, daemons_on, write_e2e_config

pytestmark = pytest.mark.slow  # the real daemon as a process

PY = sys.executable


@pytest.fixture
def up(short_tmp: Path) -> Iterator[Callable[..., DaemonProcess]]:
    def write(folder: Path, extra: str) -> Path:
        config = write_e2e_config(folder, 9)
        if extra:
            (folder / "caps.toml").write_text((folder / "caps.toml").read_text() + extra)
        return config

    with daemons_on(short_tmp, write) as start:
        yield start


def test_calls_run_at_once_each_through_the_whole_path(up: Callable[..., DaemonProcess]) -> None:
    """Three one-second calls answer in under 1.5 s, in order; an unknown capability and bad
    parameters are answered in their place as a call alone would be; a write that fails is
    queued as it would be alone; more than 8 calls is 422."""
    daemon = up()
    started = time.monotonic()
    answer = daemon.call("POST", "/calls", {"calls": [
        {"capability": "e2e.slow", "params": {"seconds": 1}} for _ in range(3)]})
    took = time.monotonic() - started
    assert answer.status == 200, answer.body
    assert took < 1.5, took
    assert [r["tool_result"]["result"] for r in answer.body["results"]] == ["slept"] * 3
    mixed = daemon.call("POST", "/calls", {"calls": [
        {"capability": "e2e.echo", "params": {"text": "first"}},
        {"capability": "e2e.nope"},
        {"capability": "e2e.slow", "params": {"seconds": "long"}},
        {"capability": "e2e.flaky", "params": {"text": "w"}}]}).body["results"]
    assert mixed[0]["tool_result"]["result"]["text"] == "first"
    assert (mixed[1]["http_status"], mixed[1]["problem"]["title"]) == (404,
                                                                      "Unknown Capability")
    assert mixed[2]["http_status"] == 422
    assert mixed[3]["http_status"] == 202
    assert mixed[3]["tool_result"]["queued"]
    too_many = daemon.call("POST", "/calls", {"calls": [{"capability": "e2e.echo"}] * 9})
    assert (too_many.status, too_many.body["errors"][0]["loc"]) == (422, ["calls"])
    cli = subprocess.run([PY, "-m", "capd", "call-many", "--params", json.dumps({"calls": [
        {"capability": "e2e.echo", "params": {"text": "cli"}}]}), "--socket",
        str(daemon.socket), "--json"], capture_output=True, text=True, timeout=60, check=False)
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["results"][0]["tool_result"]["result"]["text"] == "cli"


def test_search_k_follows_the_tier(up: Callable[..., DaemonProcess]) -> None:
    """Without k, a search for inner capabilities answers at most 3, one for outer ones at
    most 8; an undeclared tier follows timeout_s (e2e.slow's 30 s is outer)."""
    extra = "".join(f"""
[[capability]]
name = "e2e.quick{n}"
op = "e2e.echo"
summary = "Echo text back quickly, variant {n}."
latency_class = "inner"
timeout_s = 2
""" for n in range(6))
    daemon = up(extra)
    inner = daemon.call("GET", "/search?q=echo+text&latency_class=inner").body["results"]
    assert len(inner) == 3
    outer = daemon.call("GET", "/search?q=sleep&latency_class=outer").body["results"]
    assert "e2e.slow" in [r["name"] for r in outer]
    assert len(daemon.call("GET", "/search?q=echo&latency_class=inner&k=6").body[
        "results"]) == 6


def test_an_inner_capability_over_five_seconds_is_a_load_error(short_tmp: Path) -> None:
    """latency_class = "inner" with timeout_s above 5 is refused by capd check, naming it."""
    config = write_e2e_config(short_tmp, 9)
    (short_tmp / "caps.toml").write_text((short_tmp / "caps.toml").read_text() + """
[[capability]]
name = "e2e.slowinner"
op = "e2e.slow"
summary = "Claims to be fast, takes its time."
latency_class = "inner"
timeout_s = 20
""")
    done = subprocess.run([PY, "-m", "capd", "check", "--config", str(config), "--strict"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "e2e.slowinner" in done.stdout
    assert "latency_class 'inner' answers within 5 s" in done.stdout


def test_a_batch_reaches_nothing_outside_the_callers_grant(short_tmp: Path) -> None:
    """POST /calls as a uid bound to a profile, and invoke_many through `capd mcp --allow`:
    a capability outside the grant is answered as unknown, its name suggested nowhere,
    while the call inside it runs."""
    import asyncio

    from tests.helpers.bridge import bridge

    def write(folder: Path, extra: str) -> Path:
        config = write_e2e_config(folder, 9)
        config.write_text(config.read_text() + """
[profiles.echoer]
capabilities = ["e2e.echo"]

[[peers]]
gid = 4545
profile = "echoer"
""")
        return config

    batch = {"calls": [{"capability": "e2e.echo", "params": {"text": "in"}},
                       {"capability": "e2e.slow", "params": {"seconds": 0}},
                       {"capability": "e2e.slo"}]}
    with daemons_on(short_tmp, write) as start:
        daemon = start()
        bound = subprocess.run(["setpriv", "--groups=4545", "--", PY, "-m", "capd",
                                "call-many", "--params", json.dumps(batch), "--json",
                                "--socket", str(daemon.socket)],
                               capture_output=True, text=True, timeout=60, check=False)
        assert bound.returncode == 0, bound.stderr
        results = json.loads(bound.stdout)["results"]
        assert results[0]["tool_result"]["result"]["text"] == "in"
        for hidden in results[1:]:
            assert hidden["http_status"] == 404
            assert hidden["problem"]["title"] == "Unknown Capability"
            assert "e2e.slow" not in json.dumps(hidden["problem"]["suggestions"])

        async def through_bridge() -> object:
            async with bridge(daemon.socket, "--allow", "e2e.echo") as session:
                answer = await session.call_tool("invoke_many", batch)
                return answer.structured_content

        narrowed = asyncio.run(through_bridge())
        assert isinstance(narrowed, dict)
        assert [r["http_status"] for r in narrowed["results"]] == [200, 404, 404]
        assert "e2e.slow" not in json.dumps(narrowed["results"][2])
