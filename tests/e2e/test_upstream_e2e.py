"""Upstream MCP servers as tools, through the real daemon, with the real third-party
servers `mcp-server-time` and `mcp-server-git` (installed by the test extra)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import DaemonProcess, daemons_on
from tests.helpers.upstreams import stdio_tool

pytestmark = pytest.mark.slow  # starts the real daemon and real MCP servers as processes

PY = sys.executable


def write_config(folder: Path, extra: str = "") -> Path:
    config = folder / "capd.toml"
    config.write_text(textwrap.dedent(f"""
        entry_points = false
        state_dir = "state"
        recheck_cooldown_s = 0
        recheck_interval_s = 0.5
        probe_live_interval_s = 1
        retry_base_s = 0.2

        [tools.time_mcp]
        kind = "mcp"
        command = ["{PY}", "-m", "mcp_server_time", "--local-timezone", "UTC"]
        timeout_s = 30

        [tools.git_mcp]
        kind = "mcp"
        command = ["{PY}", "-m", "mcp_server_git"]
        timeout_s = 30
        exclude = ["git_create_branch"]
    """) + extra)
    return config


@pytest.fixture
def repo(short_tmp: Path) -> Path:
    path = short_tmp / "repo"
    path.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    for argv in (["git", "init", "-q"], ["git", "commit", "-q", "--allow-empty", "-m", "one"]):
        subprocess.run(argv, cwd=path, check=True, env=env, timeout=30)
    (path / "new.txt").write_text("hello\n")
    return path


@pytest.fixture
def up(short_tmp: Path) -> Iterator[Callable[..., DaemonProcess]]:
    with daemons_on(short_tmp, write_config) as start:
        yield start


def server_pid(daemon: DaemonProcess, module: str) -> int:
    """The pid of the MCP server process the daemon spawned for ``module``."""
    assert daemon.proc is not None
    found: list[tuple[int, int]] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            started = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[19])
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["PPid"]) == daemon.proc.pid and module.encode() in cmdline \
                and fields["State"].split()[0] not in ("Z", "X"):  # one exiting is not it
            found.append((started, int(proc.name)))
    assert found, f"no {module} process under the daemon"
    return max(found)[1]  # the newest: a server restarted a moment ago replaces the old




def caps(daemon: DaemonProcess) -> dict[str, dict[str, Any]]:
    body = daemon.call("GET", "/capabilities").body
    return {c["name"]: c for c in body["capabilities"]}


def test_upstream_tools_are_capabilities_with_their_schemas_and_calls_round_trip(
        up: Callable[..., DaemonProcess], repo: Path) -> None:
    daemon = up()
    found = caps(daemon)
    assert {"time_mcp.get_current_time", "time_mcp.convert_time",
            "git_mcp.git_status", "git_mcp.git_add"} <= set(found)
    assert "git_mcp.git_create_branch" not in found  # excluded
    manifest = daemon.call("GET", "/capabilities/time_mcp.get_current_time").body
    assert manifest["parameters"]["required"] == ["timezone"]
    assert manifest["mutates_state"] is False  # readOnlyHint
    assert daemon.call("GET", "/capabilities/git_mcp.git_add").body["mutates_state"] is True
    now = daemon.call("POST", "/call/time_mcp.get_current_time", {"timezone": "UTC"})
    assert now.status == 200, now.body
    upstream = daemon.call("GET", "/status").body["upstreams"]["time_mcp"]
    assert upstream["connected"] is True
    assert upstream["kind"] == "stdio"
    assert upstream["tools"] >= 2
    assert upstream["server"]["name"]  # what its handshake said it is
    assert upstream["since"] > 0
    assert now.body["result"]["timezone"] == "UTC"
    status = daemon.call("POST", "/call/git_mcp.git_status", {"repo_path": str(repo)})
    assert status.status == 200, status.body
    assert "new.txt" in json.dumps(status.body["result"])
    bad = daemon.call("POST", "/call/time_mcp.get_current_time", {})
    assert bad.status == 422
    assert "timezone" in bad.body["detail"]
    found = daemon.call("GET", "/search?q=current+time+in+a+timezone").body["results"]
    assert found[0]["name"] == "time_mcp.get_current_time"


def test_a_killed_server_disables_its_capabilities_queues_writes_and_heals_by_itself(
        up: Callable[..., DaemonProcess], repo: Path) -> None:
    daemon = up()
    os.kill(server_pid(daemon, "mcp_server_git"), signal.SIGKILL)
    queued = daemon.call("POST", "/call/git_mcp.git_add",
                         {"repo_path": str(repo), "files": ["new.txt"]})
    assert queued.status == 202, queued.body
    assert queued.body["queued"]
    daemon.wait_until(lambda: caps(daemon)["git_mcp.git_status"]["state"] == "disabled"
                      or daemon.call("POST", "/call/git_mcp.git_status",
                                     {"repo_path": str(repo)}).status == 200, timeout=20)
    # within a probe interval or two the server is back (a new process), without a reload
    daemon.wait_until(lambda: caps(daemon)["git_mcp.git_status"]["state"] == "live",
                      timeout=30)
    again = daemon.call("POST", "/call/git_mcp.git_status", {"repo_path": str(repo)})
    assert again.status == 200, again.body
    assert daemon.call("GET", "/status").body["reload"]["count"] == 0
    job = daemon.call("GET", f"/queue/{queued.body['queued']}").body
    assert job["state"] == "needs_operator"  # a mutating upstream tool defaults to manual


def test_a_server_that_never_answers_leaves_the_daemon_serving(
        up: Callable[..., DaemonProcess]) -> None:
    daemon = up(textwrap.dedent(f"""
        [tools.mute_mcp]
        kind = "mcp"
        command = ["{PY}", "-c", "import time; time.sleep(60)"]
        timeout_s = 1
    """))
    health = daemon.call("GET", "/health").body
    assert health["status"] in ("pass", "warn")
    assert "time_mcp.get_current_time" in caps(daemon)


GROWER = '''
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("grower")


@server.tool()
def ping(text: str) -> str:
    """Answer the text back."""
    return text


@server.tool()
async def grow(ctx: Context) -> str:
    """Add a tool named extra and announce the new list."""
    def extra(n: int) -> int:
        """Double a number."""
        return 2 * n
    server.add_tool(extra, name="extra")
    await ctx.session.send_tool_list_changed()
    return "grown"


@server.tool()
async def flood(ctx: Context, n: int, pause_s: float) -> str:
    """Announce a changed tool list n times, pause_s apart."""
    import asyncio

    for _ in range(n):
        await ctx.session.send_tool_list_changed()
        await asyncio.sleep(pause_s)
    return "flooded"


server.run("stdio")
'''


def test_tools_list_changed_is_followed_and_upstreams_answer_through_capd_mcp(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """A server that adds a tool and says so: its new tool becomes a capability, callable
    over the socket and through the MCP bridge, by a refresh of that server alone (no
    reload, the other servers' sessions untouched)."""
    import asyncio

    from tests.helpers.bridge import bridge, data

    daemon = up(stdio_tool(short_tmp, "grow_mcp", GROWER))
    assert "grow_mcp.extra" not in caps(daemon)
    time_server = server_pid(daemon, "mcp_server_time")
    assert daemon.call("POST", "/call/grow_mcp.grow", {}).status == 200
    refreshed = daemon.wait_event("upstream_refreshed")
    assert refreshed["tool"] == "grow_mcp"
    daemon.wait_until(lambda: "grow_mcp.extra" in caps(daemon), timeout=20)
    doubled = daemon.call("POST", "/call/grow_mcp.extra", {"n": 21})
    assert (doubled.status, doubled.body["result"]) == (200, {"result": 42})
    assert daemon.call("GET", "/status").body["reload"]["count"] == 0
    assert server_pid(daemon, "mcp_server_time") == time_server
    found = daemon.call("GET", "/search?q=double+a+number&k=3").body["results"]
    assert "grow_mcp.extra" in [r["name"] for r in found]  # the search index was rebuilt

    async def through_bridge() -> Any:
        async with bridge(daemon.socket) as session:
            answer = await session.call_tool("invoke_capability", {
                "id": "time_mcp.get_current_time", "arguments": {"timezone": "UTC"}})
            return data(answer)

    answer = asyncio.run(through_bridge())
    assert (answer["status"], answer["result"]["timezone"]) == ("success", "UTC")


STALLER = '''
import asyncio

from mcp.server.mcpserver import MCPServer

server = MCPServer("staller")


@server.tool()
def echo(text: str) -> str:
    """Answer the text back."""
    return text


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "late"


@server.tool()
def big(n: int) -> str:
    """Answer n bytes of text."""
    return "a" * n


server.run("stdio")
'''


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not been reaped or turned zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


def test_a_call_past_call_timeout_is_transient_and_a_stalled_server_is_restarted(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """A slow tool answers a transient error past call_timeout_s (the server still pings);
    a SIGSTOPped server misses its ping, is killed and started again, with no reload."""
    daemon = up(stdio_tool(short_tmp, "stall_mcp", STALLER, call_timeout_s=1,
                           ping_timeout_s=2))
    script = short_tmp / "stall_mcp.py"
    slow = daemon.call("POST", "/call/stall_mcp.slow", {"seconds": 5})
    # no readOnlyHint: a write, so the transient failure is queued (manual: parked)
    assert slow.status == 202, slow.body
    assert (slow.body["status"], slow.body["error_type"]) == ("error_transient", "transient")
    assert daemon.call("GET", f"/queue/{slow.body['queued']}").body["state"] == \
        "needs_operator"
    assert "did not answer slow within 1s" in slow.body["message"]
    assert "asked to cancel" in slow.body["message"]
    echo = daemon.call("POST", "/call/stall_mcp.echo", {"text": "still here"})
    assert (echo.status, echo.body["result"]) == (200, {"result": "still here"})

    stalled = server_pid(daemon, str(script))
    os.kill(stalled, signal.SIGSTOP)
    try:
        down = daemon.call("POST", "/call/stall_mcp.echo", {"text": "hello?"})
        assert down.status in (202, 503), down.body
        assert down.body["error_type"] in ("tool_unavailable", "capability_disabled")
        daemon.wait_until(lambda: not _alive(stalled), timeout=30)
        daemon.wait_until(lambda: daemon.call("POST", "/call/stall_mcp.echo",
                                              {"text": "back"}).status == 200, timeout=30)
        assert server_pid(daemon, str(script)) != stalled
        assert daemon.call("GET", "/status").body["reload"]["count"] == 0
    finally:
        if _alive(stalled):
            os.kill(stalled, signal.SIGKILL)


def test_a_burst_of_list_changed_is_one_reload(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """A server announcing a changed list 100 times a second for 2 s gets a refresh of its
    own tools per half second at most, and never a full reload."""
    daemon = up(stdio_tool(short_tmp, "grow_mcp", GROWER))
    flood = daemon.call("POST", "/call/grow_mcp.flood", {"n": 200, "pause_s": 0.01})
    assert flood.status == 200, flood.body
    daemon.wait_event("upstream_refreshed")
    time.sleep(1.5)  # past the last burst's settling
    refreshes = [e for e in daemon.events if e.get("event") == "upstream_refreshed"]
    assert 1 <= len(refreshes) <= 7, len(refreshes)
    assert daemon.call("GET", "/status").body["reload"]["count"] == 0
    assert daemon.call("GET", "/health").status == 200


PAINTER = '''
import base64

import mcp_types as types
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.utilities.types import Image

server = MCPServer("painter")
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


@server.tool(title="Painter", annotations=types.ToolAnnotations(read_only_hint=True))
def paint(title: str) -> list:
    """Paint a tiny picture, with a caption, a file and a link."""
    return [
        f"a picture of {title}",
        Image(data=PNG, format="png"),
        types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(
            uri="file:///tmp/picture.bin", mime_type="application/octet-stream",
            blob=base64.b64encode(b"\\\\x00\\\\x01binary").decode())),
        types.ResourceLink(type="resource_link", uri="file:///tmp/picture.png",
                           name="picture.png", mime_type="image/png"),
    ]


server.run("stdio")
'''

PNG_B64 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJ"
           "RU5ErkJggg==")


def test_every_content_block_is_relayed_over_the_socket_and_through_the_bridge(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """An upstream's text, image, embedded resource and resource link reach the socket API
    as they came; `capd mcp` relays them as blocks (meta mode after the ToolResult, direct
    mode as the answer itself, with capd's facts in _meta), even before any tools/list; a
    direct tool keeps the title and annotations its server gave it."""
    import asyncio

    import mcp_types as types

    from tests.helpers.bridge import bridge

    daemon = up(stdio_tool(short_tmp, "paint_mcp", PAINTER))
    answer = daemon.call("POST", "/call/paint_mcp.paint", {"title": "a cat"})
    assert answer.status == 200, answer.body
    kinds = [b["type"] for b in answer.body["content"]]
    assert kinds == ["text", "image", "resource", "resource_link"]
    image = answer.body["content"][1]
    assert (image["data"], image["mimeType"]) == (PNG_B64, "image/png")
    assert answer.body["content"][2]["resource"]["mimeType"] == "application/octet-stream"
    assert answer.body["result"] == "a picture of a cat"

    async def meta() -> types.CallToolResult:
        async with bridge(daemon.socket) as session:
            return await session.call_tool("invoke_capability", {
                "id": "paint_mcp.paint", "arguments": {"title": "a dog"}})

    async def direct() -> tuple[types.CallToolResult, dict[str, types.Tool]]:
        async with bridge(daemon.socket, "--expose", "direct") as session:
            called = await session.call_tool("paint_mcp.paint", {"title": "a bird"})
            listed = {t.name: t for t in (await session.list_tools()).tools}
            return called, listed

    via_meta = asyncio.run(meta())
    assert [b.type for b in via_meta.content] == ["text", "image", "resource",
                                                  "resource_link"]
    assert PNG_B64 not in via_meta.content[0].text  # type: ignore[union-attr]
    assert via_meta.content[1].data == PNG_B64  # type: ignore[union-attr]
    via_direct, listed = asyncio.run(direct())
    painter = listed["paint_mcp.paint"]  # what the server said of its tool is kept
    assert painter.title == "Painter"
    assert painter.annotations is not None
    assert painter.annotations.read_only_hint is True
    assert [b.type for b in via_direct.content] == ["text", "image", "resource",
                                                    "resource_link"]
    assert via_direct.content[0].text == "a picture of a bird"  # type: ignore[union-attr]
    assert via_direct.meta is not None
    assert via_direct.meta["capd"]["status"] == "success"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PY, "-m", "capd", "call", "paint_mcp.paint", "-p", "title=a fox",
                               *args, "--socket", str(daemon.socket)],
                              capture_output=True, text=True, timeout=60, check=False)

    told = cli()
    assert told.returncode == 0, told.stderr
    assert "a picture of a fox" in told.stdout
    assert PNG_B64 not in told.stdout  # never a base64 wall on a terminal
    assert "[block 2: image image/png, 70 bytes; capd call --output-dir DIR saves it]" \
        in told.stdout
    out = short_tmp / "out"
    saved = cli("--output-dir", str(out))
    assert saved.returncode == 0, saved.stderr
    files = sorted(out.iterdir())
    assert [f.suffix for f in files] == [".png", ".bin"]
    assert files[0].read_bytes() == base64.b64decode(PNG_B64)
    assert f"wrote {files[0]}" in saved.stdout


COUNTED = '''
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

with open(sys.argv[1], "a", encoding="utf-8") as log:
    log.write("started\\n")

server = MCPServer("counted")


@server.tool()
def echo(text: str) -> str:
    """Answer the text back."""
    return text


server.run("stdio")
'''


def test_capd_check_starts_each_upstream_once(short_tmp: Path) -> None:
    """capd check lists an upstream's tools and probes it on one session: one start."""
    starts = short_tmp / "starts.log"
    config = short_tmp / "capd.toml"
    config.write_text('entry_points = false\nstate_dir = "state"\n'
                      + stdio_tool(short_tmp, "count_mcp", COUNTED, str(starts)))
    done = subprocess.run([PY, "-m", "capd", "check", "--config", str(config), "--json"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)  # stdout is the report alone: log lines go to stderr
    assert "count_mcp.echo" in json.dumps(report["live"])
    assert starts.read_text().splitlines() == ["started"]


TASKY = """import anyio
import mcp_types as types
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.stdio import stdio_server


async def list_tools(ctx, params):
    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    return types.ListToolsResult(tools=[
        types.Tool(name="plain", description="Answer the text.", input_schema=schema,
                   annotations=types.ToolAnnotations(read_only_hint=True)),
        types.Tool(name="tasky", description="Only as a task.", input_schema=schema,
                   execution=types.ToolExecution(task_support="required")),
    ])


async def call_tool(ctx, params):
    if params.name == "tasky":
        raise ValueError("tasky requires task augmentation")
    return types.CallToolResult(content=[types.TextContent(text=str(params.arguments))])


server = Server("tasky", on_list_tools=list_tools, on_call_tool=call_tool)


async def main():
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options(NotificationOptions()))


anyio.run(main)
"""


def test_a_tool_that_runs_only_as_a_task_is_not_offered(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """A tool whose execution.taskSupport is required would fail every tools/call: it is
    left out with why (capd status), its sibling is offered and answers."""
    daemon = up(stdio_tool(short_tmp, "task_mcp", TASKY))
    found = caps(daemon)
    assert "task_mcp.plain" in found
    assert "task_mcp.tasky" not in found
    why = daemon.call("GET", "/status").body["registry"]["not_on_host"]["task_mcp.tasky"]
    assert "only as an MCP task" in why
    assert daemon.call("POST", "/call/task_mcp.plain", {"text": "hi"}).status == 200


def test_an_answer_over_max_result_bytes_is_refused_and_the_session_stays_usable(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """A 20 MiB answer (over the default 16 MiB) and one over a small configured bound are
    error_permanent / result_too_large with the size; the daemon never reads them, its
    health answers throughout, and the same session answers the next call."""
    daemon = up(stdio_tool(short_tmp, "stall_mcp", STALLER)
                + stdio_tool(short_tmp, "small_mcp", STALLER, max_result_bytes=65536))
    huge = daemon.call("POST", "/call/stall_mcp.big", {"n": 20 << 20})
    assert huge.status == 502, huge.body
    assert (huge.body["status"], huge.body["error_type"]) == ("error_permanent",
                                                              "result_too_large")
    assert "max_result_bytes is 16777216" in huge.body["message"]
    assert daemon.call("GET", "/health").status == 200
    fine = daemon.call("POST", "/call/stall_mcp.big", {"n": 1000})
    assert fine.status == 200, fine.body
    small = daemon.call("POST", "/call/small_mcp.big", {"n": 100_000})
    assert small.body["error_type"] == "result_too_large"
    assert "max_result_bytes is 65536" in small.body["message"]
    again = daemon.call("POST", "/call/small_mcp.echo", {"text": "still here"})
    assert again.status == 200, again.body


STUBBORN = '''
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("stubborn")


@server.tool()
def echo(text: str) -> str:
    """Answer the text back."""
    return text


@server.tool()
def block(seconds: float) -> str:
    """Block a thread for a while: the process outlives the end of its stdin meanwhile."""
    time.sleep(seconds)
    return "done"


server.run("stdio")
'''


def test_a_daemon_killed_with_sigkill_leaves_no_server_running(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """The relay in front of each stdio server asks to be told of the daemon's death and
    then ends the server's process group: kill -9 of the daemon leaves no server behind."""
    daemon = up(stdio_tool(short_tmp, "stubborn_mcp", STUBBORN))
    assert daemon.call("POST", "/call/stubborn_mcp.echo", {"text": "up"}).status == 200
    relay = server_pid(daemon, str(short_tmp / "stubborn_mcp.py"))  # the daemon's child
    [server] = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                and _parent(int(p.name)) == relay]
    # a call in flight: a server busy with it outlives the end of its stdin
    def slow_call() -> None:
        with contextlib.suppress(Exception):  # the daemon is killed under it
            daemon.call("POST", "/call/stubborn_mcp.block", {"seconds": 30})

    busy = threading.Thread(target=slow_call, daemon=True)
    busy.start()
    daemon.wait_until(lambda: daemon.call("GET", "/status").body["calls"]["in_flight"] == 1)
    killed = time.monotonic()
    daemon.kill()  # (it waits for the daemon's stderr, which a living server holds open)
    while (_alive(server) or _alive(relay)) and time.monotonic() - killed < 10:
        time.sleep(0.1)
    assert not _alive(server)
    assert not _alive(relay)
    assert time.monotonic() - killed < 10  # not the 30 s its call would have taken


LATE = '''
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer

first = Path(sys.argv[1])
if not first.exists():  # slow to start the first time only
    first.write_text("started")
    time.sleep(8)

server = MCPServer("late")


@server.tool()
def echo(text: str) -> str:
    """Answer the text back."""
    return text


server.run("stdio")
'''


def test_a_server_that_misses_its_first_handshake_gets_its_capabilities_when_it_answers(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """A server slower than its handshake timeout at start has no capabilities; once a
    later handshake succeeds its tools become capabilities, with no reload."""
    daemon = up(stdio_tool(short_tmp, "late_mcp", LATE, str(short_tmp / "late.marker"),
                           timeout_s=4))
    assert "late_mcp.echo" not in caps(daemon)  # its first handshake took too long
    daemon.wait_until(lambda: "late_mcp.echo" in caps(daemon), timeout=40)
    answer = daemon.call("POST", "/call/late_mcp.echo", {"text": "finally"})
    assert answer.status == 200, answer.body
    assert daemon.call("GET", "/status").body["reload"]["count"] == 0
