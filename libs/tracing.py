"""Tracing with OpenTelemetry: one trace from a caller's gRPC call to the downstream calls
it caused, across the gateway, its outbox, the bus and the executor, and on through the
executor's events to the reconciler: its redrives (back to the executor) and the callback.

    configure_tracing("gateway", settings.otlp_endpoint)   # once per process (run_service)
    with server_span(method, context.invocation_metadata()):   # the one server interceptor
        carried = current()                # "traceparent[\\ntracestate]" or None: an outbox row's
    with continued(msg.headers, name):     # a consumer continues the publisher's trace
    with resumed(row.trace, "redrive"):    # later work continues the trace a row kept
        with span("node run", {...}):      # a span of this service's own work
            inject(headers)                # the outgoing HTTP call's `traceparent`

The trace context travels as W3C Trace Context (``traceparent``, ``tracestate``): in the
gRPC metadata of a call, in a ``trace`` column of an outbox row (:func:`current` encodes it,
:func:`headers_of` turns it into message headers), in the NATS headers of a message, and in
the ``traceparent`` header of a downstream call or a callback. Work done later than the
message that caused it (a redrive, a callback) keeps the context on its own row and resumes
it (:func:`resumed`).

Off unless ``DISPO_OTLP_ENDPOINT`` names an OTLP/HTTP receiver: then every helper here
returns at its first check (:data:`ENABLED` false), nothing is carried and no header is
built. On, each process exports its spans in batches (``service.name`` the service) to
``<endpoint>/v1/traces``, the last batch at exit; the SDK's ``OTEL_BSP_*`` variables tune
the batching.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

_PROPAGATOR = TraceContextTextMapPropagator()
_NOTHING = contextlib.nullcontext()

# Set once by configure_tracing; read by every helper before doing anything.
ENABLED = False
_tracer: Tracer = trace.NoOpTracer()


def configure_tracing(service: str, endpoint: str) -> None:
    """Export this process's spans to the OTLP/HTTP receiver at ``endpoint`` (its base URL,
    as ``OTEL_EXPORTER_OTLP_ENDPOINT``), as service ``service``; empty: tracing stays off."""
    global ENABLED, _tracer
    if not endpoint:
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = OTLPSpanExporter(endpoint=f"{endpoint.rstrip('/')}/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(exporter))
    _tracer = provider.get_tracer("dispo")
    ENABLED = True


def _parent(carrier: Mapping[str, str]) -> otel_context.Context | None:
    """The context ``carrier`` (W3C headers) names as parent, None without a traceparent."""
    if TRACEPARENT not in carrier:
        return None
    return _PROPAGATOR.extract(carrier)


def server_span(method: str, metadata: Any) -> contextlib.AbstractContextManager[Any]:
    """The span of one incoming gRPC call, a child of the caller's ``traceparent`` when its
    ``metadata`` carries one."""
    if not ENABLED:
        return _NOTHING
    carrier = {key: value for key, value in metadata or () if key in (TRACEPARENT, TRACESTATE)}
    return _tracer.start_as_current_span(
        method, context=_parent(carrier), kind=SpanKind.SERVER, attributes={"rpc.method": method}
    )


def continued(
    headers: Mapping[str, str] | None, name: str
) -> contextlib.AbstractContextManager[Any]:
    """The span of handling one message whose ``headers`` carry the publisher's trace
    context (nothing for a message without one)."""
    if not ENABLED or not headers or TRACEPARENT not in headers:
        return _NOTHING
    return _tracer.start_as_current_span(name, context=_parent(headers), kind=SpanKind.CONSUMER)


def resumed(carried: str | None, name: str) -> contextlib.AbstractContextManager[Any]:
    """The span of work a stored row stands for, done after the message or call that
    recorded it: a child of the context :func:`current` encoded then (``carried``; nothing
    without one). It continues that trace whatever span is current."""
    if not ENABLED or not carried:
        return _NOTHING
    return _tracer.start_as_current_span(name, context=_parent(headers_of(carried)))


def span(
    name: str, attributes: Mapping[str, Any] | None = None
) -> contextlib.AbstractContextManager[Any]:
    """A span of this service's own work, a child of the current one; only where a trace
    is under way (a span of its own would start a trace nobody asked for)."""
    if not ENABLED or not trace.get_current_span().get_span_context().is_valid:
        return _NOTHING
    return _tracer.start_as_current_span(name, attributes=dict(attributes or {}))


def current() -> str | None:
    """The current trace context, encoded for a row (``traceparent``, then ``tracestate``
    after a line break if there is one); None when there is none to carry."""
    if not ENABLED:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    parent = carrier.get(TRACEPARENT)
    if parent is None:
        return None
    state = carrier.get(TRACESTATE)
    return f"{parent}\n{state}" if state else parent


def headers_of(carried: str) -> dict[str, str]:
    """The W3C headers of a context :func:`current` encoded."""
    parent, _, state = carried.partition("\n")
    return {TRACEPARENT: parent, TRACESTATE: state} if state else {TRACEPARENT: parent}


def inject(headers: dict[str, str]) -> None:
    """Add the current trace context to an outgoing HTTP call's ``headers``."""
    if ENABLED:
        _PROPAGATOR.inject(headers)


__all__ = [
    "TRACEPARENT",
    "TRACESTATE",
    "configure_tracing",
    "continued",
    "current",
    "headers_of",
    "inject",
    "resumed",
    "server_span",
    "span",
]
