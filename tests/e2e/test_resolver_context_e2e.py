"""Resolver context and injection-only capabilities, through the real daemon and CLI: an
agent's own servers get {agent_id} and the run's context substituted; an unknown
placeholder fails the resolution naming it; an injection-only capability cannot be
listed by an agent and is added by its injection."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import DaemonProcess, daemons_on, write_e2e_config

pytestmark = pytest.mark.slow  # the real daemon and the CLI as processes

PY = sys.executable


@pytest.fixture
def up(short_tmp: Path) -> Iterator[Callable[..., DaemonProcess]]:
    def write(folder: Path, extra: str) -> Path:
        config = write_e2e_config(folder, 9)
        (folder / "caps.toml").write_text((folder / "caps.toml").read_text() + """
[[capability]]
name = "e2e.shout"
op = "e2e.echo"
summary = "Echo loudly, only where a context asks for it."
injection_only = true
tags = ["e2e"]
""")
        config.write_text(config.read_text() + """
[agents.coder]
description = "Writes code in a workspace."
capabilities = ["tag:e2e"]

[agents.coder.servers.workspace]
command = ["fs-server", "--root", "{workspace_dir}", "--agent", "{agent_id}"]
env = { THREAD = "{thread_id}" }

[[injections]]
when = "loud"
add = ["e2e.shout"]
why = "a loud run may shout"
""" + extra)
        return config

    with daemons_on(short_tmp, write) as start:
        yield start


def resolve(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "capd", "agent", "resolve", "coder", *args, "--json",
                           "--socket", str(daemon.socket)],
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_context_is_substituted_into_an_agents_own_servers(
        up: Callable[..., DaemonProcess]) -> None:
    daemon = up()
    done = resolve(daemon, "--context", "thread_id=t9", "--context", "workspace_dir=/w/t9")
    assert done.returncode == 0, done.stderr
    body: dict[str, Any] = json.loads(done.stdout)
    workspace = body["servers"]["workspace"]
    assert workspace == {"command": "fs-server", "args": ["--root", "/w/t9", "--agent", "coder"],
                         "env": {"THREAD": "t9"}}
    assert "capd-coder" in body["servers"]
    # tag:e2e passes the injection-only capability by; its injection adds it
    assert "e2e.shout" not in body["capabilities"]
    loud = json.loads(resolve(daemon, "--context", "thread_id=t9", "--context",
                              "workspace_dir=/w", "--context", "loud=true").stdout)
    assert "e2e.shout" in loud["capabilities"]
    missing = resolve(daemon, "--context", "workspace_dir=/w")
    assert missing.returncode == 1
    problem = json.loads(missing.stdout)
    assert problem["status"] == 422
    assert any("{thread_id}" in u["detail"] and u["entry"] == "servers.workspace"
               for u in problem["unresolved"]), problem


def test_an_agent_listing_an_injection_only_capability_is_refused(
        up: Callable[..., DaemonProcess]) -> None:
    daemon = up("""
[agents.shouter]
capabilities = ["e2e.shout"]
""")
    done = subprocess.run([PY, "-m", "capd", "agent", "resolve", "shouter", "--json",
                           "--socket", str(daemon.socket)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "injection-only" in done.stdout
