"""Traces through the real daemon, received by a local OTLP/HTTP receiver that decodes them:
a call is an ``execute_tool`` span in the caller's trace (``traceparent`` on the socket,
``_meta.traceparent`` through ``capd mcp``), with its policy steps, its upstream MCP
request, its queue write and the sweep's replay as spans of their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capd.recovery import tracing
from tests.helpers.daemon import DaemonProcess, write_e2e_config
from tests.helpers.servers import QuietHandler, ThreadedHttp

pytestmark = pytest.mark.slow  # the real daemon as a process

PY = sys.executable
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1: every span it is sent, decoded."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.spans: list[dict[str, Any]] = []
        self.paths: list[str] = []
        lock = self._lock = threading.Lock()
        spans, paths = self.spans, self.paths

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                decoded = []
                for resource in request.resource_spans:
                    service = {a.key: a.value.string_value
                               for a in resource.resource.attributes}
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            decoded.append({
                                "name": span.name, "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent_id": span.parent_span_id.hex(),
                                "status": span.status.code, "service": service,
                                "attributes": {a.key: _value(a.value)
                                               for a in span.attributes}})
                with lock:
                    spans.extend(decoded)
                    paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = ThreadedHttp(Handler).start()
        self.url = f"http://127.0.0.1:{self._server.port}"

    def named(self, name: str, timeout: float = 15.0, at_least: int = 1
              ) -> list[dict[str, Any]]:
        """The spans called ``name``, once ``at_least`` have come (bounded wait)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                found = [s for s in self.spans if s["name"] == name]
            if len(found) >= at_least:
                return found
            time.sleep(0.05)
        with self._lock:
            raise AssertionError(f"no span {name!r}; got {[s['name'] for s in self.spans]}")

    def close(self) -> None:
        self._server.close()


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


STATUS_ERROR = 2  # opentelemetry.proto.trace.v1.Status.STATUS_CODE_ERROR


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    try:
        yield found
    finally:
        found.close()


def _daemon(folder: Path, receiver: Receiver, **env: str) -> Iterator[DaemonProcess]:
    config = write_e2e_config(folder, 9, retry_base_s=0.2)
    config.write_text(config.read_text() + f"""
[tools.time_mcp]
kind = "mcp"
command = ["{PY}", "-m", "mcp_server_time", "--local-timezone", "UTC"]
timeout_s = 30
""")
    daemon = DaemonProcess(config, folder / "capd.sock", env={
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_SERVICE_NAME": "capd-test", **env}).start()
    try:
        yield daemon.wait_ready()
    finally:
        daemon.kill()


@pytest.fixture
def traced(short_tmp: Path, receiver: Receiver) -> Iterator[DaemonProcess]:
    yield from _daemon(short_tmp, receiver)


def test_a_call_is_an_execute_tool_span_in_the_callers_trace(
        traced: DaemonProcess, receiver: Receiver) -> None:
    answer = traced.call("POST", "/call/e2e.echo", {"text": "hi"},
                         headers={"traceparent": TRACEPARENT, "Capd-Session": "agent-1"})
    assert answer.status == 200, answer.body
    (span,) = receiver.named("execute_tool e2e.echo")
    assert span["trace_id"] == TRACE_ID
    assert span["parent_id"] == PARENT_ID  # a child of the caller's span
    attributes = span["attributes"]
    assert attributes["gen_ai.operation.name"] == "execute_tool"
    assert attributes["gen_ai.tool.name"] == "e2e.echo"
    assert attributes["gen_ai.tool.type"] == "function"
    assert attributes["gen_ai.tool.call.id"] == answer.body["request_id"]
    assert attributes["capd.status"] == "success"
    assert "error.type" not in attributes
    assert span["status"] != STATUS_ERROR
    assert span["service"]["service.name"] == "capd-test"
    assert receiver.paths[0] == "/v1/traces"
    # the policy steps this call passed (loop detection, for a session) are its children
    loops = [s for s in receiver.named("policy loop") if s["trace_id"] == TRACE_ID]
    assert loops
    assert loops[0]["parent_id"] == span["span_id"]
    # a call without a traceparent starts a trace of its own
    traced.call("POST", "/call/e2e.echo", {"text": "alone"})
    spans = receiver.named("execute_tool e2e.echo", timeout=10, at_least=2)
    assert len(spans) == 2
    assert spans[1]["trace_id"] != TRACE_ID
    assert not spans[1]["parent_id"]


def test_a_queued_write_and_its_replay_carry_the_job(
        traced: DaemonProcess, receiver: Receiver) -> None:
    answer = traced.call("POST", "/call/e2e.flaky", {"text": "w"},
                         headers={"traceparent": TRACEPARENT})
    assert answer.status == 202, answer.body
    job = answer.body["queued"]
    (span,) = receiver.named("execute_tool e2e.flaky")
    assert span["attributes"]["capd.job.id"] == job
    assert span["attributes"]["error.type"] == answer.body["error_type"]
    assert span["status"] == STATUS_ERROR
    (enqueue,) = receiver.named("queue.enqueue")
    assert enqueue["attributes"]["capd.job.id"] == job
    assert enqueue["parent_id"] == span["span_id"]
    assert enqueue["trace_id"] == TRACE_ID
    # the sweep replays it (the backend stays busy): a span naming the job
    replay = receiver.named("queue.replay e2e.flaky")[0]
    assert replay["attributes"]["capd.job.id"] == job
    assert replay["status"] == STATUS_ERROR


def test_an_upstream_request_is_a_tools_call_span(
        traced: DaemonProcess, receiver: Receiver) -> None:
    answer = traced.call("POST", "/call/time_mcp.get_current_time", {"timezone": "UTC"},
                         headers={"traceparent": TRACEPARENT})
    assert answer.status == 200, answer.body
    (call,) = receiver.named("execute_tool time_mcp.get_current_time")
    assert call["attributes"]["gen_ai.tool.type"] == "extension"
    (upstream,) = receiver.named("tools/call get_current_time")
    assert upstream["trace_id"] == TRACE_ID
    assert upstream["attributes"]["mcp.method.name"] == "tools/call"
    assert upstream["attributes"]["gen_ai.tool.name"] == "get_current_time"


def test_the_bridge_passes_the_clients_meta_traceparent(
        traced: DaemonProcess, receiver: Receiver) -> None:
    """``_meta.traceparent`` of an MCP tools/call through ``capd mcp`` continues the trace;
    a malformed one is not passed on."""
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "invoke_capability",
            "arguments": {"id": "e2e.echo", "arguments": {"text": "via"}},
            "_meta": {"traceparent": TRACEPARENT}}},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "invoke_capability",
            "arguments": {"id": "e2e.echo", "arguments": {"text": "bad"}},
            "_meta": {"traceparent": "00-zz\r\nX-Evil: 1"}}},
    ]
    stdin = "".join(json.dumps(m) + "\n" for m in messages)
    answers: dict[int, Any] = {}
    with subprocess.Popen([PY, "-m", "capd", "mcp", "--socket", str(traced.socket)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True) as bridge:
        assert bridge.stdin is not None
        assert bridge.stdout is not None
        bridge.stdin.write(stdin)
        bridge.stdin.flush()
        deadline = time.monotonic() + 30
        while len(answers) < 3 and time.monotonic() < deadline:
            line = bridge.stdout.readline()
            if not line:
                break
            message = json.loads(line)
            if "id" in message:
                answers[message["id"]] = message
        bridge.stdin.close()
        bridge.wait(timeout=10)
    assert not answers[2]["result"].get("isError"), answers[2]
    assert not answers[3]["result"].get("isError"), answers[3]
    spans = receiver.named("execute_tool e2e.echo", timeout=10, at_least=2)
    assert len(spans) == 2
    assert spans[0]["trace_id"] == TRACE_ID
    assert spans[1]["trace_id"] != TRACE_ID  # the malformed context went nowhere


def test_without_the_variables_nothing_of_opentelemetry_is_imported() -> None:
    """The whole daemon and CLI import, and tracing is asked, without OTEL_* variables:
    not one OpenTelemetry module is loaded (the call path tests one global)."""
    code = ("import sys; import capd.sidecar.server, capd.sidecar.client.cli; "
            "from capd.recovery import tracing; "
            "assert tracing.enable_tracing('0', {}) is None and tracing.TRACER is None; "
            "loaded = [m for m in sys.modules if m.startswith('opentelemetry')]; "
            "assert not loaded, loaded")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    subprocess.run([PY, "-c", code], check=True, env=env, timeout=60)


@pytest.mark.parametrize(("env", "wanted"), [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_SERVICE_NAME": "capd"}, False),
])
def test_the_standard_variables_decide(env: dict[str, str], wanted: bool) -> None:
    assert tracing.tracing_wanted(env) is wanted
