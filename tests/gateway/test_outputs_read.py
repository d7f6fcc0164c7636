"""GetTask and WatchTask answer with the nodes' outputs and the task's result, read from the
executor's GetOutputs (ADR-0093): only for a task one of whose nodes recorded an output, and
still answered, ``outputs_unavailable``, when the executor cannot be reached. Real
processes: gateway, executor, the demo downstream, PostgreSQL and NATS."""

from __future__ import annotations

import json
from typing import Any

from dispo.libs.api.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from dispo.sdk import cell
from pipeline_fixtures import Pipeline, dump
from support import eventually
from support.auth import admin_channel


def get_outputs_calls(executor: Any, task_id: str) -> int:
    """The GetOutputs calls the executor answered for ``task_id`` (its rpc lines, logged at
    debug with the request's task id)."""
    lines = [json.loads(x) for x in executor.log_path.read_text().splitlines() if x[:1] == "{"]
    return sum(
        1
        for line in lines
        if line.get("event") == "rpc"
        and line.get("method", "").endswith("/GetOutputs")
        and line.get("task_id") == task_id
    )


async def watched(pipeline, task_id: str) -> list[Any]:
    """Every version WatchTask sends of the task, to the end."""
    async with admin_channel(pipeline.gateway.address) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        return [
            reply.task
            async for reply in stub.WatchTask(gateway_pb2.WatchTaskRequest(task_id=task_id))
        ]


async def test_gettask_and_watchtask_show_each_nodes_output_and_the_result(
    start_service, catalogue_file, egress_allow
):
    pipeline = Pipeline(start_service, catalogue_file, egress_allow)
    await pipeline.start_gateway()
    executor = await pipeline.start_executor(DISPO_LOG_LEVEL="debug")  # its rpc lines
    async with pipeline.client() as client:
        task = await client.submit(
            "tests",
            [
                cell("ticket", ref="t", name="c1"),
                cell("tell", ref="n", name="owner", ticket="{nodes.t.open.output.ticket_id}").after(
                    "t"
                ),
                cell("review_and_close", ref="r", name="c2"),
            ],
        )
        done = await client.wait(task.task_id, timeout=30)  # WatchTask's terminal version
        assert done.status == "SUCCEEDED", dump(done)
        assert not done.outputs_unavailable
        ticket = done.node("t.open").output["ticket_id"]
        assert ticket.startswith("T-") and done.node("t.open").output["ok"] is True
        assert done.node("t.open").output_bytes == len(
            json.dumps(done.node("t.open").output, separators=(",", ":"), sort_keys=True)
        )
        # the result: each cell's sinks, and review_and_close's named action (not its sink)
        assert done.result == {
            "n.send": done.node("n.send").output,
            "r.open": done.node("r.open").output,
            "t.open": done.node("t.open").output,
        }
        assert done.node("r.close").output is not None  # an output, though not in the result

        view = await client.get(task.task_id)  # GetTask
        assert view.result == done.result and not view.outputs_unavailable
        assert {n.node_id: n.output for n in view.nodes} == {
            n.node_id: n.output for n in done.nodes
        }
        assert json.loads(view.raw.result.data) == done.result
    # WatchTask from the start: the outputs as each version has them, the result at the end
    versions = await watched(pipeline, task.task_id)
    assert versions[-1].HasField("result") and versions[-1].result == view.raw.result
    assert all(not v.HasField("result") for v in versions[:-1])
    assert get_outputs_calls(executor, task.task_id) >= 2  # GetTask's and WatchTask's


async def test_a_task_without_outputs_costs_no_call_and_succeeds_with_the_empty_result(
    start_service, catalogue_file, egress_allow
):
    pipeline = Pipeline(start_service, catalogue_file, egress_allow)
    await pipeline.start_gateway()
    executor = await pipeline.start_executor(DISPO_LOG_LEVEL="debug")
    async with pipeline.client() as client:
        quiet = await client.submit("tests", [cell("noop"), cell("note", text="hello")])
        done = await client.wait(quiet.task_id, timeout=30)
        assert done.status == "SUCCEEDED", dump(done)
        view = await client.get(quiet.task_id)
        # a control beside it: a task with an output is read
        loud = await client.submit("tests", [cell("ticket", name="x")])
        assert (await client.wait(loud.task_id, timeout=30)).result["ticket.open"]["ticket_id"]
    assert done.result == view.result == {} and not view.outputs_unavailable
    assert all(n.output is None and n.output_bytes == 0 for n in view.nodes)
    assert get_outputs_calls(executor, loud.task_id) >= 1
    assert get_outputs_calls(executor, quiet.task_id) == 0


async def test_an_unreachable_executor_leaves_the_view_answered_without_its_outputs(pipeline):
    async with pipeline.client() as client:
        task = await client.submit("tests", [cell("ticket", name="down")])
        done = await client.wait(task.task_id, timeout=30)
        assert done.status == "SUCCEEDED" and done.result, dump(done)
        [executor] = pipeline.executors
        executor.kill()
        try:
            view = await client.get(task.task_id)  # GetTask: answered, never an error
            assert view.status == "SUCCEEDED" and view.outputs_unavailable
            assert view.result is None and view.node("ticket.open").output is None
            assert view.node("ticket.open").output_bytes > 0  # it has one, not read now
            [version] = await watched(pipeline, task.task_id)  # WatchTask too
            assert version.outputs_unavailable and not version.HasField("result")
        finally:
            executor.spawn()  # back on its address
            await executor.wait_ready()
        # read again once the gateway's channel has reconnected
        again = await eventually(
            lambda: client.get(task.task_id),
            lambda view: not view.outputs_unavailable,
            timeout=30,
            wanted="the outputs read again",
        )
    assert again.result == done.result
