"""Agents that run, through the real daemon: an agent with an engine is the capability
agent.NAME, found by search, shown with its system prompt, invoked with a goal; its engine
calls a capability through the scoped MCP configuration capd hands it; a sleeping engine
times out transient and leaves no process."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .daemon import DaemonProcess, daemons_on, write_e2e_config

pytestmark = pytest.mark.slow  # the real daemon, an engine process and the bridge

PY = sys.executable

ENGINE = '''
import asyncio
import json
import os
import sys

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

request = json.loads(sys.stdin.readline())
config = json.load(open(os.environ["CAPD_MCP_CONFIG"]))
[(name, server)] = config["mcpServers"].items()


async def main() -> dict:
    params = StdioServerParameters(command=server["command"], args=server["args"])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        echoed = await session.call_tool("invoke_capability", {
            "id": "e2e.echo", "arguments": {"text": request["goal"]}})
        outside = await session.call_tool("invoke_capability", {
            "id": "e2e.slow", "arguments": {"seconds": 0}})
        return {"server": name, "echoed": echoed.structured_content["result"]["text"],
                "outside_refused": outside.is_error, "system_prompt": request["system_prompt"],
                "agent": request["agent"], "cwd": os.getcwd(), "context": request["context"]}


print(json.dumps(asyncio.run(main())))
'''

SLEEPER = '''
import os
import sys
import time

with open(sys.argv[1], "w") as out:
    out.write(str(os.getpid()))
time.sleep(120)
'''

LEAKY = '''
import json
import subprocess
import sys

child = subprocess.Popen(["sleep", "300"])  # left behind, holding stdout
with open(sys.argv[1], "w") as out:
    out.write(str(child.pid))
print(json.dumps({"ok": True}), flush=True)
'''

FAILING = '''
import sys

sys.stderr.write("the model is overloaded\\n")
sys.exit(int(sys.argv[1]))
'''


@pytest.fixture
def up(short_tmp: Path) -> Iterator[Callable[..., DaemonProcess]]:
    (short_tmp / "engine.py").write_text(ENGINE)
    (short_tmp / "sleeper.py").write_text(SLEEPER)
    (short_tmp / "failing.py").write_text(FAILING)
    (short_tmp / "leaky.py").write_text(LEAKY)
    pid_file = short_tmp / "sleeper.pid"

    def write(folder: Path, extra: str) -> Path:
        config = write_e2e_config(folder, 9)
        config.write_text(config.read_text() + f"""
[agents.helper]
description = "Answer a question by echoing it back through capd."
capabilities = ["e2e.echo"]
engine = {json.dumps([PY, str(folder / "engine.py")])}
system_prompt = "You help by echoing."

[agents.sleepy]
description = "Think for a very long time."
capabilities = ["e2e.echo"]
engine = {json.dumps([PY, str(folder / "sleeper.py"), str(pid_file)])}
timeout_s = 2

[agents.busy]
description = "An engine whose model is overloaded."
capabilities = ["e2e.echo"]
engine = {json.dumps([PY, str(folder / "failing.py"), "75"])}

[agents.leaky]
description = "An engine that leaves a child behind."
capabilities = ["e2e.echo"]
engine = {json.dumps([PY, str(folder / "leaky.py"), str(folder / "leaky.pid")])}

[agents.broken]
description = "An engine that fails for good."
capabilities = ["e2e.echo"]
engine = {json.dumps([PY, str(folder / "failing.py"), "3"])}
""" + extra)
        return config

    with daemons_on(short_tmp, write) as start:
        yield start


def test_an_agent_with_an_engine_is_found_shown_and_run(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """agent.helper is found by search, its manifest shows the agent, and invoking it runs
    the engine, whose own call goes through capd held to the agent's capabilities."""
    daemon = up()
    found = daemon.call("GET", "/search?q=answer+a+question+by+echoing&k=3").body["results"]
    assert "agent.helper" in [r["name"] for r in found]
    shown = daemon.call("GET", "/capabilities/agent.helper").body
    assert shown["agent"]["system_prompt"] == "You help by echoing."
    assert shown["agent"]["capabilities"] == ["e2e.echo"]
    assert set(shown["parameters"]["properties"]) == {"goal", "context", "cwd"}
    ran = daemon.call("POST", "/call/agent.helper", {
        "goal": "hello from the goal", "cwd": str(short_tmp), "context": {"thread": "t1"}})
    assert ran.status == 200, ran.body
    result = ran.body["result"]
    assert result["echoed"] == "hello from the goal"
    assert result["outside_refused"] is True  # e2e.slow is not the agent's
    assert result["server"] == "capd-helper"
    assert (result["agent"], result["system_prompt"]) == ("helper", "You help by echoing.")
    assert result["cwd"] == str(short_tmp)
    assert result["context"] == {"thread": "t1"}
    bad = daemon.call("POST", "/call/agent.helper", {"goal": ""})
    assert bad.status == 422


def test_a_sleeping_engine_times_out_transient_and_leaves_no_process(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """Past the agent's timeout_s its process group is killed and the call is transient;
    exit 75 is transient, another exit permanent, with the end of stderr."""
    daemon = up()
    started = time.monotonic()
    slept = daemon.call("POST", "/call/agent.sleepy", {"goal": "think"})
    assert time.monotonic() - started < 10
    assert slept.body["status"] == "error_transient", slept.body
    assert slept.body["error_type"] == "timeout"
    pid = int((short_tmp / "sleeper.pid").read_text())
    daemon.wait_until(lambda: not os.path.exists(f"/proc/{pid}") or
                      Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", timeout=10)
    busy = daemon.call("POST", "/call/agent.busy", {"goal": "now"})
    assert busy.body["status"] == "error_transient", busy.body
    assert "the model is overloaded" in busy.body["message"]
    broken = daemon.call("POST", "/call/agent.broken", {"goal": "now"})
    assert broken.body["status"] == "error_permanent", broken.body
    assert "exited 3" in broken.body["message"]


def test_an_engine_that_leaves_a_child_answers_and_the_child_is_ended(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """An engine that exits with its answer while a child of its still holds stdout is
    answered at once (not timed out), and the child is killed with its process group."""
    daemon = up()
    started = time.monotonic()
    ran = daemon.call("POST", "/call/agent.leaky", {"goal": "go"})
    assert ran.status == 200, ran.body
    assert time.monotonic() - started < 10
    assert ran.body["result"]["ok"] is True
    pid = int((short_tmp / "leaky.pid").read_text())
    daemon.wait_until(lambda: not os.path.exists(f"/proc/{pid}") or
                      Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", timeout=10)
