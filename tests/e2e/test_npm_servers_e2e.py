"""capd in front of the real npm reference MCP servers — server-everything, server-memory
and server-filesystem, pinned in tests/npm/package-lock.json and installed there by
.ci/deps — through the real daemon's socket API and `capd mcp` with the SDK client; and
the MCP Inspector CLI (pinned alongside) speaking to `capd mcp`."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from capd.sidecar.client._client import Response
from tests.helpers.bridge import bridge
from tests.helpers.daemon import DaemonProcess, daemons_on
from tests.helpers.servers import TESTS
from tests.helpers.streams import stream_call
from tests.helpers.upstreams import upstream_config

PY = sys.executable
NPM = TESTS / "npm"
SCOPE = NPM / "node_modules" / "@modelcontextprotocol"
NODE = shutil.which("node")
SERVERS = ("server-everything", "server-memory", "server-filesystem")
INSPECTOR = "inspector"


def why_absent() -> str | None:
    """Why these tests cannot run on this machine, or None when they can."""
    if NODE is None:
        return "node is not on PATH (.ci/deps installs Debian nodejs and npm when run as root)"
    for package in (*SERVERS, INSPECTOR):
        if not (SCOPE / package / "package.json").is_file():
            return (f"@modelcontextprotocol/{package} is not installed in tests/npm "
                    "(.ci/deps runs npm ci there)")
    return None


ABSENT = why_absent()
pytestmark = [
    pytest.mark.slow,  # the real daemon, real node MCP servers, the bridge and the Inspector
    pytest.mark.skipif(ABSENT is not None, reason=ABSENT or ""),
]

TINY_PNG_HEAD = b"\x89PNG\r\n\x1a\n"
# the meta tools every bridge lists, whatever else its tool set adds
FRONT_DOOR = {"search_capabilities", "get_capability", "invoke_capability"}
PROMPTS = ["everything.simple-prompt", "everything.args-prompt",
           "everything.completable-prompt", "everything.resource-prompt"]


def entry_point(package: str) -> Path:
    """The script the package's ``bin`` names (each package here names one)."""
    meta = json.loads((SCOPE / package / "package.json").read_text())
    found = meta["bin"]
    script = found if isinstance(found, str) else next(iter(found.values()))
    return SCOPE / package / script


def npm_tool(tool: str, package: str, *args: str, env: dict[str, str] | None = None,
             **settings: object) -> str:
    """The ``[tools.<tool>]`` table that runs the npm server ``package`` under node
    (``timeout_s`` 30 unless ``settings`` say otherwise)."""
    argv = json.dumps([NODE, str(entry_point(package)), *args])
    lines = [f"[tools.{tool}]", 'kind = "mcp"', f"command = {argv}",
             *(f"{key} = {json.dumps(value)}"
               for key, value in {"timeout_s": 30, **settings}.items())]
    if env:
        pairs = ", ".join(f"{key} = {json.dumps(value)}" for key, value in env.items())
        lines.append(f"env = {{ {pairs} }}")
    return "\n" + "\n".join(lines) + "\n"


@pytest.fixture
def up(short_tmp: Path) -> Iterator[Callable[..., DaemonProcess]]:
    with daemons_on(short_tmp, upstream_config) as start:
        yield start


@pytest.fixture
def everything(up: Callable[..., DaemonProcess]) -> DaemonProcess:
    """The daemon with server-everything as the tool ``everything``."""
    return up(npm_tool("everything", "server-everything"))


def call(daemon: DaemonProcess, capability: str, params: dict[str, Any]) -> Response:
    return daemon.call("POST", f"/call/{capability}", params)


def descendants(root: int) -> list[tuple[int, list[bytes]]]:
    """Every process under ``root`` (children, grandchildren …) with its argv."""
    children: dict[int, list[tuple[int, list[bytes]]]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # it exited while we looked
        ppid = int(next(line.split()[1] for line in status.splitlines()
                        if line.startswith("PPid:")))
        children.setdefault(ppid, []).append((int(proc.name), argv))
    found: list[tuple[int, list[bytes]]] = []
    todo = [root]
    while todo:
        for pid, argv in children.get(todo.pop(), []):
            found.append((pid, argv))
            todo.append(pid)
    return found


def node_pid(daemon: DaemonProcess, package: str) -> int:
    """The pid of the node process running ``package`` under the daemon (behind capd's
    relay script, so a grandchild)."""
    assert daemon.proc is not None
    script = str(entry_point(package)).encode()
    nodes = [pid for pid, argv in descendants(daemon.proc.pid)
             if argv[0] == (NODE or "").encode() and script in argv]
    assert len(nodes) == 1, nodes
    return nodes[0]


def only(blocks: list[Any], kind: type[Any]) -> list[Any]:
    return [block for block in blocks if isinstance(block, kind)]


def test_the_installed_packages_are_the_pinned_ones() -> None:
    """tests/npm/node_modules holds exactly the versions package.json pins (a stale
    install would test other servers than the ones named here)."""
    pinned = json.loads((NPM / "package.json").read_text())["dependencies"]
    locked = json.loads((NPM / "package-lock.json").read_text())["packages"]
    assert locked[""]["dependencies"] == pinned
    for name, version in pinned.items():
        installed = json.loads((NPM / "node_modules" / name / "package.json").read_text())
        assert installed["version"] == version, name


def test_every_content_type_reaches_the_socket_api(everything: DaemonProcess) -> None:
    """An image (base64 and its MIME type), embedded text and blob resources, resource
    links, annotated text and structured content come in `content` as the server sent
    them; `result` is the structured content, else the text."""
    image = call(everything, "everything.get_tiny_image", {})
    assert image.status == 200, image.body
    assert [b["type"] for b in image.body["content"]] == ["text", "image", "text"]
    picture = image.body["content"][1]
    assert picture["mimeType"] == "image/png"
    assert base64.b64decode(picture["data"]).startswith(TINY_PNG_HEAD)
    assert image.body["result"] == ("Here's the image you requested:\n"
                                    "The image above is the MCP logo.")

    text = call(everything, "everything.get_resource_reference",
                {"resourceType": "Text", "resourceId": 2})
    assert [b["type"] for b in text.body["content"]] == ["text", "resource", "text"]
    embedded = text.body["content"][1]["resource"]
    assert embedded["uri"] == "demo://resource/dynamic/text/2"  # the server's own uri
    assert embedded["text"].startswith("Resource 2: This is a plaintext resource")
    blob = call(everything, "everything.get_resource_reference",
                {"resourceType": "Blob", "resourceId": 3})
    embedded = blob.body["content"][1]["resource"]
    assert embedded["uri"] == "demo://resource/dynamic/blob/3"
    assert base64.b64decode(embedded["blob"]).startswith(b"Resource 3: This is a base64 blob")

    links = call(everything, "everything.get_resource_links", {"count": 2})
    assert [b["type"] for b in links.body["content"]] == [
        "text", "resource_link", "resource_link"]
    assert [(b["uri"], b["name"]) for b in links.body["content"][1:]] == [
        ("demo://resource/dynamic/blob/1", "Blob Resource 1"),
        ("demo://resource/dynamic/text/2", "Text Resource 2")]

    echo = call(everything, "everything.echo", {"message": "hi"})
    assert (echo.body["result"], echo.body["content"]) == (
        "Echo: hi", [{"type": "text", "text": "Echo: hi"}])
    annotated = call(everything, "everything.get_annotated_message",
                     {"messageType": "success", "includeImage": True})
    assert annotated.body["content"][0]["annotations"] == {"audience": ["user"],
                                                           "priority": 0.7}
    assert [b["type"] for b in annotated.body["content"]] == ["text", "image"]
    weather = call(everything, "everything.get_structured_content", {"location": "Chicago"})
    assert set(weather.body["structured_content"]) == {"temperature", "conditions",
                                                       "humidity"}
    assert weather.body["result"] == weather.body["structured_content"]

    bad = call(everything, "everything.get_sum", {"a": "two", "b": 3})
    assert bad.status == 422  # checked against the server's schema before it is called
    assert "'two' is not of type 'number'" in bad.body["detail"]


def test_every_content_type_reaches_an_sdk_client_through_capd_mcp(
        everything: DaemonProcess) -> None:
    """Through `capd mcp --expose direct` each tool answers the server's blocks as they
    came (image data and MIME type, embedded resources, resource links, annotations,
    structured content) with capd's facts under _meta.capd; invoke_capability answers
    the ToolResult and then the server's image block."""

    async def through_bridge() -> dict[str, types.CallToolResult]:
        async with bridge(everything.socket, "--expose", "direct") as session:
            listed = {tool.name: tool for tool in (await session.list_tools()).tools}
            assert listed["everything.get_tiny_image"].annotations is not None
            assert listed["everything.get_tiny_image"].annotations.read_only_hint is True
            return {
                "image": await session.call_tool("everything.get_tiny_image", {}),
                "text": await session.call_tool("everything.get_resource_reference",
                                                {"resourceType": "Text", "resourceId": 2}),
                "blob": await session.call_tool("everything.get_resource_reference",
                                                {"resourceType": "Blob", "resourceId": 3}),
                "links": await session.call_tool("everything.get_resource_links",
                                                 {"count": 2}),
                "annotated": await session.call_tool(
                    "everything.get_annotated_message",
                    {"messageType": "error", "includeImage": False}),
                "weather": await session.call_tool("everything.get_structured_content",
                                                   {"location": "New York"}),
                "invoked": await session.call_tool(
                    "invoke_capability", {"id": "everything.get_tiny_image",
                                          "arguments": {}}),
            }

    got = asyncio.run(through_bridge())
    assert all(result.is_error is False for result in got.values()), got
    image = got["image"]
    assert [block.type for block in image.content] == ["text", "image", "text"]
    [picture] = only(image.content, types.ImageContent)
    assert picture.mime_type == "image/png"
    assert base64.b64decode(picture.data).startswith(TINY_PNG_HEAD)
    assert image.meta is not None
    assert image.meta["capd"]["status"] == "success"

    [text] = only(got["text"].content, types.EmbeddedResource)
    assert isinstance(text.resource, types.TextResourceContents)
    assert text.resource.uri == "demo://resource/dynamic/text/2"
    assert text.resource.text.startswith("Resource 2: This is a plaintext resource")
    [blob] = only(got["blob"].content, types.EmbeddedResource)
    assert isinstance(blob.resource, types.BlobResourceContents)
    assert base64.b64decode(blob.resource.blob).startswith(b"Resource 3: This is a base64")

    links = only(got["links"].content, types.ResourceLink)
    assert [(link.uri, link.mime_type) for link in links] == [
        ("demo://resource/dynamic/blob/1", "text/plain"),
        ("demo://resource/dynamic/text/2", "text/plain")]

    [annotated] = only(got["annotated"].content, types.TextContent)
    assert annotated.annotations is not None
    assert annotated.annotations.audience == ["user", "assistant"]
    assert got["weather"].structured_content is not None
    assert set(got["weather"].structured_content) == {"temperature", "conditions",
                                                      "humidity"}

    invoked = got["invoked"]
    assert [block.type for block in invoked.content] == ["text", "image"]
    assert isinstance(invoked.content[0], types.TextContent)
    answer = json.loads(invoked.content[0].text)
    assert answer["status"] == "success"
    # the ToolResult names the image's size instead of carrying its base64 twice
    assert answer["content"][1]["data"].endswith("bytes, in the block that follows>")
    [relayed] = only(invoked.content, types.ImageContent)
    assert relayed.data == picture.data


def test_progress_of_a_long_operation_streams_and_reaches_an_sdk_client(
        everything: DaemonProcess) -> None:
    """The long-running operation's progress notifications stream as NDJSON lines
    before its result, and reach the SDK client's progress callback through the bridge,
    each step's progress and total as the server sent them."""
    head, lines = stream_call(everything, "everything.trigger_long_running_operation",
                              {"duration": 0.6, "steps": 3})
    assert head.startswith("HTTP/1.1 200"), head
    assert "application/x-ndjson" in head
    assert [line["event"] for line in lines] == ["progress"] * 3 + ["result"]
    assert [(line["progress"], line["total"]) for line in lines[:3]] == [
        (1, 3), (2, 3), (3, 3)]
    assert lines[-1]["http_status"] == 200
    assert lines[-1]["tool_result"]["result"] == (
        "Long running operation completed. Duration: 0.6 seconds, Steps: 3.")

    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async def through_bridge() -> types.CallToolResult:
        async with bridge(everything.socket, "--expose", "direct") as session:
            return await session.call_tool("everything.trigger_long_running_operation",
                                           {"duration": 0.8, "steps": 4},
                                           progress_callback=on_progress)

    result = asyncio.run(through_bridge())
    assert result.is_error is False, result
    assert isinstance(result.content[0], types.TextContent)
    assert result.content[0].text == (
        "Long running operation completed. Duration: 0.8 seconds, Steps: 4.")
    # server-everything sends no progress message
    assert seen == [(1, 4, None), (2, 4, None), (3, 4, None), (4, 4, None)]


def test_a_cancelled_long_call_leaves_the_daemon_serving(everything: DaemonProcess) -> None:
    """An SDK client cancelling a long call through the bridge, and a socket client that
    closes its stream mid-call, end the call in capd at once (nothing left in flight,
    long before the server's operation would end); the same session's next call works."""
    # server-everything's long operation ignores its abort signal (its SDK only withholds
    # the answer), so the server shows no sign of the cancellation; what is observable is
    # capd's side: the call is no longer in flight, and calls still work.
    def in_flight() -> int:
        return int(everything.call("GET", "/status").body["calls"]["in_flight"])

    _head, lines = stream_call(everything, "everything.trigger_long_running_operation",
                              {"duration": 30, "steps": 60}, close_after=1)
    assert lines[0]["event"] == "progress"
    everything.wait_until(lambda: in_flight() == 0, timeout=10)

    async def cancel_through_bridge() -> types.CallToolResult:
        started = asyncio.Event()

        async def on_progress(progress: float, total: float | None,
                              message: str | None) -> None:
            started.set()

        async with bridge(everything.socket, "--expose", "direct") as session:
            long_call = asyncio.ensure_future(session.call_tool(
                "everything.trigger_long_running_operation", {"duration": 30, "steps": 60},
                progress_callback=on_progress))
            async with asyncio.timeout(20):
                await started.wait()
            assert await asyncio.to_thread(in_flight) == 1
            long_call.cancel()  # the SDK sends notifications/cancelled to the bridge
            with pytest.raises(asyncio.CancelledError):
                await long_call
            await asyncio.to_thread(everything.wait_until, lambda: in_flight() == 0, 10)
            return await session.call_tool("everything.echo", {"message": "still here"})

    after = asyncio.run(cancel_through_bridge())
    assert after.is_error is False, after
    assert isinstance(after.content[0], types.TextContent)
    assert after.content[0].text == "Echo: still here"
    assert everything.call("GET", "/health").body["status"] == "pass"
    assert everything.call("GET", "/queue").body["jobs"] == []
    # the server is still running both cancelled operations: the daemon stops it anyway
    assert everything.stop() == 0


def test_a_call_its_client_left_is_still_logged_as_a_call(everything: DaemonProcess) -> None:
    """A call ended because its client closed the stream still makes its one `call` log
    event."""
    _head, lines = stream_call(everything, "everything.trigger_long_running_operation",
                              {"duration": 30, "steps": 60}, close_after=1)
    assert lines[0]["event"] == "progress"
    try:
        logged = everything.wait_event("call", timeout=5, where=lambda event: event.get(
            "capability") == "everything.trigger_long_running_operation")
        assert (logged["status"], logged["error_type"]) == ("error_transient", "cancelled")
        assert logged["queued"] is None  # the caller chose to stop it: nothing is queued
    finally:  # the server still runs the operation: the daemon stops it
        everything.stop()


def test_a_sampling_request_is_answered_by_the_sdk_client_through_capd_mcp(
        everything: DaemonProcess) -> None:
    """server-everything offers its sampling tool (capd declares sampling to it); the
    request it makes during the call reaches the SDK client's sampling callback through
    the bridge, and the client's answer comes back in the tool's result."""
    asked: list[str] = []

    async def sample(context: Any, params: types.CreateMessageRequestParams
                     ) -> types.CreateMessageResult:
        content = params.messages[0].content
        assert isinstance(content, types.TextContent)
        asked.append(content.text)
        return types.CreateMessageResult(role="assistant", model="test-model",
                                         content=types.TextContent(type="text",
                                                                   text="forty-two"))

    async def through_bridge() -> types.CallToolResult:
        async with bridge(everything.socket, "--expose", "direct",
                          sampling_callback=sample) as session:
            return await session.call_tool("everything.trigger_sampling_request",
                                           {"prompt": "six times seven?", "maxTokens": 5})

    result = asyncio.run(through_bridge())
    assert result.is_error is False, result
    assert asked == ["Resource trigger-sampling-request context: six times seven?"]
    assert isinstance(result.content[0], types.TextContent)
    answer = result.content[0].text
    assert answer.startswith("LLM sampling result:")
    assert json.loads(answer.partition("\n")[2]) == {
        "model": "test-model", "role": "assistant",
        "content": {"type": "text", "text": "forty-two"}}


def test_a_sampling_request_nobody_can_answer_is_refused_with_why(
        everything: DaemonProcess) -> None:
    """A caller with no stream, or an SDK client with no sampling callback, gets the
    call failed permanently with the reason; the daemon goes on serving."""
    plain = call(everything, "everything.trigger_sampling_request", {"prompt": "anyone?"})
    assert plain.status == 502, plain.body
    assert plain.body["status"] == "error_permanent"
    assert "opened no stream" in plain.body["message"]
    assert plain.body["queued"] is None  # a refusal is not a failure to retry

    async def through_bridge() -> types.CallToolResult:
        async with bridge(everything.socket, "--expose", "direct") as session:
            return await session.call_tool("everything.trigger_sampling_request",
                                           {"prompt": "anyone?"})

    result = asyncio.run(through_bridge())
    assert result.is_error is True
    assert isinstance(result.content[0], types.TextContent)
    # the server's own error answer, as it came, with capd's facts beside it
    assert "cannot answer sampling" in result.content[0].text
    assert result.meta is not None
    assert result.meta["capd"]["status"] == "error_permanent"
    assert call(everything, "everything.echo", {"message": "ok"}).status == 200


def test_resources_templates_and_prompts_over_the_socket_api(
        everything: DaemonProcess) -> None:
    """The server's resources and templates are listed under capd://everything/, read as
    text (a document, a templated resource) and as a blob; its prompts are listed under
    everything. and got with arguments, an embedded resource kept."""
    listed = everything.call("GET", "/resources").body
    uris = [r["uri"] for r in listed["resources"]]
    doc = "capd://everything/demo://resource/static/document/features.md"
    assert doc in uris
    assert all(uri.startswith("capd://everything/demo://resource/static/document/")
               for uri in uris), uris
    assert [(t["uriTemplate"], t["mimeType"]) for t in listed["templates"]] == [
        ("capd://everything/demo://resource/dynamic/text/{resourceId}", "text/plain"),
        ("capd://everything/demo://resource/dynamic/blob/{resourceId}",
         "application/octet-stream")]

    text = everything.call("POST", "/resources/read", {"uri": doc})
    assert text.status == 200, text.body
    [content] = text.body["contents"]
    assert (content["uri"], content["mimeType"]) == (doc, "text/markdown")
    assert content["text"].startswith("# Everything Server - Features")
    templated = everything.call(
        "POST", "/resources/read",
        {"uri": "capd://everything/demo://resource/dynamic/text/3"}).body["contents"][0]
    assert templated["text"].startswith("Resource 3: This is a plaintext resource")
    blob = everything.call("POST", "/resources/read",
                           {"uri": "capd://everything/demo://resource/dynamic/blob/4"})
    assert blob.status == 200, blob.body
    [content] = blob.body["contents"]
    assert content["uri"] == "capd://everything/demo://resource/dynamic/blob/4"
    assert base64.b64decode(content["blob"]).startswith(b"Resource 4: This is a base64 blob")

    prompts = everything.call("GET", "/prompts").body["prompts"]
    assert [p["name"] for p in prompts] == PROMPTS
    args = next(p for p in prompts if p["name"] == "everything.args-prompt")["arguments"]
    assert [(a["name"], a["required"]) for a in args] == [("city", True), ("state", False)]
    got = everything.call("POST", "/prompts/everything.args-prompt",
                          {"city": "Paris", "state": "TX"})
    assert got.status == 200, got.body
    assert got.body["messages"] == [{"role": "user", "content": {
        "type": "text", "text": "What's weather in Paris, TX?"}}]
    embedded = everything.call("POST", "/prompts/everything.resource-prompt",
                               {"resourceType": "Text", "resourceId": "2"})
    assert embedded.status == 200, embedded.body
    [intro, attached] = embedded.body["messages"]
    assert "Text resource with id: 2" in intro["content"]["text"]
    assert attached["content"]["type"] == "resource"
    assert attached["content"]["resource"]["uri"] == "demo://resource/dynamic/text/2"


def test_resource_and_prompt_refusals_are_answers_not_failures(
        everything: DaemonProcess) -> None:
    """A prompt missing its required argument and a resource the server does not have
    are the server's refusals (502, its reason); a uri outside capd's is a 404 that says
    how to list them; a non-string argument is 400; the daemon goes on serving."""
    missing = everything.call("POST", "/prompts/everything.args-prompt", {})
    assert missing.status == 502, missing.body
    assert "city" in missing.body["detail"]
    assert everything.call("POST", "/prompts/everything.args-prompt",
                           {"city": 7}).status == 422
    absent = everything.call("POST", "/resources/read",
                             {"uri": "capd://everything/demo://resource/dynamic/text/abc"})
    assert absent.status == 502, absent.body
    assert "Unknown resource" in absent.body["detail"]
    raw = everything.call("POST", "/resources/read", {"uri": "demo://resource/dynamic/text/1"})
    assert raw.status == 404
    assert "GET /resources" in raw.body["detail"]
    assert everything.call("GET", "/health").body["status"] == "pass"


def test_resources_templates_and_prompts_reach_an_sdk_client_through_capd_mcp(
        everything: DaemonProcess) -> None:
    """Through `capd mcp` the SDK client lists the server's resources and templates, reads
    a text and a blob resource, lists the prompts and gets one with arguments."""

    async def through_bridge() -> tuple[Any, ...]:
        async with bridge(everything.socket) as session:
            return (await session.list_resources(),
                    await session.list_resource_templates(),
                    await session.read_resource(
                        "capd://everything/demo://resource/static/document/features.md"),
                    await session.read_resource(
                        "capd://everything/demo://resource/dynamic/blob/1"),
                    await session.list_prompts(),
                    await session.get_prompt("everything.args-prompt", {"city": "Oslo"}))

    resources, templates, text, blob, prompts, prompt = asyncio.run(through_bridge())
    assert "capd://everything/demo://resource/static/document/features.md" in {
        r.uri for r in resources.resources}
    assert [t.uri_template for t in templates.resource_templates] == [
        "capd://everything/demo://resource/dynamic/text/{resourceId}",
        "capd://everything/demo://resource/dynamic/blob/{resourceId}"]
    [document] = text.contents
    assert isinstance(document, types.TextResourceContents)
    assert document.text.startswith("# Everything Server - Features")
    [data] = blob.contents
    assert isinstance(data, types.BlobResourceContents)
    assert base64.b64decode(data.blob).startswith(b"Resource 1: This is a base64 blob")
    assert [p.name for p in prompts.prompts] == PROMPTS
    [message] = prompt.messages
    assert isinstance(message.content, types.TextContent)
    assert message.content.text == "What's weather in Oslo?"


def test_server_memory_keeps_what_is_written_through_capd(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """server-memory (its file set by env through capd's config): entities and a relation
    written through capd are read back by read_graph, search_nodes and its knowledge-graph
    resource, and land in the file; its writes are mutating capabilities, its reads not."""
    memory_file = short_tmp / "memory.jsonl"
    daemon = up(npm_tool("memory", "server-memory",
                         env={"MEMORY_FILE_PATH": str(memory_file)}))
    assert daemon.call("GET", "/capabilities/memory.create_entities").body[
        "mutates_state"] is True
    assert daemon.call("GET", "/capabilities/memory.read_graph").body[
        "mutates_state"] is False
    entities = [{"name": "capd", "entityType": "daemon", "observations": ["a sidecar"]},
                {"name": "npm", "entityType": "registry", "observations": ["serves node"]}]
    created = call(daemon, "memory.create_entities", {"entities": entities})
    assert created.status == 200, created.body
    assert created.body["result"] == {"entities": entities}
    related = call(daemon, "memory.create_relations", {"relations": [
        {"from": "capd", "to": "npm", "relationType": "is tested with"}]})
    assert related.status == 200, related.body

    graph = call(daemon, "memory.read_graph", {})
    assert graph.status == 200, graph.body
    assert graph.body["result"] == {"entities": entities, "relations": [
        {"from": "capd", "to": "npm", "relationType": "is tested with"}]}
    found = call(daemon, "memory.search_nodes", {"query": "sidecar"})
    assert [e["name"] for e in found.body["result"]["entities"]] == ["capd"]
    resource = daemon.call("POST", "/resources/read",
                           {"uri": "capd://memory/memory://knowledge-graph"})
    assert resource.status == 200, resource.body
    assert "a sidecar" in resource.body["contents"][0]["text"]
    stored = [json.loads(line) for line in memory_file.read_text().splitlines()]
    assert {(row["type"], row.get("name")) for row in stored} >= {
        ("entity", "capd"), ("entity", "npm"), ("relation", None)}


def test_server_filesystem_writes_and_reads_inside_its_directory_only(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """server-filesystem with one allowed directory: write_file then read_text_file round
    trip through capd; a read or write outside it (directly or by ..) is the server's
    refusal, error_permanent and never queued, and the daemon goes on serving."""
    allowed = short_tmp / "allowed"
    allowed.mkdir()
    outside = short_tmp / "outside.txt"
    outside.write_text("not yours")
    daemon = up(npm_tool("files", "server-filesystem", str(allowed)))
    listed = call(daemon, "files.list_allowed_directories", {})
    assert str(allowed.resolve()) in listed.body["result"]["content"]

    note = allowed / "note.txt"
    written = call(daemon, "files.write_file", {"path": str(note), "content": "hello npm\n"})
    assert written.status == 200, written.body
    assert note.read_text() == "hello npm\n"
    read = call(daemon, "files.read_text_file", {"path": str(note)})
    assert read.status == 200, read.body
    assert read.body["result"] == {"content": "hello npm\n"}

    for path in (str(outside), f"{allowed}/../outside.txt"):
        refused = call(daemon, "files.read_text_file", {"path": path})
        assert refused.status == 502, refused.body
        assert (refused.body["status"], refused.body["error_type"]) == (
            "error_permanent", "permanent")
        assert "Access denied - path outside allowed directories" in refused.body["message"]
    stray = short_tmp / "stray.txt"
    refused = call(daemon, "files.write_file", {"path": str(stray), "content": "x"})
    assert refused.status == 502, refused.body
    assert refused.body["queued"] is None
    assert not stray.exists()
    assert daemon.call("GET", "/queue").body["jobs"] == []
    assert daemon.call("GET", "/health").body["status"] == "pass"
    again = call(daemon, "files.read_text_file", {"path": str(note), "head": 1})
    assert again.body["result"] == {"content": "hello npm"}


def test_an_error_answer_keeps_the_servers_content_blocks(
        up: Callable[..., DaemonProcess], short_tmp: Path) -> None:
    """A server's error answer comes with its content blocks as the server sent them."""
    allowed = short_tmp / "allowed"
    allowed.mkdir()
    daemon = up(npm_tool("files", "server-filesystem", str(allowed)))
    refused = call(daemon, "files.read_text_file", {"path": str(short_tmp / "capd.toml")})
    assert refused.body["status"] == "error_permanent", refused.body
    assert refused.body["content"] == [{"type": "text", "text": refused.body["message"]}]


def test_a_killed_node_server_fails_its_call_and_heals_by_itself(
        everything: DaemonProcess) -> None:
    """kill -9 of the node process (behind capd's relay) fails the call in flight as
    transient / tool_unavailable; a later call succeeds on a new process, with no
    reload."""
    first = node_pid(everything, "server-everything")
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(call, everything, "everything.trigger_long_running_operation",
                              {"duration": 20, "steps": 20})
        everything.wait_until(
            lambda: everything.call("GET", "/status").body["calls"]["in_flight"] == 1)
        os.kill(first, signal.SIGKILL)
        failed = pending.result(timeout=30)
    assert failed.status == 503, failed.body
    assert (failed.body["status"], failed.body["error_type"]) == (
        "error_transient", "tool_unavailable")
    assert "everything" in failed.body["message"]

    answers: list[Response] = []

    def answered() -> bool:
        answers.append(call(everything, "everything.echo", {"message": "back"}))
        return answers[-1].status == 200

    everything.wait_until(answered, timeout=30)
    assert answers[-1].body["result"] == "Echo: back"
    assert node_pid(everything, "server-everything") != first
    assert everything.call("GET", "/status").body["reload"]["count"] == 0


def inspect(daemon: DaemonProcess, *args: str, direct: bool = False) -> Any:
    """Run the MCP Inspector CLI against `capd mcp` on the daemon's socket; its JSON."""
    assert NODE is not None
    bridge_argv = [PY, "-m", "capd", "mcp", "--socket", str(daemon.socket)]
    if direct:
        bridge_argv += ["--expose", "direct"]
    # the Inspector's launcher starts its CLI as `node`, found on PATH
    env = {**os.environ, "PATH": f"{Path(NODE).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([NODE, str(entry_point(INSPECTOR)), "--cli", *bridge_argv, *args],
                          capture_output=True, text=True, timeout=60, check=False, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_mcp_inspector_cli_lists_and_calls_through_capd_mcp(
        everything: DaemonProcess) -> None:
    """The Inspector CLI, a client capd does not control, speaks to `capd mcp`: meta mode
    lists the meta tools and invokes a capability; `--expose direct` lists every live
    capability and calls one with --tool-arg (converted by the tool's schema); an unknown
    tool is an error result, not a crash; resources are listed."""
    meta = {tool["name"] for tool in inspect(everything, "--method", "tools/list")["tools"]}
    assert meta >= FRONT_DOOR
    assert not any(name.startswith("everything.") for name in meta), meta
    invoked = inspect(everything, "--method", "tools/call", "--tool-name", "invoke_capability",
                      "--tool-arg", "id=everything.echo", 'arguments={"message": "hi"}')
    assert invoked["structuredContent"]["status"] == "success"
    assert invoked["structuredContent"]["result"] == "Echo: hi"

    direct = inspect(everything, "--method", "tools/list", direct=True)
    names = {tool["name"] for tool in direct["tools"]}
    assert {"everything.get_sum", "everything.get_tiny_image"} <= names
    assert names >= FRONT_DOOR
    summed = inspect(everything, "--method", "tools/call", "--tool-name", "everything.get_sum",
                     "--tool-arg", "a=2", "b=3", direct=True)
    assert summed["isError"] is False
    assert summed["content"] == [{"type": "text", "text": "The sum of 2 and 3 is 5."}]
    assert summed["_meta"]["capd"]["status"] == "success"
    unknown = inspect(everything, "--method", "tools/call", "--tool-name", "everything.nope",
                      direct=True)
    assert unknown["isError"] is True
    assert "unknown tool" in unknown["content"][0]["text"]

    resources = inspect(everything, "--method", "resources/list")
    assert "capd://everything/demo://resource/static/document/features.md" in {
        r["uri"] for r in resources["resources"]}
