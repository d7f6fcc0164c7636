"""Deadlines (ADR-0103) through real processes — gateway and executor on a file clock the
test moves, the demo downstream, PostgreSQL and NATS: past its deadline a task ends FAILED,
"deadline reached", its open nodes closed, an UNKNOWN one left UNKNOWN, a call under way
recorded; whether a pass holds it (its next step closes it) or none does (the executor's
sweep does)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
import pytest
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.contracts import tasks
from dispo.sdk import DispoError, cell
from pipeline_fixtures import Pipeline, dump, stream_messages, wait_status
from support import eventually

from .test_waits import review_flow, waiting


async def started(pipeline: Pipeline, file_clock) -> None:
    file_clock.set(datetime.now(UTC).replace(microsecond=0))
    await pipeline.start_gateway(**file_clock.env)
    await pipeline.start_executor(**file_clock.env)


async def test_a_pass_closes_its_task_at_the_deadline_and_records_the_call_under_way(
    start_service, catalogue_file, downstream, file_clock, bus
):
    """``a`` is under way (the downstream holds it) when the deadline passes; once it
    answers, its success is recorded, and the pass's next step closes ``b``, which waited
    for it: it is never called."""
    pipeline = Pipeline(start_service, catalogue_file)
    await started(pipeline, file_clock)
    await downstream.control(hold={"path": "/step/a", "effect": True})
    async with pipeline.client() as client:
        task = await client.submit(
            "tests",
            [cell("step", ref="a", name="a"), cell("step", ref="b", name="b").after("a")],
            deadline=file_clock.now + timedelta(seconds=60),
        )
        key = f"{task.task_id}/a.call"
        await eventually(downstream.calls, lambda calls: key in calls, wanted="a under way")
        file_clock.advance(seconds=61)
        await downstream.control(release=True)
        done = await client.wait(task.task_id, timeout=30)

    assert done.status == "FAILED", dump(done)
    assert done.status_reason == "deadline reached"
    assert done.node_statuses == {"a.call": "SUCCEEDED", "b.call": "CANCELLED"}
    assert done.node("b.call").last_error == "deadline reached"
    assert done.deadline == file_clock.now - timedelta(seconds=1)
    assert f"{task.task_id}/b.call" not in await downstream.calls()
    # Failed work goes to the reconciler, as any failure's (its callback follows).
    fails = await stream_messages(bus, tasks.TASK_FAIL)
    assert [task_pb2.Task.FromString(m.data).task_id for m in fails] == [task.task_id]


async def test_the_sweep_closes_a_parked_task_past_its_deadline_leaving_unknown_unknown(
    start_service, catalogue_file, downstream, file_clock, bus
):
    """No pass holds a task parked for recovery: its ``a`` is UNKNOWN (the connection
    dropped after the effect), ``b`` waits for it. Past the deadline the executor's sweep
    closes it: ``b`` CANCELLED, ``a`` still UNKNOWN (its effect may have happened), the task
    FAILED with a terminal status event."""
    pipeline = Pipeline(start_service, catalogue_file)
    await started(pipeline, file_clock)
    await downstream.control(drop={"times": 1, "path": "/once/a", "effect": True})
    async with pipeline.client() as client:
        task = await client.submit(
            "tests",
            [cell("step_once", ref="a", name="a"), cell("step", ref="b", name="b").after("a")],
            deadline=file_clock.now + timedelta(minutes=10),
        )
        parked = await wait_status(client, task.task_id, {"RETRY_EXHAUSTED"})
        assert parked.node_statuses == {"a.call": "UNKNOWN", "b.call": "PENDING"}, dump(parked)
        file_clock.advance(minutes=9)  # not yet: the sweep leaves it
        assert (await client.get(task.task_id)).status == "RETRY_EXHAUSTED"
        file_clock.advance(minutes=1)
        done = await client.wait(task.task_id, timeout=30)

    assert done.status == "FAILED", dump(done)
    assert done.status_reason == "deadline reached"
    assert done.node_statuses == {"a.call": "UNKNOWN", "b.call": "CANCELLED"}
    assert done.node("b.call").last_error == "deadline reached"
    assert f"{task.task_id}/b.call" not in await downstream.calls()
    ended = await stream_messages(
        bus, tasks.task_status_of(task.task_id), stream=tasks.TASK_STATUS.name
    )
    assert ended[-1].subject.endswith(".failed")


async def test_the_deadline_closes_a_task_whose_node_waits_for_a_signal(
    start_service, catalogue_file, downstream, file_clock
):
    """No pass holds a task whose review waits for its verdict (ADR-0102): past the
    deadline the sweep closes it — the waiting node and the ones after it CANCELLED,
    "deadline reached", nothing called — and a verdict sent afterwards is refused."""
    pipeline = Pipeline(start_service, catalogue_file)
    await started(pipeline, file_clock)
    async with pipeline.client() as client:
        task = await client.submit(
            "tests", review_flow("late-review"), deadline=file_clock.now + timedelta(minutes=10)
        )
        view = await waiting(client, task.task_id)
        assert view.status == "RUNNING", dump(view)
        file_clock.advance(minutes=9)  # not yet: it waits on
        assert (await client.get(task.task_id)).node("review.verdict").status == "WAITING"
        file_clock.advance(minutes=1)
        done = await client.wait(task.task_id, timeout=30)
        with pytest.raises(DispoError) as late:
            await client.signal(task.task_id, "verdict", {"verdict": "approved"}, signal_id="r1")

    assert done.status == "FAILED", dump(done)
    assert done.status_reason == "deadline reached"
    assert done.node_statuses == {
        "review.verdict": "CANCELLED",
        "label.call": "CANCELLED",
        "owner.send": "CANCELLED",
    }, dump(done)
    assert done.node("review.verdict").last_error == "deadline reached"
    assert late.value.code == grpc.StatusCode.FAILED_PRECONDITION, late.value
    assert not [k for k in await downstream.calls() if k.startswith(task.task_id)]
