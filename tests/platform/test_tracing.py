"""One trace from a caller's Submit to the downstream call, across real service processes.

The services export their spans over OTLP/HTTP (``DISPO_OTLP_ENDPOINT``) to a receiver the
test runs, which decodes each ``ExportTraceServiceRequest``; the same server plays the
downstream and records the headers of every call it gets. The caller sends its own
``traceparent``: the gateway's server span, the executor's node span and the downstream's
``traceparent`` all carry the caller's trace id.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass

import pytest
from aiohttp import web
from dispo.libs.api.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from dispo.libs.auth import open_channel
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from pipeline_fixtures import EXECUTOR_TEST_ENV, TEST_CATALOGUE
from support import eventually
from support.http import FakeServer


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, object]


class Receiver:
    """An OTLP/HTTP trace receiver and a downstream in one real HTTP server."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.server = FakeServer(
            {
                ("POST", "/v1/traces"): self._export,
                ("*", "/{path:.*}"): self._downstream,
            }
        )

    @staticmethod
    async def _downstream(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def _export(self, request: web.Request) -> web.Response:
        export = trace_service_pb2.ExportTraceServiceRequest.FromString(await request.read())
        for resource in export.resource_spans:
            service = next(
                a.value.string_value
                for a in resource.resource.attributes
                if a.key == "service.name"
            )
            for scope in resource.scope_spans:
                for s in scope.spans:
                    self.spans.append(
                        Span(
                            service,
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            {
                                a.key: json_format.MessageToDict(a.value).popitem()[1]
                                for a in s.attributes
                            },
                        )
                    )
        return web.Response(
            body=trace_service_pb2.ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    def of_trace(self, trace_id: str) -> list[Span]:
        return [s for s in self.spans if s.trace_id == trace_id]


@pytest.fixture(scope="module")
async def receiver():
    r = Receiver()
    await r.server.start()
    yield r
    await r.server.stop()


@pytest.fixture(scope="module")
async def stack(module_services, receiver, tmp_path_factory):
    catalogue = tmp_path_factory.mktemp("catalogue") / "catalogue.yaml"
    catalogue.write_text(TEST_CATALOGUE.format(url=receiver.server.url))
    env = {
        "DISPO_CATALOGUE": str(catalogue),
        "DISPO_EGRESS_ALLOW": receiver.server.url,
        "DISPO_OTLP_ENDPOINT": receiver.server.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # export within a tenth of a second
    }
    gateway, executor = await asyncio.gather(
        module_services.start("gateway", env),
        module_services.start("executor", {**env, **EXECUTOR_TEST_ENV}),
    )
    return {"gateway": gateway, "executor": executor}


def traceparent() -> tuple[str, str]:
    """A caller's own ``traceparent`` and its trace id."""
    trace_id = secrets.token_hex(16)
    return f"00-{trace_id}-{secrets.token_hex(8)}-01", trace_id


async def test_one_trace_from_submit_to_the_downstream_call(stack, receiver, tokens):
    parent, trace_id = traceparent()
    request = json_format.ParseDict(
        {
            "business": "tracing",
            "idempotency_key": f"trace-{trace_id}",
            "cells": [{"cell": "step", "payload": {"name": trace_id}}],
        },
        gateway_pb2.SubmitRequest(),
    )
    async with open_channel(stack["gateway"].address, tokens.admin) as channel:
        reply = await gateway_pb2_grpc.GatewayServiceStub(channel).Submit(
            request, metadata=(("traceparent", parent),), timeout=10
        )
    assert reply.task_id

    [call] = await eventually(
        lambda: receiver.server.received(f"/step/{trace_id}"), wanted="the downstream call"
    )
    assert call.headers["traceparent"].split("-")[1] == trace_id, call.headers
    assert call.headers["X-Dispo-Task-Id"] == reply.task_id

    def complete(spans: list[Span]) -> bool:
        return {
            ("gateway", "/dispo.gateway.v1.GatewayService/Submit"),
            ("executor", "task.create"),  # the handling of the message, around the node run
            ("executor", "node run"),
        } <= {(s.service, s.name) for s in spans}

    spans = await eventually(
        lambda: receiver.of_trace(trace_id), complete, wanted="the gateway's and executor's spans"
    )
    [submit] = [s for s in spans if s.name.endswith("/Submit")]
    [node] = [s for s in spans if s.name == "node run"]
    by_id = {s.span_id: s for s in spans}
    # The Submit continues the caller's span; the node run descends from the Submit.
    assert submit.parent_id == parent.split("-")[2]
    ancestor = node
    while ancestor.parent_id in by_id:
        ancestor = by_id[ancestor.parent_id]
    assert ancestor is submit, spans
    assert node.attributes == {
        "dispo.task_id": reply.task_id,
        "dispo.node_id": node.attributes["dispo.node_id"],
        "dispo.cell": "step",
        "dispo.action": "call",
        "dispo.downstream": "demo",
        "dispo.attempt": "1",
    }
    # The downstream's traceparent names the node run as its parent.
    assert call.headers["traceparent"].split("-")[2] == node.span_id
