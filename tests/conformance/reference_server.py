"""The reference MCP server the official conformance suite is pointed at.

Every fixture the suite's server scenarios call (``@modelcontextprotocol/conformance``
0.1.16, ``conformance list --server``) is served here under the same name, with the same
content and behaviour as the suite's own example server (``everything-server.ts``): the
tools (text, image, audio, embedded resources, mixed content, logging, progress, an
error, a stream closed mid-call, sampling, three elicitations, a JSON Schema 2020-12
input schema), the resources and the template, subscriptions, the prompts,
``completion/complete`` and ``logging/setLevel``.

It is built on the MCP Python SDK's low-level ``Server`` (the public constructor
handlers and ``add_request_handler``): ``MCPServer`` cannot hand out a raw input
schema, answer ``logging/setLevel`` or ``resources/subscribe``, or reach the session
for sampling and elicitation without the SDK's private names. It speaks streamable HTTP
(protocol revision 2025-11-25) on 127.0.0.1, at ``/mcp``, with sessions, an in-memory
event store (so a stream closed mid-call resumes on ``Last-Event-ID``) and the SDK's
DNS-rebinding guard for loopback hosts.

Run: ``python -m tests.conformance.reference_server --port 0``. Once the socket listens
it prints one line, ``listening http://127.0.0.1:<port>/mcp``, on stdout; SIGTERM or
SIGINT stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import socket
import sys
import warnings
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.models import InitializationOptions
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

SERVER_NAME = "mcp-conformance-test-server"
SERVER_VERSION = "1.0.0"
MCP_PATH = "/mcp"
# the reconnection delay a priming event asks for (SEP-1699), as the example server
RETRY_INTERVAL_MS = 5000
STEP_DELAY_S = 0.05  # between the log and progress notifications of one call

# a 1x1 red PNG and a minimal WAV file, the example server's own bytes
TEST_IMAGE_BASE64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5E"
    "rkJggg=="
)
TEST_AUDIO_BASE64 = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="

# SEP-1613: listed verbatim, so $schema, $defs and additionalProperties survive
JSON_SCHEMA_2020_12_INPUT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        },
    },
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}

NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}

ELICITATION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"response": {"type": "string", "description": "User's response"}},
    "required": ["response"],
}

# SEP-1034: a default for every primitive type
ELICITATION_DEFAULTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "User name", "default": "John Doe"},
        "age": {"type": "integer", "description": "User age", "default": 30},
        "score": {"type": "number", "description": "User score", "default": 95.5},
        "status": {
            "type": "string",
            "description": "User status",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "description": "Verification status", "default": True},
    },
    "required": [],
}

# SEP-1330: the five enum shapes
ELICITATION_ENUMS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "untitledSingle": {
            "type": "string",
            "description": "Select one option",
            "enum": ["option1", "option2", "option3"],
        },
        "titledSingle": {
            "type": "string",
            "description": "Select one option with titles",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "description": "Select one option (legacy)",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {
            "type": "array",
            "description": "Select multiple options",
            "minItems": 1,
            "maxItems": 3,
            "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
        },
        "titledMulti": {
            "type": "array",
            "description": "Select multiple options with titles",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ],
            },
        },
    },
    "required": [],
}

Ctx = ServerRequestContext[Any]
ToolFn = Callable[[Ctx, dict[str, Any]], Awaitable[types.CallToolResult]]


def compact_json(value: object) -> str:
    """``value`` as JavaScript's ``JSON.stringify`` writes it (no spaces), so texts match
    the example server's byte for byte."""
    return json.dumps(value, separators=(",", ":"))


def text_result(text: str, *, is_error: bool = False) -> types.CallToolResult:
    """A tool result of one text block."""
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=is_error)


def string_argument(arguments: dict[str, Any], name: str) -> str:
    """The required string argument ``name``; an invalid-params error when it is not one."""
    value = arguments.get(name)
    if not isinstance(value, str):
        raise MCPError(types.INVALID_PARAMS, f"argument {name!r} must be a string")
    return value


class InMemoryEventStore(EventStore):
    """The events of every stream of the process, kept for replay on ``Last-Event-ID``.

    An event id is ``<stream id>::<sequence>``, the sequence zero-padded so that ids of
    one stream sort in the order they were stored. Unbounded: the server lives for one
    suite run.
    """

    def __init__(self) -> None:
        self._events: list[tuple[EventId, StreamId, types.JSONRPCMessage | None]] = []
        self._sequence = itertools.count()

    async def store_event(self, stream_id: StreamId,
                          message: types.JSONRPCMessage | None) -> EventId:
        event_id = f"{stream_id}::{next(self._sequence):012d}"
        self._events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: EventId,
                                  send_callback: EventCallback) -> StreamId | None:
        stream_id, separator, _ = last_event_id.rpartition("::")
        if not separator:
            return None
        for event_id, owner, message in list(self._events):
            # priming events carry no message: nothing to replay for them
            if owner == stream_id and event_id > last_event_id and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id


class ReferenceServer(Server):
    """The low-level server that announces every list as changeable, as the example
    server does (``tools``, ``resources`` and ``prompts`` with ``listChanged``)."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(
                prompts_changed=True, resources_changed=True, tools_changed=True),
            experimental_capabilities,
            extensions,
        )


class Fixtures:
    """The suite's fixtures and the handlers that serve them.

    Holds the one piece of state the fixtures have, the subscribed resource URIs, shared
    by every session of the process as the example server shares it.
    """

    def __init__(self) -> None:
        self.subscriptions: set[str] = set()
        self.tools: dict[str, tuple[types.Tool, ToolFn]] = {}
        for tool, fn in self._tool_table():
            self.tools[tool.name] = (tool, fn)

    # ----- tools -----

    def _tool_table(self) -> Sequence[tuple[types.Tool, ToolFn]]:
        def tool(name: str, description: str,
                 schema: dict[str, Any] = NO_ARGUMENTS) -> types.Tool:
            return types.Tool(name=name, description=description, input_schema=schema)

        def one_string(name: str, description: str) -> dict[str, Any]:
            return {"type": "object",
                    "properties": {name: {"type": "string", "description": description}},
                    "required": [name]}

        return [
            (tool("test_simple_text", "Tests simple text content response"),
             self.simple_text),
            (tool("test_image_content", "Tests image content response"), self.image_content),
            (tool("test_audio_content", "Tests audio content response"), self.audio_content),
            (tool("test_embedded_resource", "Tests embedded resource content response"),
             self.embedded_resource),
            (tool("test_multiple_content_types",
                  "Tests response with multiple content types (text, image, resource)"),
             self.multiple_content_types),
            (tool("test_tool_with_logging",
                  "Tests tool that emits log messages during execution"),
             self.tool_with_logging),
            (tool("test_tool_with_progress", "Tests tool that reports progress notifications"),
             self.tool_with_progress),
            (tool("test_error_handling", "Tests error response handling"), self.error_handling),
            (tool("test_reconnection",
                  "Tests SSE stream disconnection and client reconnection (SEP-1699). Server "
                  "will close the stream mid-call and send the result after client "
                  "reconnects."),
             self.reconnection),
            (tool("test_sampling", "Tests server-initiated sampling (LLM completion request)",
                  one_string("prompt", "The prompt to send to the LLM")),
             self.sampling),
            (tool("test_elicitation", "Tests server-initiated elicitation (user input request)",
                  one_string("message", "The message to show the user")),
             self.elicitation),
            (tool("test_elicitation_sep1034_defaults",
                  "Tests elicitation with default values per SEP-1034"),
             self.elicitation_defaults),
            (tool("test_elicitation_sep1330_enums",
                  "Tests elicitation with enum schema improvements per SEP-1330"),
             self.elicitation_enums),
            (tool("json_schema_2020_12_tool",
                  "Tool with JSON Schema 2020-12 features for conformance testing (SEP-1613)",
                  JSON_SCHEMA_2020_12_INPUT_SCHEMA),
             self.json_schema_2020_12),
        ]

    async def list_tools(self, ctx: Ctx,
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool for tool, _ in self.tools.values()])

    async def call_tool(self, ctx: Ctx,
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        found = self.tools.get(params.name)
        if found is None:
            raise MCPError(types.INVALID_PARAMS, f"Tool {params.name} not found")
        return await found[1](ctx, dict(params.arguments or {}))

    async def simple_text(self, ctx: Ctx, arguments: dict[str, Any]) -> types.CallToolResult:
        return text_result("This is a simple text response for testing.")

    async def image_content(self, ctx: Ctx, arguments: dict[str, Any]) -> types.CallToolResult:
        return types.CallToolResult(content=[
            types.ImageContent(data=TEST_IMAGE_BASE64, mime_type="image/png")])

    async def audio_content(self, ctx: Ctx, arguments: dict[str, Any]) -> types.CallToolResult:
        return types.CallToolResult(content=[
            types.AudioContent(data=TEST_AUDIO_BASE64, mime_type="audio/wav")])

    async def embedded_resource(self, ctx: Ctx,
                                arguments: dict[str, Any]) -> types.CallToolResult:
        return types.CallToolResult(content=[types.EmbeddedResource(
            resource=types.TextResourceContents(
                uri="test://embedded-resource", mime_type="text/plain",
                text="This is an embedded resource content."))])

    async def multiple_content_types(self, ctx: Ctx,
                                     arguments: dict[str, Any]) -> types.CallToolResult:
        return types.CallToolResult(content=[
            types.TextContent(text="Multiple content types test:"),
            types.ImageContent(data=TEST_IMAGE_BASE64, mime_type="image/png"),
            types.EmbeddedResource(resource=types.TextResourceContents(
                uri="test://mixed-content-resource", mime_type="application/json",
                text=compact_json({"test": "data", "value": 123}))),
        ])

    async def tool_with_logging(self, ctx: Ctx,
                                arguments: dict[str, Any]) -> types.CallToolResult:
        for step, message in enumerate(("Tool execution started", "Tool processing data",
                                        "Tool execution completed")):
            if step:
                await asyncio.sleep(STEP_DELAY_S)
            # on this request's stream, as the example server's sendNotification
            await ctx.session.send_log_message("info", message,
                                               related_request_id=ctx.request_id)
        return text_result("Tool with logging executed successfully")

    async def tool_with_progress(self, ctx: Ctx,
                                 arguments: dict[str, Any]) -> types.CallToolResult:
        meta = (ctx.params or {}).get("_meta") or {}
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        for step, progress in enumerate((0, 50, 100)):
            if step:
                await asyncio.sleep(STEP_DELAY_S)
            # against the caller's token; nothing is sent when it gave none
            await ctx.session.report_progress(progress, 100,
                                               f"Completed step {progress} of 100")
        return text_result(str(token if token is not None else 0))

    async def error_handling(self, ctx: Ctx, arguments: dict[str, Any]) -> types.CallToolResult:
        return text_result("This tool intentionally returns an error for testing", is_error=True)

    async def reconnection(self, ctx: Ctx, arguments: dict[str, Any]) -> types.CallToolResult:
        # SEP-1699: end this request's SSE stream; the result waits in the event store
        # for the client to come back with Last-Event-ID
        if ctx.close_sse_stream is not None:
            await ctx.close_sse_stream()
        await asyncio.sleep(0.1)
        return text_result(
            "Reconnection test completed successfully. If you received this, the client "
            "properly reconnected after stream closure.")

    async def sampling(self, ctx: Ctx, arguments: dict[str, Any]) -> types.CallToolResult:
        prompt = string_argument(arguments, "prompt")
        try:
            result = await ctx.session.create_message(
                [types.SamplingMessage(role="user", content=types.TextContent(text=prompt))],
                max_tokens=100, related_request_id=ctx.request_id)
        except Exception as exc:  # the example server reports any failure as text
            return text_result(f"Sampling not supported or error: {exc}")
        content = result.content
        reply = content.text if isinstance(content, types.TextContent) else "No response"
        return text_result(f"LLM response: {reply}")

    async def _elicit(self, ctx: Ctx, message: str, schema: dict[str, Any],
                      label: str) -> types.CallToolResult:
        try:
            result = await ctx.session.elicit_form(message, schema,
                                                   related_request_id=ctx.request_id)
        except Exception as exc:  # the example server reports any failure as text
            return text_result(f"Elicitation not supported or error: {exc}")
        return text_result(
            f"{label}: action={result.action}, content={compact_json(result.content or {})}")

    async def elicitation(self, ctx: Ctx, arguments: dict[str, Any]) -> types.CallToolResult:
        return await self._elicit(ctx, string_argument(arguments, "message"),
                                  ELICITATION_SCHEMA, "User response")

    async def elicitation_defaults(self, ctx: Ctx,
                                   arguments: dict[str, Any]) -> types.CallToolResult:
        return await self._elicit(ctx, "Please review and update the form fields with defaults",
                                  ELICITATION_DEFAULTS_SCHEMA, "Elicitation completed")

    async def elicitation_enums(self, ctx: Ctx,
                                arguments: dict[str, Any]) -> types.CallToolResult:
        return await self._elicit(ctx, "Please select options from the enum fields",
                                  ELICITATION_ENUMS_SCHEMA, "Elicitation completed")

    async def json_schema_2020_12(self, ctx: Ctx,
                                  arguments: dict[str, Any]) -> types.CallToolResult:
        return text_result(f"JSON Schema 2020-12 tool called with: {compact_json(arguments)}")

    # ----- resources -----

    RESOURCES = (
        types.Resource(name="static-text", uri="test://static-text",
                       title="Static Text Resource",
                       description="A static text resource for testing", mime_type="text/plain"),
        types.Resource(name="static-binary", uri="test://static-binary",
                       title="Static Binary Resource",
                       description="A static binary resource (image) for testing",
                       mime_type="image/png"),
        types.Resource(name="watched-resource", uri="test://watched-resource",
                       title="Watched Resource",
                       description="A resource that auto-updates every 3 seconds",
                       mime_type="text/plain"),
    )
    TEMPLATE_PREFIX, TEMPLATE_SUFFIX = "test://template/", "/data"
    TEMPLATE = types.ResourceTemplate(
        name="template", uri_template="test://template/{id}/data", title="Resource Template",
        description="A resource template with parameter substitution",
        mime_type="application/json")

    async def list_resources(
            self, ctx: Ctx, params: types.PaginatedRequestParams | None,
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=list(self.RESOURCES))

    async def list_resource_templates(
            self, ctx: Ctx, params: types.PaginatedRequestParams | None,
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[self.TEMPLATE])

    async def read_resource(self, ctx: Ctx,
                            params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        contents: types.TextResourceContents | types.BlobResourceContents
        if uri == "test://static-text":
            contents = types.TextResourceContents(
                uri=uri, mime_type="text/plain",
                text="This is the content of the static text resource.")
        elif uri == "test://static-binary":
            contents = types.BlobResourceContents(uri=uri, mime_type="image/png",
                                                  blob=TEST_IMAGE_BASE64)
        elif uri == "test://watched-resource":
            contents = types.TextResourceContents(uri=uri, mime_type="text/plain",
                                                  text="Watched resource content")
        elif (uri.startswith(self.TEMPLATE_PREFIX) and uri.endswith(self.TEMPLATE_SUFFIX)
              and "/" not in (item := uri[len(self.TEMPLATE_PREFIX):-len(self.TEMPLATE_SUFFIX)])
              and item):
            contents = types.TextResourceContents(
                uri=uri, mime_type="application/json",
                text=compact_json({"id": item, "templateTest": True,
                                   "data": f"Data for ID: {item}"}))
        else:
            raise MCPError(types.INVALID_PARAMS, f"Resource {uri} not found", {"uri": uri})
        return types.ReadResourceResult(contents=[contents])

    async def subscribe(self, ctx: Ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
        uri = str(params.uri)
        self.subscriptions.add(uri)
        await self._announce(ctx, f"Subscribed to resource: {uri}")
        return types.EmptyResult()

    async def unsubscribe(self, ctx: Ctx,
                          params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        uri = str(params.uri)
        self.subscriptions.discard(uri)
        await self._announce(ctx, f"Unsubscribed from resource: {uri}")
        return types.EmptyResult()

    async def _announce(self, ctx: Ctx, message: str) -> None:
        """An info log entry on the session's own stream (not this request's), as the
        example server's ``sendLog``; lost, as there, when the client has no such stream."""
        await ctx.session.send_log_message("info", message, logger="conformance-test-server")

    # ----- prompts -----

    PROMPTS = (
        types.Prompt(name="test_simple_prompt", title="Simple Test Prompt",
                     description="A simple prompt without arguments"),
        types.Prompt(name="test_prompt_with_arguments", title="Prompt With Arguments",
                     description="A prompt with required arguments",
                     arguments=[types.PromptArgument(name="arg1", description="First test argument",
                                                     required=True),
                                types.PromptArgument(name="arg2",
                                                     description="Second test argument",
                                                     required=True)]),
        types.Prompt(name="test_prompt_with_embedded_resource",
                     title="Prompt With Embedded Resource",
                     description="A prompt that includes an embedded resource",
                     arguments=[types.PromptArgument(name="resourceUri",
                                                     description="URI of the resource to embed",
                                                     required=True)]),
        types.Prompt(name="test_prompt_with_image", title="Prompt With Image",
                     description="A prompt that includes image content"),
    )

    async def list_prompts(self, ctx: Ctx,
                           params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=list(self.PROMPTS))

    async def get_prompt(self, ctx: Ctx,
                         params: types.GetPromptRequestParams) -> types.GetPromptResult:
        arguments = dict(params.arguments or {})
        prompt = next((p for p in self.PROMPTS if p.name == params.name), None)
        if prompt is None:
            raise MCPError(types.INVALID_PARAMS, f"Prompt {params.name} not found")
        for argument in prompt.arguments or []:
            string_argument(arguments, argument.name)

        def user(content: types.TextContent | types.ImageContent
                 | types.EmbeddedResource) -> types.PromptMessage:
            return types.PromptMessage(role="user", content=content)

        if params.name == "test_simple_prompt":
            messages = [user(types.TextContent(text="This is a simple prompt for testing."))]
        elif params.name == "test_prompt_with_arguments":
            messages = [user(types.TextContent(
                text=f"Prompt with arguments: arg1='{arguments['arg1']}', "
                     f"arg2='{arguments['arg2']}'"))]
        elif params.name == "test_prompt_with_embedded_resource":
            messages = [
                user(types.EmbeddedResource(resource=types.TextResourceContents(
                    uri=arguments["resourceUri"], mime_type="text/plain",
                    text="Embedded resource content for testing."))),
                user(types.TextContent(text="Please process the embedded resource above.")),
            ]
        else:
            messages = [
                user(types.ImageContent(data=TEST_IMAGE_BASE64, mime_type="image/png")),
                user(types.TextContent(text="Please analyze the image above.")),
            ]
        return types.GetPromptResult(messages=messages)

    # ----- utilities -----

    async def set_logging_level(self, ctx: Ctx,
                                params: types.SetLevelRequestParams) -> types.EmptyResult:
        await self._announce(ctx, f"Log level set to: {params.level}")
        return types.EmptyResult()

    async def complete(self, ctx: Ctx,
                       params: types.CompleteRequestParams) -> types.CompleteResult:
        # minimal, as the example server: the capability is declared and answers
        return types.CompleteResult(
            completion=types.Completion(values=[], total=0, has_more=False))


def build_server() -> ReferenceServer:
    """A fresh low-level server serving every fixture, with its own state."""
    fixtures = Fixtures()
    with warnings.catch_warnings():
        # the SDK flags logging/setLevel as deprecated on the 2026-07-28 wire; the
        # 2025-11-25 wire the suite speaks still has it
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        server = ReferenceServer(
            SERVER_NAME,
            version=SERVER_VERSION,
            on_list_tools=fixtures.list_tools,
            on_call_tool=fixtures.call_tool,
            on_list_resources=fixtures.list_resources,
            on_list_resource_templates=fixtures.list_resource_templates,
            on_read_resource=fixtures.read_resource,
            on_subscribe_resource=fixtures.subscribe,
            on_unsubscribe_resource=fixtures.unsubscribe,
            on_list_prompts=fixtures.list_prompts,
            on_get_prompt=fixtures.get_prompt,
            on_completion=fixtures.complete,
            on_set_logging_level=fixtures.set_logging_level,
        )
    return server


def listen(port: int) -> socket.socket:
    """A listening TCP socket on 127.0.0.1:``port`` (0: a free port the kernel picks)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


async def serve(sock: socket.socket) -> None:
    """Serve the reference server on ``sock`` until SIGTERM or SIGINT."""
    app = build_server().streamable_http_app(
        streamable_http_path=MCP_PATH, event_store=InMemoryEventStore(),
        retry_interval=RETRY_INTERVAL_MS, host="127.0.0.1")
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``--port``, announce the URL on stdout once listening, serve."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True,
                        help="TCP port on 127.0.0.1 (0: any free port)")
    args = parser.parse_args(argv)
    # logging and sampling are deprecated on the 2026-07-28 wire only; every call here
    # speaks 2025-11-25, so the SDK's warnings would be noise on stderr
    warnings.filterwarnings("ignore", category=MCPDeprecationWarning)
    sock = listen(args.port)
    port = sock.getsockname()[1]
    # the socket already queues connections: announcing now cannot race the server
    print(f"listening http://127.0.0.1:{port}{MCP_PATH}", flush=True)
    asyncio.run(serve(sock))
    return 0


if __name__ == "__main__":
    sys.exit(main())
