"""The breaker against a real executor and a real downstream that fails a tenth of its calls:
the failed calls take their short retries, every task completes and nothing is demoted."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web
from dispo.executor.settings import ExecutorSettings
from dispo.libs.api.executor.v1 import executor_pb2, executor_pb2_grpc
from dispo.sdk import cell
from pipeline_fixtures import Pipeline, dump, stream_messages, wait_status
from support.auth import admin_channel

CATALOGUE = """
downstreams:
  flaky:
    base_url: {url}
    timeout_ms: 1000
    max_concurrency: 16
    health_url: {url}/healthz
cells:
  effect:
    description: One idempotent call to a downstream that times out on every tenth call.
    fields: {{}}
    actions:
      call:
        kind: http
        downstream: flaky
        path: /effect
        idempotent: true
"""

TASKS = 150
STOPPED = {"SUCCEEDED", "FAILED", "CANCELLED", "RETRY_EXHAUSTED", "DEMOTED"}


async def test_ten_percent_of_calls_timing_out_slows_the_downstream_but_stops_nothing(
    start_service, fake_server, tmp_path: Path, bus
):
    calls: list[str] = []  # one entry per call, in arrival order (never merged by key)
    timed_out: list[str] = []

    async def effect(request: web.Request) -> web.Response:
        calls.append(request.headers["Idempotency-Key"])
        if len(calls) % 10 == 0:  # every tenth call answers long after the executor's timeout
            timed_out.append(calls[-1])
            await asyncio.sleep(3)
        return web.json_response({})

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({})

    downstream = await fake_server({("POST", "/effect"): effect, ("GET", "/healthz"): healthz})
    catalogue = tmp_path / "catalogue.yaml"
    catalogue.write_text(CATALOGUE.format(url=downstream.url))
    defaults = ExecutorSettings.model_fields
    pipeline = Pipeline(start_service, catalogue)
    await pipeline.start_gateway()
    executor = await pipeline.start_executor(
        # The breaker as shipped (the pipeline tests otherwise keep it out of the way) and the
        # health check on: only the calls' own failures can open it.
        DISPO_EXECUTOR_BREAKER_THRESHOLD=str(defaults["breaker_threshold"].default),
        DISPO_EXECUTOR_HEALTH_INTERVAL_SECONDS="0.2",
        DISPO_EXECUTOR_MAX_RETRIES="8",
        # Leases as shipped: this test is about the breaker, not about takeovers on a busy box.
        DISPO_EXECUTOR_LEASE_TTL_SECONDS=str(defaults["lease_ttl_seconds"].default),
    )
    async with pipeline.client() as client:
        tasks = [await client.submit("tests", [cell("effect")]) for _ in range(TASKS)]
        # Until each task has ended or stopped (a demoted task would wait for a reconciler).
        views = [await wait_status(client, t.task_id, STOPPED, timeout=120) for t in tasks]

    assert [v.status for v in views] == ["SUCCEEDED"] * TASKS, [
        dump(v) for v in views if v.status != "SUCCEEDED"
    ]
    assert await stream_messages(bus, "task.demote") == []
    # The failures were real and many: far more than the five in 30 s that used to open it.
    assert len(timed_out) >= TASKS // 10 and len(timed_out) * 10 <= len(calls)
    for view, task in zip(views, tasks, strict=True):
        key = f"{task.task_id}/effect.call"  # the node's idempotency key
        assert view.node_statuses == {"effect.call": "SUCCEEDED"}, dump(view)
        assert view.node("effect.call").attempts == calls.count(key) == 1 + timed_out.count(key)
    async with admin_channel(executor.address) as channel:
        reply = await executor_pb2_grpc.ExecutorServiceStub(channel).ListDownstreams(
            executor_pb2.ListDownstreamsRequest()
        )
    [flaky] = reply.downstreams
    assert flaky.breaker_state == executor_pb2.BREAKER_STATE_CLOSED
