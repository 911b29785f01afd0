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

from tests.helpers.daemon import DaemonProcess, daemons_on, write_e2e_config
from tests.helpers.peers import PEER

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

ESCAPER = '''
import json
import os
import subprocess
import sys

# a grandchild in a session of its own, with an empty environment: it leaves the
# engine's process group, session and environment, and must still be ended
child = subprocess.Popen(["setsid", "env", "-i", "sleep", "300"], start_new_session=True)
with open(sys.argv[1], "w") as out:
    out.write(str(child.pid))
print(json.dumps({"ok": True}), flush=True)
'''

DIALLER = '''
import json
import socket
import subprocess
import sys


def call(name: str) -> int:
    """POST /call/NAME on the daemon's socket directly (no bridge, no Capd-Grant)."""
    body = b'{"text": "direct"}'
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(sys.argv[1])
        sock.sendall(b"POST /call/" + name.encode() + b" HTTP/1.1\\r\\nHost: capd\\r\\n"
                     b"Content-Type: application/json\\r\\nContent-Length: "
                     + str(len(body)).encode() + b"\\r\\nConnection: close\\r\\n\\r\\n" + body)
        answer = b""
        while piece := sock.recv(65536):
            answer += piece
    return int(answer.split(b" ", 2)[1])


# and from a descendant that cleared its environment and left the session
grandchild = subprocess.run(
    ["setsid", "env", "-i", sys.executable, "-c",
     "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]);"
     "s.sendall(b'GET /capabilities/e2e.slow HTTP/1.1\\\\r\\\\nHost: c\\\\r\\\\n"
     "Connection: close\\\\r\\\\n\\\\r\\\\n'); print(s.recv(100).split()[1].decode())",
     sys.argv[1]], capture_output=True, text=True, timeout=30)
print(json.dumps({"inside": call("e2e.echo"), "outside": call("e2e.slow"),
                  "grandchild_outside": int(grandchild.stdout.strip() or 0)}), flush=True)
'''

HANDOFF = '''
import json
import os
import socket
import sys
import time

out = sys.argv[2] + ".result"
child = os.fork()
if child == 0:  # A: connects, hands the connection to B, exits before B speaks
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(sys.argv[1])
    if os.fork() == 0:  # B
        time.sleep(0.5)
        statuses = {}
        for path in ("/tokens", "/capabilities/e2e.slow"):
            sock.sendall(f"GET {path} HTTP/1.1\\r\\nHost: capd\\r\\n\\r\\n".encode())
            head = b""
            while b"\\r\\n\\r\\n" not in head:
                head += sock.recv(1)
            length = int(head.lower().split(b"content-length: ")[1].split(b"\\r\\n")[0])
            body = b""
            while len(body) < length:
                body += sock.recv(length - len(body))
            statuses[path] = int(head.split(b" ", 2)[1])
        with open(out + ".tmp", "w") as f:  # whole, then in place: never read half-written
            json.dump(statuses, f)
        os.rename(out + ".tmp", out)
        os._exit(0)
    os._exit(0)
os.waitpid(child, 0)
deadline = time.monotonic() + 20
while not os.path.exists(out) and time.monotonic() < deadline:
    time.sleep(0.05)
print(open(out).read(), flush=True)
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
    (short_tmp / "escaper.py").write_text(ESCAPER)
    (short_tmp / "dialler.py").write_text(DIALLER)
    (short_tmp / "handoff.py").write_text(HANDOFF)
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

[agents.escaper]
description = "An engine whose grandchild leaves its session and environment."
capabilities = ["e2e.echo"]
engine = {json.dumps([PY, str(folder / "escaper.py"), str(folder / "escaper.pid")])}

[agents.dialler]
description = "An engine that dials the daemon's socket itself."
capabilities = ["e2e.echo"]
engine = {json.dumps([PY, str(folder / "dialler.py"), str(folder / "capd.sock")])}

[agents.handoff]
description = "An engine whose child connects, hands the connection on and exits."
capabilities = ["e2e.echo"]
engine = {json.dumps([PY, str(folder / "handoff.py"), str(folder / "capd.sock"),
                      str(folder / "handoff")])}

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



def _gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}") or \
        Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"


def test_a_descendant_that_leaves_the_session_is_ended_with_the_run(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """A grandchild that calls setsid and clears its environment (as root) does not outlive
    the call: every process of the run is killed when it ends."""
    daemon = up()
    ran = daemon.call("POST", "/call/agent.escaper", {"goal": "go"})
    assert ran.status == 200, ran.body
    pid = int((short_tmp / "escaper.pid").read_text())
    daemon.wait_until(lambda: _gone(pid), timeout=10)


def test_an_engine_dialling_the_socket_is_its_agent_not_the_operator(
        up: Callable[..., DaemonProcess]) -> None:
    """An engine (the daemon's uid: an operator's) that calls the socket directly is held
    to its agent: a capability outside it is the same 404 as for any outside caller, one
    inside it works; a descendant that cleared its environment and left the session too."""
    daemon = up()
    ran = daemon.call("POST", "/call/agent.dialler", {"goal": "go"})
    assert ran.status == 200, ran.body
    assert ran.body["result"] == {"inside": 200, "outside": 404, "grandchild_outside": 404}
    assert daemon.call("POST", "/call/e2e.slow", {"seconds": 0}).status == 200  # operator


def test_run_as_runs_the_engine_as_that_user(up: Callable[..., DaemonProcess],
                                             peer_uid: int) -> None:
    """As root, an agent with run_as runs its engine as that user (its own uid, not
    root's); a run_as user the host lacks fails the build naming it."""
    engine = ["/bin/sh", "-c", 'printf \'{"uid": %s}\' "$(id -u)"']
    daemon = up(f"""
[agents.unprivileged]
description = "An engine that says who it runs as."
capabilities = ["e2e.echo"]
engine = {json.dumps(engine)}
run_as = "{PEER}"
""")
    ran = daemon.call("POST", "/call/agent.unprivileged", {"goal": "who"})
    assert ran.status == 200, ran.body.get("message")
    assert ran.body["result"] == {"uid": peer_uid}
    config = Path(daemon.config)
    config.write_text(config.read_text().replace(f'run_as = "{PEER}"', 'run_as = "nobody-xyz"'))
    failed = daemon.call("POST", "/reload")
    assert failed.status != 200
    assert "run_as 'nobody-xyz': no such user" in json.dumps(failed.body)


def test_an_engine_that_answers_without_reading_its_request_is_answered(
        up: Callable[..., DaemonProcess]) -> None:
    """An engine may print its answer and exit before capd has written the request to it
    (its stdin pipe is closed by then): the answer counts, every time."""
    engine = ["/bin/sh", "-c", """printf '{"ok": true}'"""]
    daemon = up(f"""
[agents.hasty]
description = "An engine that never reads its request."
capabilities = ["e2e.echo"]
engine = {json.dumps(engine)}
""")
    for _ in range(60):  # bounded: the race it guards against is a matter of timing
        ran = daemon.call("POST", "/call/agent.hasty", {"goal": "go"})
        assert ran.status == 200, ran.body.get("message")
        assert ran.body["result"] == {"ok": True}


def test_a_connection_handed_on_by_a_process_that_exited_is_nobodys(
        up: Callable[..., DaemonProcess]) -> None:
    """While a run is in flight, a connection whose connecting process has exited (a
    descendant was handed it) is nobody's: an operator row is refused, a capability
    outside the agent unknown."""
    daemon = up()
    ran = daemon.call("POST", "/call/agent.handoff", {"goal": "go"})
    assert ran.status == 200, ran.body.get("message")
    assert ran.body["result"] == {"/tokens": 403, "/capabilities/e2e.slow": 404}
