"""What an upstream MCP server does besides answering, through the real daemon and
`capd mcp`: progress as it happens, a client's cancellation reaching the server, a
sampling request put to the client whose call made it (and refused where it cannot
be answered), resources and prompts under the server's prefix and the caller's grant,
and a write past its timeout cancelled upstream, queued, and landed exactly once."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.bridge import bridge
from tests.helpers.daemon import DaemonProcess, daemons_on
from tests.helpers.streams import dechunk, stream_call
from tests.helpers.upstreams import stdio_tool, upstream_config

pytestmark = pytest.mark.slow  # the real daemon, real MCP servers and the bridge

PY = sys.executable

FULL = '''
import asyncio
import sys
from pathlib import Path

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

server = MCPServer("full")
MARKS = Path(sys.argv[1])


def mark(line: str) -> None:
    with MARKS.open("a", encoding="utf-8") as out:
        out.write(line + "\\n")


@server.tool(annotations=types.ToolAnnotations(read_only_hint=True))
async def count(n: int, pause_s: float, ctx: Context) -> str:
    """Count to n, reporting progress at each step."""
    for i in range(1, n + 1):
        await ctx.report_progress(i, n, f"step {i}")
        await asyncio.sleep(pause_s)
    return f"counted {n}"


@server.tool(annotations=types.ToolAnnotations(read_only_hint=True))
async def ask_model(question: str, ctx: Context) -> str:
    """Ask the client's model a question (MCP sampling)."""
    answer = await ctx.session.create_message(
        messages=[types.SamplingMessage(role="user", content=types.TextContent(
            type="text", text=question))], max_tokens=20,
        related_request_id=ctx.request_id)
    return f"the model said: {answer.content.text}"


class Name(BaseModel):
    name: str


@server.tool(annotations=types.ToolAnnotations(read_only_hint=True))
async def greet(ctx: Context) -> str:
    """Ask the user for a name (MCP elicitation) and greet them."""
    answer = await ctx.elicit("What is your name?", Name)
    if answer.action != "accept":
        return f"no name ({answer.action})"
    return f"hello {answer.data.name}"


@server.tool()
async def slow_write(key: str, seconds: float) -> str:
    """Append key to the marks, the first time after a while; a cancelled call writes
    nothing."""
    first = not MARKS.exists() or f"attempt {key}" not in MARKS.read_text()
    mark(f"attempt {key}")
    try:
        await asyncio.sleep(seconds if first else 0)
    except asyncio.CancelledError:
        mark(f"cancelled {key}")
        raise
    mark(f"wrote {key}")
    return f"wrote {key}"


@server.resource("memo://greeting", name="greeting", mime_type="text/plain")
def greeting() -> str:
    """A greeting."""
    return "hello from a resource"


@server.resource("memo://logo", name="logo", mime_type="image/png")
def logo() -> bytes:
    """A picture."""
    return b"\\x89PNG-not-really"


@server.resource("memo://notes/{name}", name="note", mime_type="text/plain")
def note(name: str) -> str:
    """A note by name."""
    return f"note {name}"


@server.resource("memo://notes/private/{name}", name="private_note", mime_type="text/plain")
def private_note(name: str) -> str:
    """A private note by name."""
    return f"private {name}"


@server.prompt()
def review(code: str) -> str:
    """Ask for a review of some code."""
    return f"Please review: {code}"


server.run("stdio")
'''




@pytest.fixture
def up(short_tmp: Path) -> Iterator[Callable[..., DaemonProcess]]:
    with daemons_on(short_tmp, upstream_config) as start:
        yield start


@pytest.fixture
def marks(short_tmp: Path) -> Path:
    return short_tmp / "marks.log"


def full_server(folder: Path, marks: Path, **settings: object) -> str:
    return stdio_tool(folder, "full", FULL, str(marks), **settings)






def test_progress_streams_over_the_socket_and_reaches_an_sdk_client(
        up: Callable[..., DaemonProcess], short_tmp: Path, marks: Path) -> None:
    """Asked for NDJSON, a call streams its progress lines as they happen and ends with
    its result; one that says nothing first answers as without the header; the bridge
    relays the progress to the SDK client's progress callback."""
    daemon = up(full_server(short_tmp, marks))
    head, lines = stream_call(daemon, "full.count", {"n": 3, "pause_s": 0.05})
    assert head.startswith("HTTP/1.1 200"), head
    assert "application/x-ndjson" in head
    assert [line["event"] for line in lines] == ["progress"] * 3 + ["result"]
    assert [(p["progress"], p["total"], p["message"]) for p in lines[:3]] == [
        (1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]
    assert lines[-1]["http_status"] == 200
    assert lines[-1]["tool_result"]["result"] == {"result": "counted 3"}
    head, quiet = stream_call(daemon, "full.count", {"n": 0, "pause_s": 0})
    assert "application/json" in head
    assert quiet[0]["result"] == {"result": "counted 0"}

    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async def relay() -> Any:
        async with bridge(daemon.socket, "--expose", "direct") as session:
            return await session.call_tool("full.count", {"n": 4, "pause_s": 0.05},
                                           progress_callback=on_progress)

    result = asyncio.run(relay())
    assert result.is_error is False, result
    assert result.content[0].text == "counted 4"
    assert seen == [(i, 4, f"step {i}") for i in range(1, 5)]


def test_a_client_that_goes_away_cancels_the_call_upstream(
        up: Callable[..., DaemonProcess], short_tmp: Path, marks: Path) -> None:
    """A stream closed mid-call cancels it: the server sees notifications/cancelled (its
    handler is cancelled and writes nothing), nothing is queued; through the bridge an
    SDK client's cancellation does the same."""
    daemon = up(full_server(short_tmp, marks))
    # a progress line first, so the answer is a stream, then the client leaves
    _head, lines = stream_call(daemon, "full.count", {"n": 50, "pause_s": 0.1},
                              close_after=1)
    assert lines[0]["event"] == "progress"

    async def cancel_through_bridge() -> None:
        async with bridge(daemon.socket, "--expose", "direct") as session:
            call = asyncio.ensure_future(session.call_tool(
                "full.slow_write", {"key": "k1", "seconds": 30}))
            await asyncio.sleep(2)
            call.cancel()  # the SDK sends notifications/cancelled to the bridge
            with pytest.raises(asyncio.CancelledError):
                await call
            await asyncio.sleep(1)

    asyncio.run(cancel_through_bridge())
    daemon.wait_until(lambda: marks.exists() and "cancelled k1" in marks.read_text(),
                      timeout=20)
    assert "wrote k1" not in marks.read_text()
    assert daemon.call("GET", "/queue").body["jobs"] == []


def test_a_sampling_request_reaches_the_client_whose_call_made_it(
        up: Callable[..., DaemonProcess], short_tmp: Path, marks: Path) -> None:
    """The server's sampling request during a call is answered by that call's SDK
    client through the bridge; a caller with no stream, or one that cannot answer,
    gets a clear refusal (the server's tool fails with it), never another's answer."""
    import mcp_types as types

    daemon = up(full_server(short_tmp, marks))
    asked: list[str] = []

    async def sample(context: Any, params: types.CreateMessageRequestParams
                     ) -> types.CreateMessageResult:
        asked.append(params.messages[0].content.text)  # type: ignore[union-attr]
        return types.CreateMessageResult(role="assistant", model="test-model",
                                         content=types.TextContent(type="text", text="42"))

    async def through_bridge() -> Any:
        async with bridge(daemon.socket, "--expose", "direct",
                          sampling_callback=sample) as session:
            return await session.call_tool("full.ask_model", {"question": "six times seven?"})

    result = asyncio.run(through_bridge())
    assert result.is_error is False, result
    assert result.content[0].text == "the model said: 42"
    assert asked == ["six times seven?"]

    async def elicit(context: Any, params: Any) -> types.ElicitResult:
        assert params.message == "What is your name?"
        return types.ElicitResult(action="accept", content={"name": "Ada"})

    async def greeted() -> Any:
        async with bridge(daemon.socket, "--expose", "direct",
                          elicitation_callback=elicit) as session:
            return await session.call_tool("full.greet", {})

    greeting = asyncio.run(greeted())
    assert greeting.is_error is False, greeting
    assert greeting.content[0].text == "hello Ada"

    async def not_asked() -> Any:  # a client that declared no elicitation is never asked
        async with bridge(daemon.socket, "--expose", "direct") as session:
            return await session.call_tool("full.greet", {})

    refused = asyncio.run(not_asked())
    assert refused.is_error is True
    assert "cannot answer elicitation" in json.dumps(refused.model_dump(mode="json"))

    plain = daemon.call("POST", "/call/full.ask_model", {"question": "anyone?"})
    assert plain.body["status"] == "error_permanent", plain.body
    assert "opened no stream" in plain.body["message"]
    head, lines = stream_call(daemon, "full.ask_model", {"question": "anyone?"})
    assert "application/json" in head  # nothing streamed before it failed: a plain answer
    assert "cannot answer sampling" in lines[-1]["message"], lines


def test_a_sampling_request_is_answered_over_the_socket(
        up: Callable[..., DaemonProcess], short_tmp: Path, marks: Path) -> None:
    """Over the socket API a caller that says it answers sampling gets a request line and
    answers it on another connection; only its own uid and grant may."""
    daemon = up(full_server(short_tmp, marks))
    body = json.dumps({"question": "ping?"}).encode()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(60)
        sock.connect(str(daemon.socket))
        sock.sendall(
            b"POST /call/full.ask_model HTTP/1.1\r\nHost: capd\r\nAccept: application/x-ndjson"
            b"\r\nCapd-Answers: sampling\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        data = b""
        while b'"request"' not in dechunk(data.partition(b"\r\n\r\n")[2]):
            piece = sock.recv(65536)
            assert piece, data
            data += piece
        question = json.loads(dechunk(data.partition(b"\r\n\r\n")[2]).splitlines()[0])
        assert question["method"] == "sampling/createMessage"
        assert question["params"]["messages"][0]["content"]["text"] == "ping?"
        wrong = daemon.call("POST", "/calls/nope/answers/1", {"result": {}})
        assert wrong.status == 404
        answered = daemon.call("POST", question["answer"], {"result": {
            "role": "assistant", "model": "m", "content": {"type": "text", "text": "pong"}}})
        assert answered.status == 200, answered.body
        while not data.endswith(b"0\r\n\r\n"):
            piece = sock.recv(65536)
            if not piece:
                break
            data += piece
    last = json.loads(dechunk(data.partition(b"\r\n\r\n")[2]).splitlines()[-1])
    assert last["tool_result"]["result"] == {"result": "the model said: pong"}


def test_resources_and_prompts_are_served_under_the_prefix_and_the_grant(
        up: Callable[..., DaemonProcess], short_tmp: Path, marks: Path) -> None:
    """Resources (listed, templates, read as text and blob) and prompts (listed, got with
    arguments) over the socket API, the CLI and capd mcp; a profile that does not take
    the server in hides them as unknown."""
    daemon = up(full_server(short_tmp, marks) + """
[profiles.nothing]
capabilities = ["other.*"]
[[peers]]
gid = 4343
profile = "nothing"
""")
    listed = daemon.call("GET", "/resources").body
    uris = {r["uri"] for r in listed["resources"]}
    assert {"capd://full/memo://greeting", "capd://full/memo://logo"} <= uris
    assert [t["uriTemplate"] for t in listed["templates"]] == [
        "capd://full/memo://notes/{name}", "capd://full/memo://notes/private/{name}"]
    text = daemon.call("POST", "/resources/read", {"uri": "capd://full/memo://greeting"})
    assert text.status == 200, text.body
    assert text.body["contents"][0]["text"] == "hello from a resource"
    assert text.body["contents"][0]["uri"] == "capd://full/memo://greeting"
    templated = daemon.call("POST", "/resources/read", {"uri": "capd://full/memo://notes/a"})
    assert templated.body["contents"][0]["text"] == "note a"
    missing = daemon.call("POST", "/resources/read", {"uri": "capd://nowhere/x://y"})
    assert missing.status == 404
    assert "GET /resources" in missing.body["detail"]
    bad = daemon.call("POST", "/resources/read", {"uri": "capd://full/memo://absent"})
    assert bad.status == 502, bad.body
    prompts = daemon.call("GET", "/prompts").body["prompts"]
    assert [p["name"] for p in prompts] == ["full.review"]
    got = daemon.call("POST", "/prompts/full.review", {"code": "x = 1"})
    assert got.status == 200, got.body
    assert got.body["messages"][0]["content"]["text"] == "Please review: x = 1"
    not_text = daemon.call("POST", "/prompts/full.review", {"code": 1})
    assert (not_text.status, not_text.body["errors"][0]["loc"]) == (422, ["body", "code"])

    cli = subprocess.run([PY, "-m", "capd", "resources", "read", "capd://full/memo://logo",
                          "--output-dir", str(short_tmp / "out"), "--socket",
                          str(daemon.socket)], capture_output=True, text=True, timeout=60,
                         check=False)
    assert cli.returncode == 0, cli.stderr
    saved = list((short_tmp / "out").iterdir())
    assert [f.read_bytes() for f in saved] == [b"\x89PNG-not-really"]
    shown = subprocess.run([PY, "-m", "capd", "prompts", "get", "full.review", "-p", "code=y",
                            "--socket", str(daemon.socket)], capture_output=True, text=True,
                           timeout=60, check=False)
    assert shown.returncode == 0, shown.stderr
    assert "user: Please review: y" in shown.stdout

    hidden = subprocess.run(
        ["setpriv", "--groups=4343", "--", PY, "-m", "capd", "resources", "list", "--json",
         "--socket", str(daemon.socket)], capture_output=True, text=True, timeout=60,
        check=False)
    assert hidden.returncode == 0, hidden.stderr
    assert json.loads(hidden.stdout) == {"resources": [], "templates": []}
    refused = subprocess.run(
        ["setpriv", "--groups=4343", "--", PY, "-m", "capd", "prompts", "get", "full.review",
         "-p", "code=z", "--socket", str(daemon.socket)], capture_output=True, text=True,
        timeout=60, check=False)
    assert refused.returncode != 0
    assert "unknown prompt" in refused.stderr, refused.stderr

    def restricted_read(uri: str) -> str:
        done = subprocess.run(
            ["setpriv", "--groups=4343", "--", PY, "-m", "capd", "resources", "read", uri,
             "--socket", str(daemon.socket)], capture_output=True, text=True, timeout=60,
            check=False)
        assert done.returncode != 0
        return done.stderr.replace(uri, "URI")

    # a hidden server and no server at all answer alike: nothing to enumerate
    assert restricted_read("capd://full/memo://greeting") == \
        restricted_read("capd://nowhere/memo://greeting")
    dotted = daemon.call("POST", "/resources/read", {"uri": "capd://full/memo://notes/../x"})
    assert dotted.status == 400, dotted.body

    async def through_bridge() -> tuple[Any, Any, Any, Any]:
        async with bridge(daemon.socket) as session:
            resources = await session.list_resources()
            read = await session.read_resource("capd://full/memo://greeting")
            prompts = await session.list_prompts()
            got = await session.get_prompt("full.review", {"code": "z"})
            return resources, read, prompts, got

    resources, read, prompts, got = asyncio.run(through_bridge())
    assert "capd://full/memo://greeting" in {r.uri for r in resources.resources}
    assert read.contents[0].text == "hello from a resource"
    assert [p.name for p in prompts.prompts] == ["full.review"]
    assert got.messages[0].content.text == "Please review: z"


def test_a_write_past_its_timeout_is_cancelled_queued_and_lands_once(
        up: Callable[..., DaemonProcess], short_tmp: Path, marks: Path) -> None:
    """A write that outlives call_timeout_s is cancelled upstream (so it does not land
    later), answered transient and queued; its replay lands it, once."""
    daemon = up(full_server(short_tmp, marks, call_timeout_s=1, retry_policy="replay"))
    first = daemon.call("POST", "/call/full.slow_write", {"key": "k2", "seconds": 3})
    assert first.status == 202, first.body
    assert (first.body["status"], first.body["error_type"]) == ("error_transient", "transient")
    job = first.body["queued"]
    daemon.wait_until(lambda: daemon.call("GET", f"/queue/{job}").body["state"] == "done",
                      timeout=30)
    time.sleep(3.5)  # past the first attempt's own 3 s: had it not been cancelled, it lands now
    lines = marks.read_text().splitlines()
    assert lines.count("cancelled k2") == 1, lines
    assert lines.count("wrote k2") == 1, lines

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PY, "-m", "capd", "call", "full.slow_write", *args, "--socket",
                               str(daemon.socket)], capture_output=True, text=True,
                              timeout=90, check=False)

    queued = cli("-p", "key=k3", "-p", "seconds:=3")  # a queued write is not done: 75
    assert queued.returncode == 75, queued.stderr
    assert "queued as job" in queued.stderr
    waited = cli("-p", "key=k4", "-p", "seconds:=3", "--wait", "30")  # waits for its job
    assert waited.returncode == 0, waited.stderr
    assert "is done" in waited.stderr
    assert marks.read_text().splitlines().count("wrote k4") == 1


HTTP_BIG = '''
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("big")


@server.tool()
def big(n: int) -> str:
    """Answer n bytes of text."""
    return "a" * n


server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]),
           json_response=sys.argv[2] == "json")
'''


@pytest.mark.parametrize("mode", ["json", "sse"])
def test_a_streamable_http_answer_over_max_result_bytes_is_refused(
        up: Callable[..., DaemonProcess], short_tmp: Path, mode: str) -> None:
    """A streamable-HTTP server's answer past max_result_bytes (a JSON body or an SSE
    event) is error_permanent / result_too_large, the server stays up, and the next call
    is answered on the same session."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = short_tmp / "http_big.py"
    script.write_text(HTTP_BIG)
    server = subprocess.Popen([PY, str(script), str(port), mode], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as conn:
                if conn.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "the HTTP MCP server did not start"
            time.sleep(0.1)
        daemon = up(f"""
[tools.web_mcp]
kind = "mcp"
url = "http://127.0.0.1:{port}/mcp"
timeout_s = 30
max_result_bytes = 100000
""")
        small = daemon.call("POST", "/call/web_mcp.big", {"n": 10})
        assert small.status == 200, small.body
        large = daemon.call("POST", "/call/web_mcp.big", {"n": 200_000})
        assert large.status == 502, large.body
        assert large.body["error_type"] == "result_too_large", large.body
        assert "100000" in large.body["message"]
        again = daemon.call("POST", "/call/web_mcp.big", {"n": 11})
        assert again.status == 200, again.body
        assert caps(daemon)["web_mcp.big"]["state"] == "live"
    finally:
        server.kill()
        server.wait(timeout=10)


def caps(daemon: DaemonProcess) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in daemon.call("GET", "/capabilities").body["capabilities"]}


def test_a_resource_made_by_a_hidden_template_is_not_readable(
        up: Callable[..., DaemonProcess], short_tmp: Path, marks: Path) -> None:
    """With memo://notes/{name} inside a profile and memo://notes/private/{name} outside
    it, a bound caller reads notes but not memo://notes/private/payroll: templates are
    matched as templates, the most specific first; the operator reads both."""
    daemon = up(full_server(short_tmp, marks) + """
[profiles.notes]
capabilities = ["full.note"]
[[peers]]
gid = 4344
profile = "notes"
""")

    def bound_read(uri: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["setpriv", "--groups=4344", "--", PY, "-m", "capd", "resources", "read", uri,
             "--json", "--socket", str(daemon.socket)], capture_output=True, text=True,
            timeout=60, check=False)

    listed = subprocess.run(
        ["setpriv", "--groups=4344", "--", PY, "-m", "capd", "resources", "list", "--json",
         "--socket", str(daemon.socket)], capture_output=True, text=True, timeout=60,
        check=False)
    assert listed.returncode == 0, listed.stderr
    assert [t["name"] for t in json.loads(listed.stdout)["templates"]] == ["full.note"]
    allowed = bound_read("capd://full/memo://notes/groceries")
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["contents"][0]["text"] == "note groceries"
    private = bound_read("capd://full/memo://notes/private/payroll")
    assert private.returncode != 0
    assert "private payroll" not in private.stdout
    # hidden reads as unknown: the same answer as a server that does not exist
    nowhere = bound_read("capd://nowhere/memo://notes/private/payroll")
    assert private.stderr.replace("full", "X") == nowhere.stderr.replace("nowhere", "X")
    operator = daemon.call("POST", "/resources/read",
                           {"uri": "capd://full/memo://notes/private/payroll"})
    assert operator.body["contents"][0]["text"] == "private payroll"
    long = daemon.call("POST", "/resources/read",
                       {"uri": "capd://full/memo://notes/" + "a." * 30_000})
    assert long.status == 400
    assert "at most 1024 characters" in long.body["detail"]
