"""Traces, when the operator asks for them: OpenTelemetry spans for calls and their parts.

Tracing is on when the OpenTelemetry SDK is installed (``pip install 'capd[otel]'``)
and the standard variables name an exporter: ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (OTLP, ``http/protobuf`` unless
``OTEL_EXPORTER_OTLP_PROTOCOL`` says ``grpc``), or ``OTEL_TRACES_EXPORTER=otlp|console``.
``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` keeps it off. Every other
``OTEL_*`` variable (service name, resource attributes, sampler, batch delays,
headers) is read by the SDK itself.

Off, nothing of OpenTelemetry is imported, and each place that would make a span
tests one module global, :data:`TRACER`, against None.

The spans (names and attributes after the OpenTelemetry GenAI conventions for tool
execution, and its MCP conventions for the upstream request):

- ``execute_tool {name}``: one call (``gen_ai.operation.name``, ``gen_ai.tool.name``,
  ``gen_ai.tool.call.id``, ``gen_ai.tool.type``, ``error.type``, ``capd.status``,
  ``capd.job.id`` when queued), a child of the caller's ``traceparent`` when given;
- ``policy {step}``: each policy step the call passes through;
- ``tools/call {tool}``: the request to an upstream MCP server;
- ``queue.enqueue``: the durable write of a queued job;
- ``queue.verify {name}`` and ``queue.replay {name}``: the sweep's effect verification
  and replay of a job.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

__all__ = ["TRACER", "attach", "detach", "enable_tracing", "optional_span", "set_error",
           "shutdown_tracing", "span", "tracing_wanted"]

log = structlog.get_logger("capd.tracing")

TRACER: Tracer | None = None
"""The tracer spans are made with; None while tracing is off."""

_PROVIDER: TracerProvider | None = None

_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def tracing_wanted(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the ``OTEL_*`` variables in ``env`` ask for traces."""
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none" or env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return exporter in ("otlp", "console") or any(env.get(name) for name in _ENDPOINTS)


def enable_tracing(version: str, env: Mapping[str, str] = os.environ) -> str | None:
    """Turn tracing on when ``env`` asks for it; return why it stays off when asked for
    but impossible (the SDK or the exporter is not installed), else None."""
    global TRACER, _PROVIDER
    if TRACER is not None or not tracing_wanted(env):
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        return ("OTEL_* variables ask for traces but the OpenTelemetry SDK is not installed: "
                "pip install 'capd[otel]' (tracing is off)")
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console":
        exporter = ConsoleSpanExporter()
    else:
        protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                    or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
        wire = "grpc" if protocol == "grpc" else "http"
        try:  # the OTLP exporter of that wire: a package of its own
            exporter = importlib.import_module(
                f"opentelemetry.exporter.otlp.proto.{wire}.trace_exporter").OTLPSpanExporter()
        except ImportError:
            package = f"opentelemetry-exporter-otlp-proto-{wire}"
            return (f"OTEL_* variables ask for OTLP traces over {protocol} but {package} is "
                    f"not installed: pip install {package} (tracing is off)")
    attributes = {"service.version": version}
    if not env.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = "capd"
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    _PROVIDER = provider
    # capd's own provider, not the process's global one: libraries that trace through the
    # global provider (the MCP SDK makes a span for every probe's ping) stay silent.
    TRACER = provider.get_tracer("capd", version)
    return None


def shutdown_tracing() -> None:
    """Send what is buffered and turn tracing off (the daemon's last step)."""
    global TRACER, _PROVIDER
    provider, _PROVIDER, TRACER = _PROVIDER, None, None
    if provider is not None:
        provider.force_flush(timeout_millis=3000)
        provider.shutdown()


@contextmanager
def span(name: str, attributes: Mapping[str, Any]) -> Iterator[Span]:
    """A span named ``name``, current inside the block; an exception marks it an error.
    Only for when :data:`TRACER` is set."""
    assert TRACER is not None
    with TRACER.start_as_current_span(name, attributes=dict(attributes)) as current:
        yield current


def optional_span(name: str, attributes: Mapping[str, Any]) -> AbstractContextManager[
        Span | None]:
    """:func:`span` while tracing is on, else a block that does nothing (yields None); for
    places off the call path (the sweep)."""
    return span(name, attributes) if TRACER is not None else nullcontext()


def attach(headers: Mapping[str, str]) -> object:
    """Make the caller's trace (W3C ``traceparent``/``tracestate`` in ``headers``) the
    parent of what follows in this task; give :func:`detach` what this returns."""
    from opentelemetry import context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return context.attach(TraceContextTextMapPropagator().extract(dict(headers)))


def detach(token: object) -> None:
    """Undo :func:`attach`."""
    from opentelemetry import context

    context.detach(token)  # type: ignore[arg-type]  # the token attach gave


def set_error(current: Span, error_type: str, message: str | None) -> None:
    """Mark ``current`` failed with ``error_type`` (``error.type``) and ``message``."""
    from opentelemetry.trace import Status, StatusCode

    current.set_attribute("error.type", error_type)
    current.set_status(Status(StatusCode.ERROR, message))
