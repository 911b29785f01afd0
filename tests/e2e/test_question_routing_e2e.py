"""A server's question reaches the caller of the call it belongs to, or no one: through
the real daemon, real MCP servers over stdio and streamable HTTP, and callers who stream
and answer over the socket.

Over streamable HTTP the question comes on its call's own stream: with two answering
callers in flight, each gets only its own. Over stdio it names no call: a question while
another caller's call overlapped this one is refused, so a caller never answers (or
learns the text of) a question that was another's; one asked after its call ended is
refused on both transports.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import DaemonProcess, daemons_on
from tests.helpers.streams import dechunk
from tests.helpers.upstreams import stdio_tool, upstream_config

pytestmark = pytest.mark.slow  # the real daemon and real MCP servers

PY = sys.executable

SERVER = '''
import asyncio
import sys
from pathlib import Path

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("asker")
MARKS = Path(sys.argv[1])


def mark(line: str) -> None:
    with MARKS.open("a", encoding="utf-8") as out:
        out.write(line + "\\\\n")


async def ask(ctx: Context, question: str, related: bool) -> str:
    try:
        answer = await ctx.session.create_message(
            messages=[types.SamplingMessage(role="user", content=types.TextContent(
                type="text", text=question))], max_tokens=20,
            related_request_id=ctx.request_id if related else None)
    except Exception as exc:
        mark(f"refused {question}: {exc}")
        return f"refused: {exc}"
    mark(f"answered {question}: {answer.content.text}")
    return f"answered: {answer.content.text}"


@server.tool(annotations=types.ToolAnnotations(read_only_hint=True))
async def question(text: str, wait_s: float, ctx: Context) -> str:
    """Wait, then ask the client's model ``text`` (on this call's stream)."""
    await asyncio.sleep(wait_s)
    return await ask(ctx, text, True)


@server.tool(annotations=types.ToolAnnotations(read_only_hint=True))
async def later(text: str, run_s: float, ask_after_s: float, ctx: Context) -> str:
    """Run ``run_s``, answer, and ask ``text`` ``ask_after_s`` later (after the call)."""
    async def afterwards() -> None:
        await asyncio.sleep(ask_after_s)
        await ask(ctx, text, False)

    asyncio.get_running_loop().create_task(afterwards())
    await asyncio.sleep(run_s)
    return "done"


if len(sys.argv) > 2:
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
else:
    server.run("stdio")
'''


@pytest.fixture
def up(short_tmp: Path) -> Iterator[Callable[..., DaemonProcess]]:
    with daemons_on(short_tmp, upstream_config) as start:
        yield start


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def answering_call(daemon: DaemonProcess, name: str, params: dict[str, Any],
                   reply: str) -> dict[str, Any]:
    """A streamed call over the socket whose caller answers every sampling question with
    ``reply``; what it saw: its questions' texts and its final line."""
    body = json.dumps(params).encode()
    seen: list[str] = []
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(60)
        sock.connect(str(daemon.socket))
        sock.sendall(
            b"POST /call/" + name.encode() + b" HTTP/1.1\r\nHost: capd\r\n"
            b"Accept: application/x-ndjson\r\nCapd-Answers: sampling\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (len(body), body))
        data = b""
        answered = 0
        while True:
            piece = sock.recv(65536)
            if not piece:
                break
            data += piece
            lines = [json.loads(x) for x in
                     dechunk(data.partition(b"\r\n\r\n")[2]).splitlines() if x]
            for line in [x for x in lines if "answer" in x][answered:]:
                answered += 1
                seen.append(line["params"]["messages"][0]["content"]["text"])
                daemon.call("POST", line["answer"], {"result": {
                    "role": "assistant", "model": "m",
                    "content": {"type": "text", "text": reply}}})
    lines = [json.loads(x) for x in dechunk(data.partition(b"\r\n\r\n")[2]).splitlines() if x]
    return {"questions": seen, "last": lines[-1] if lines else None}


def in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(work()), daemon=True)
    thread.start()
    return thread, out


def wait_for(path: Path, text: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {path}: {path.read_text() if path.exists() else ''}")


def test_over_stdio_a_question_during_another_callers_call_goes_to_no_one(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """The operator's call (no stream) asks after it ended, while an agent's answering
    call that overlapped it is in flight: refused; the agent never sees the question."""
    marks = short_tmp / "marks.log"
    daemon = up(stdio_tool(short_tmp, "asker", SERVER, str(marks)))
    root, _ = in_thread(lambda: daemon.call("POST", "/call/asker.later", {
        "text": "root's secret", "run_s": 3.0, "ask_after_s": 3.5}))
    time.sleep(0.5)  # the agent's call starts while root's is in flight (for 2.5 s more)
    agent, seen = in_thread(lambda: answering_call(daemon, "asker.question", {
        "text": "agent's own", "wait_s": 5.0}, "agent answer"))
    root.join(30)
    log = wait_for(marks, "root's secret")
    assert "refused root's secret" in log
    agent.join(60)
    assert "root's secret" not in seen[0]["questions"]
    # its own question, asked after the other call ended, is refused too: over stdio
    # capd cannot tell it from the other's (it was overlapped)
    assert "refused agent's own" in wait_for(marks, "agent's own")


def test_over_stdio_a_lone_call_still_gets_its_question(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """No other call beside it: the question is the call's, and its caller answers."""
    marks = short_tmp / "marks.log"
    daemon = up(stdio_tool(short_tmp, "asker", SERVER, str(marks)))
    seen = answering_call(daemon, "asker.question", {"text": "mine", "wait_s": 0.1}, "yes")
    assert seen["questions"] == ["mine"]
    assert "answered mine: yes" in wait_for(marks, "mine")


def test_over_http_each_question_goes_to_the_call_it_came_with(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """Two answering callers in flight on one streamable-HTTP server: each question comes
    on its own call's stream and reaches that call's caller only; a question asked after
    its call ended is refused."""
    marks = short_tmp / "marks.log"
    script = short_tmp / "asker.py"
    script.write_text(SERVER)
    port = _free_port()
    server = subprocess.Popen([PY, str(script), str(marks), str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as conn:
                if conn.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "the HTTP MCP server did not start"
            time.sleep(0.1)
        daemon = up(f"""
[tools.asker]
kind = "mcp"
url = "http://127.0.0.1:{port}/mcp"
timeout_s = 30
""")
        first, one = in_thread(lambda: answering_call(daemon, "asker.question", {
            "text": "for the first", "wait_s": 1.0}, "first answer"))
        second, two = in_thread(lambda: answering_call(daemon, "asker.question", {
            "text": "for the second", "wait_s": 1.2}, "second answer"))
        first.join(60)
        second.join(60)
        assert one[0]["questions"] == ["for the first"]
        assert two[0]["questions"] == ["for the second"]
        log = wait_for(marks, "for the second")
        assert "answered for the first: first answer" in log
        assert "answered for the second: second answer" in log
        after = answering_call(daemon, "asker.later", {
            "text": "too late", "run_s": 0.1, "ask_after_s": 0.5}, "nobody")
        assert after["questions"] == []
        assert "refused too late" in wait_for(marks, "too late")
    finally:
        server.kill()
        server.wait(timeout=10)
