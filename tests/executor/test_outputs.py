"""Node outputs and the references that pass them on (ADR-0093), through real processes:
gateway, executor, the demo downstream, PostgreSQL and NATS."""

from __future__ import annotations

import json

import grpc
import pytest
from dispo.libs.api.executor.v1 import executor_pb2, executor_pb2_grpc
from dispo.libs.payload import payload_data
from dispo.sdk import DispoError, cell
from pipeline_fixtures import dump
from support.auth import admin_channel


async def outputs_of(pipeline, task_id: str) -> executor_pb2.GetOutputsResponse:
    async with admin_channel(pipeline.executors[0].address) as channel:
        return await executor_pb2_grpc.ExecutorServiceStub(channel).GetOutputs(
            executor_pb2.GetOutputsRequest(task_id=task_id)
        )


def as_json(payload) -> object:
    return json.loads(payload_data(payload))


async def test_outputs_flow_into_later_payloads_and_paths_and_make_the_result(
    pipeline, client, downstream
):
    """A ticket opened by one cell: its number reaches a later cell's payload (alone, typed,
    and inside a sentence) and a later action's path; every output is recorded once and
    the result holds the outputs of the result nodes."""
    task = await client.submit(
        "tests",
        [
            cell("ticket", ref="t", name="c1"),
            cell(
                "tell",
                ref="n",
                name="owner",
                ticket="{nodes.t.open.output.ticket_id}",
                note="your ticket is {nodes.t.open.output.ticket_id} (ok: {nodes.t.open.output.ok})",
            ).after("t"),
            cell("review_and_close", ref="r", name="c2"),
        ],
    )
    done = await client.wait(task.task_id, timeout=30)
    assert done.status == "SUCCEEDED", dump(done)

    state = await downstream.state()
    opened = f"{task.task_id}/t.open"
    outputs = await outputs_of(pipeline, task.task_id)
    recorded = {o.node_id: as_json(o.output) for o in outputs.outputs}
    ticket = recorded["t.open"]["ticket_id"]
    assert ticket.startswith("T-") and recorded["t.open"]["key"] == opened
    assert json.loads(state["bodies"][f"{task.task_id}/n.send"]) == {
        "name": "owner",
        "ticket": ticket,
        "note": f"your ticket is {ticket} (ok: true)",
    }
    closing = recorded["r.open"]["ticket_id"]
    assert state["paths"][f"{task.task_id}/r.close"] == f"/closed/{closing}"
    # Every node that answered recorded its output, in the task's (topological) order.
    assert [o.node_id for o in outputs.outputs] == [n.node_id for n in done.nodes]
    # The result: each cell's sinks (t.open, n.send), and for review_and_close the action
    # its catalogue entry names (r.open), not its sink.
    assert as_json(outputs.result) == {
        "n.send": recorded["n.send"],
        "r.open": recorded["r.open"],
        "t.open": recorded["t.open"],
    }


async def test_an_output_over_its_limit_or_not_as_declared_fails_its_node_definitely(
    pipeline, client, downstream
):
    await downstream.control(
        answer={"path": "/sized/big", "text": '"x"' * 0 + "[" + "1," * 60 + "1]"}
    )
    await downstream.control(answer={"path": "/sized/typed", "body": {"count": "three"}})
    await downstream.control(answer={"path": "/sized/fine", "body": {"count": 3, "more": [1]}})
    await downstream.control(
        answer={"path": "/sized/text", "text": "not json at all", "content_type": "text/plain"}
    )
    big = await client.submit("tests", [cell("sized", name="big")])
    typed = await client.submit("tests", [cell("sized", name="typed")])
    fine = await client.submit("tests", [cell("sized", name="fine")])
    text = await client.submit("tests", [cell("sized", name="text")])

    big_done = await client.wait(big.task_id, timeout=30)
    assert big_done.status == "FAILED", dump(big_done)
    error = big_done.node("sized.call").last_error
    assert "definite failure" in error and "is over the limit of 100 bytes" in error, error
    typed_done = await client.wait(typed.task_id, timeout=30)
    assert typed_done.status == "FAILED", dump(typed_done)
    assert (
        "output not as declared: count: must be integer" in typed_done.node("sized.call").last_error
    )
    # A failed output check is final (the effect happened once): not retried.
    calls = await downstream.calls()
    assert calls[f"{big.task_id}/sized.call"] == calls[f"{typed.task_id}/sized.call"] == 1
    assert list((await outputs_of(pipeline, big.task_id)).outputs) == []

    assert (await client.wait(fine.task_id, timeout=30)).status == "SUCCEEDED"
    [output] = (await outputs_of(pipeline, fine.task_id)).outputs
    assert payload_data(output.output) == b'{"count":3,"more":[1]}'  # canonical JSON
    # Another content type is no output, and no failure (the declared field is not checked).
    text_done = await client.wait(text.task_id, timeout=30)
    assert text_done.status == "SUCCEEDED", dump(text_done)
    assert list((await outputs_of(pipeline, text.task_id)).outputs) == []


async def test_a_reference_the_output_cannot_answer_fails_its_node_without_a_call(
    pipeline, client, downstream
):
    """``step`` declares no output fields, so a missing key is found only at run time."""
    task = await client.submit(
        "tests",
        [
            cell("step", ref="s", name="first"),
            cell("tell", ref="n", name="x", ticket="{nodes.s.call.output.no_such_key}").after("s"),
        ],
    )
    done = await client.wait(task.task_id, timeout=30)
    assert done.status == "FAILED", dump(done)
    error = done.node("n.send").last_error
    assert "not sent: {nodes.s.call.output.no_such_key}" in error, error
    assert "the output of node s.call has no 'no_such_key'" in error
    assert f"{task.task_id}/n.send" not in await downstream.calls()


@pytest.mark.parametrize(
    ("cells", "field", "reason"),
    [
        (  # not upstream of the reading cell
            lambda: [
                cell("ticket", ref="t", name="a"),
                cell("tell", ref="n", name="b", ticket="{nodes.t.open.output.ticket_id}"),
            ],
            "cells[1].payload.ticket",
            "node t.open must run before every action of cell 'n' (make the cell depend on 't')",
        ),
        (
            lambda: [cell("tell", ref="n", name="b", ticket="{nodes.gone.x.output}")],
            "cells[0].payload.ticket",
            "{nodes.gone.x.output}: no node gone.x in this task",
        ),
        (
            lambda: [
                cell("ticket", ref="t", name="a"),
                cell("tell", ref="n", name="b", ticket="{nodes.t.open.output.number}").after("t"),
            ],
            "cells[1].payload.ticket",
            "{nodes.t.open.output.number}: node t.open declares no output field 'number'",
        ),
        (
            lambda: [cell("tell", ref="n", name="b", ticket="{nodes.t.open}")],
            "cells[0].payload.ticket",
            "a reference is written {nodes.<node>.output}",
        ),
    ],
)
async def test_a_reference_that_cannot_hold_is_refused_at_submit_naming_the_field(
    client, downstream, cells, field, reason
):
    with pytest.raises(DispoError) as refused:
        await client.submit("tests", cells(), idempotency_key="ref-refused")
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert reason in refused.value.violations[field], refused.value.violations
    assert sum((await client.count(idempotency_key="ref-refused")).values()) == 0  # none written
