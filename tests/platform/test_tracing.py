"""One trace from a caller's Submit to the downstream call, across real service processes,
and on through a redrive and the callback.

The services export their spans over OTLP/HTTP (``DISPO_OTLP_ENDPOINT``) to a receiver the
test runs, which decodes each ``ExportTraceServiceRequest``; the same server plays the
downstream and the caller's webhook, and records the headers of every call it gets. The
caller sends its own ``traceparent``: the gateway's server span, the executor's node span
and the downstream's ``traceparent`` all carry the caller's trace id; so do the
reconciler's redrive of a task whose short retries ran out, the node runs it caused, and the
signed callback's ``traceparent``.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from dataclasses import dataclass

import pytest
from aiohttp import web
from dispo.libs.api.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from dispo.libs.auth import open_channel
from dispo.libs.process import free_port
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from pipeline_fixtures import EXECUTOR_TEST_ENV, TEST_CATALOGUE
from support import eventually
from support.auth import signing_secret
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
    """An OTLP/HTTP trace receiver, a downstream and a webhook in one real HTTP server. The
    downstream answers 500 to the first ``failing[path]`` calls of a path."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.failing: Counter[str] = Counter()
        self.server = FakeServer(
            {
                ("POST", "/v1/traces"): self._export,
                ("*", "/{path:.*}"): self._downstream,
            }
        )

    async def _downstream(self, request: web.Request) -> web.Response:
        if self.failing[request.path] > 0:
            self.failing[request.path] -= 1
            return web.json_response({"error": "not now"}, status=500)
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


# The reconciler redrives a failed task at once and delivers callbacks on its first sweep.
RECOVERY = """
redrive:
  default: {max_redrives: 3, max_age: 3600, base_delay: 0.1, max_delay: 0.1, jitter: 0}
callbacks: {max_attempts: 3, base_delay: 0.1, max_delay: 0.1, jitter: 0}
"""


@pytest.fixture(scope="module")
async def stack(module_services, module_database, receiver, tmp_path_factory):
    folder = tmp_path_factory.mktemp("config")
    catalogue = folder / "catalogue.yaml"
    catalogue.write_text(TEST_CATALOGUE.format(url=receiver.server.url))
    recovery = folder / "recovery.yaml"
    recovery.write_text(RECOVERY)
    env = {
        "DISPO_CATALOGUE": str(catalogue),
        "DISPO_EGRESS_ALLOW": receiver.server.url,
        "DISPO_OTLP_ENDPOINT": receiver.server.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # export within a tenth of a second
    }
    await signing_secret(module_database, "tracing")  # the callbacks are signed
    executor_port = free_port()  # where the gateway and the reconciler read outputs
    executor_address = {
        f"DISPO_{service.upper()}_EXECUTOR_ADDRESS": f"127.0.0.1:{executor_port}"
        for service in ("gateway", "reconciler")
    }
    gateway, executor, reconciler = await asyncio.gather(
        module_services.start("gateway", {**env, **executor_address}),
        module_services.start("executor", {**env, **EXECUTOR_TEST_ENV}, port=executor_port),
        module_services.start(
            "reconciler",
            {
                **env,
                **executor_address,
                "DISPO_RECONCILER_CONFIG": str(recovery),
                "DISPO_RECONCILER_SWEEP_INTERVAL_SECONDS": "0.2",
            },
        ),
    )
    return {"gateway": gateway, "executor": executor, "reconciler": reconciler}


def traceparent() -> tuple[str, str]:
    """A caller's own ``traceparent`` and its trace id."""
    trace_id = secrets.token_hex(16)
    return f"00-{trace_id}-{secrets.token_hex(8)}-01", trace_id


async def submit_step(stack, tokens, parent: str, name: str, **fields: str) -> str:
    """Submit one ``step`` cell named ``name`` under the caller's ``parent``: the task id."""
    request = json_format.ParseDict(
        {
            "business": "tracing",
            "idempotency_key": f"trace-{name}",
            "cells": [{"cell": "step", "payload": {"name": name}}],
            **fields,
        },
        gateway_pb2.SubmitRequest(),
    )
    async with open_channel(stack["gateway"].address, tokens.admin) as channel:
        reply = await gateway_pb2_grpc.GatewayServiceStub(channel).Submit(
            request, metadata=(("traceparent", parent),), timeout=10
        )
    assert reply.task_id
    return reply.task_id


def descends(span: Span, ancestor: Span, spans: list[Span]) -> bool:
    by_id = {s.span_id: s for s in spans}
    while span.parent_id in by_id:
        span = by_id[span.parent_id]
        if span is ancestor:
            return True
    return False


async def test_one_trace_from_submit_to_the_downstream_call(stack, receiver, tokens):
    parent, trace_id = traceparent()
    task_id = await submit_step(stack, tokens, parent, trace_id)

    [call] = await eventually(
        lambda: receiver.server.received(f"/step/{trace_id}"), wanted="the downstream call"
    )
    assert call.headers["traceparent"].split("-")[1] == trace_id, call.headers
    assert call.headers["X-Dispo-Task-Id"] == task_id

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
        "dispo.task_id": task_id,
        "dispo.node_id": node.attributes["dispo.node_id"],
        "dispo.cell": "step",
        "dispo.action": "call",
        "dispo.downstream": "demo",
        "dispo.attempt": "1",
    }
    # The downstream's traceparent names the node run as its parent.
    assert call.headers["traceparent"].split("-")[2] == node.span_id


async def test_a_redrive_and_the_callback_continue_the_submit_trace(stack, receiver, tokens):
    parent, trace_id = traceparent()
    path = f"/step/{trace_id}"
    receiver.failing[path] = 4  # the first run and its three short retries: task.fail
    callback = f"{receiver.server.url}/callback/{trace_id}"
    task_id = await submit_step(stack, tokens, parent, trace_id, callback_url=callback)

    # Four calls fail, the reconciler redrives the task, the fifth call succeeds, and the
    # caller is notified.
    [notified] = await eventually(
        lambda: receiver.server.received(f"/callback/{trace_id}"), wanted="the callback"
    )
    calls = receiver.server.received(path)
    assert len(calls) == 5
    assert {c.headers["traceparent"].split("-")[1] for c in calls} == {trace_id}
    assert notified.headers["X-Dispo-Task-Id"] == task_id
    assert notified.headers["traceparent"].split("-")[1] == trace_id, notified.headers

    def complete(spans: list[Span]) -> bool:
        """Every span named below exported, and the ones between them too: each process
        exports in batches of its own, so a span can come before its parent's."""
        names = Counter((s.service, s.name) for s in spans)
        if not (
            names[("executor", "node run")] == 5
            and names[("reconciler", "redrive")] >= 1
            and names[("reconciler", "callback")] >= 1
        ):
            return False
        redrives = [s for s in spans if s.name == "redrive"]
        return any(s.name == "node run" and descends(s, r, spans) for s in spans for r in redrives)

    spans = await eventually(
        lambda: receiver.of_trace(trace_id), complete, wanted="the redrive's and callback's spans"
    )
    [submit_span] = [s for s in spans if s.name.endswith("/Submit")]
    [redrive] = [s for s in spans if s.name == "redrive"]
    [delivery] = [s for s in spans if s.name == "callback"]
    # The redrive continues the task's trace (through the executor's task.fail), and the
    # node run it caused descends from it: the call that succeeded.
    assert descends(redrive, submit_span, spans), spans
    redriven = [s for s in spans if s.name == "node run" and descends(s, redrive, spans)]
    assert [s.attributes["dispo.attempt"] for s in redriven] == ["5"], redriven
    assert calls[-1].headers["traceparent"].split("-")[2] == redriven[0].span_id
    # The callback is a span of the same trace, named as the webhook's parent.
    assert descends(delivery, submit_span, spans), spans
    assert notified.headers["traceparent"].split("-")[2] == delivery.span_id
