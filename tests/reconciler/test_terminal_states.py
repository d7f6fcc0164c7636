"""Terminal states tell the truth, with the real pipeline (gateway, executor, reconciler
processes, the demo downstream, PostgreSQL and NATS): a task that ends FAILED shows its
dependants DEPENDENCY_FAILED everywhere, any FAILED task can be resumed through the
reconciler, and parked work ends visibly when it waits longer than its age limit."""

from __future__ import annotations

from typing import Any

import asyncpg
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.libs.api.task.v1 import task_pb2
from dispo.sdk import cell
from pipeline_fixtures import dump, stream_messages, wait_until
from support import eventually

from . import test_end_to_end as e2e

DEPENDENCY_FAILED = common_pb2.NODE_STATUS_DEPENDENCY_FAILED


async def executor_nodes(database_url: str, task_id: str) -> dict[str, str]:
    """The executor's own node table (read here only to check it)."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT node_id, status FROM executor.node_runs WHERE task_id = $1", task_id
        )
    finally:
        await conn.close()
    return {r["node_id"]: r["status"] for r in rows}


async def failed_snapshots(bus: Any, task_id: str) -> list[task_pb2.Task]:
    return [
        task_pb2.Task.FromString(m.data)
        for m in await stream_messages(bus, f"task.status.{task_id}.failed", stream="TASK_STATUS")
    ]


async def test_a_task_failed_after_its_redrives_shows_its_dependants_dependency_failed(
    pipeline, downstream, reconciler, bus, database_url
):
    await downstream.control(fail={"status": 503, "times": 1000, "path": "/step/x"})
    async with pipeline.client() as client:
        task = await client.submit(
            "flaky",  # max_redrives 1
            [
                cell("step", ref="x", name="x"),
                cell("step", ref="after", name="after").after("x"),
                cell("step", ref="last", name="last").after("after"),
                cell("noop"),
            ],
        )
        await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_PARKED_FAILED)
        await reconciler.sweep(11, "redrive")
        await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_FAILED)
        view = await client.wait(task.task_id, timeout=30)

    assert view.status == "FAILED", dump(view)
    expected = {
        "x.call": "FAILED",
        "after.call": "DEPENDENCY_FAILED",
        "last.call": "DEPENDENCY_FAILED",
        "noop.noop": "SUCCEEDED",
    }
    assert view.node_statuses == expected, dump(view)  # the gateway's view
    assert view.node("after.call").last_error == "a dependency failed"
    # Every FAILED status event says so, not only the last one the gateway kept.
    snapshots = await failed_snapshots(bus, task.task_id)
    assert snapshots
    for snap in snapshots:
        statuses = {n.node_id: n.status for n in snap.nodes}
        assert statuses["after.call"] == statuses["last.call"] == DEPENDENCY_FAILED
    # The executor's own table agrees (task.close).
    await eventually(
        lambda: executor_nodes(database_url, task.task_id),
        lambda nodes: (
            nodes
            == {
                "x.call": "failed",
                "after.call": "dependency_failed",
                "last.call": "dependency_failed",
                "noop.noop": "succeeded",
            }
        ),
        timeout=10,
        wanted="the executor's dependants dependency_failed",
    )
    calls = await downstream.calls()
    assert f"{task.task_id}/after.call" not in calls

    # Resumed from its failure once the downstream is fixed: the FAILED node and the
    # DEPENDENCY_FAILED ones behind it run again; the task goes back to RUNNING, then ends.
    await downstream.control(reset=True)
    async with pipeline.client() as client:
        reply = await reconciler.stub.RedriveTask(
            pb.RedriveTaskRequest(task_id=task.task_id, actor="ops", reason="labels fixed")
        )
        assert reply.task.state == pb.RECOVERY_STATE_REDRIVEN
        done = await wait_until(
            client, task.task_id, lambda v: v.status == "SUCCEEDED", wanted="SUCCEEDED"
        )
    assert set(done.node_statuses.values()) == {"SUCCEEDED"}, dump(done)
    assert done.version > view.version
    calls = await downstream.calls()
    assert calls[f"{task.task_id}/after.call"] == calls[f"{task.task_id}/last.call"] == 1


async def test_a_permanent_failure_is_resumed_from_its_failure_through_the_reconciler(
    pipeline, downstream, reconciler, database_url
):
    await downstream.control(fail={"status": 400, "times": 1, "path": "/step/bad"})
    async with pipeline.client() as client:
        task = await client.submit(
            "tests",
            [
                cell("step", ref="ok", name="ok"),
                cell("step", ref="bad", name="bad"),
                cell("step", ref="dep", name="dep").after("bad"),
            ],
        )
        view = await client.wait(task.task_id, timeout=30)
        assert view.status == "FAILED", dump(view)
        assert view.node_statuses["dep.call"] == "DEPENDENCY_FAILED", dump(view)
        # The reconciler holds it (it did not before: RedriveTask answered NOT_FOUND).
        held = await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_FAILED)
        assert "HTTP 400" in held.reason and held.error_class == "http_4xx"

        reply = await reconciler.stub.RedriveTask(
            pb.RedriveTaskRequest(task_id=task.task_id, actor="ops", reason="label rule fixed")
        )
        assert reply.task.state == pb.RECOVERY_STATE_REDRIVEN
        done = await wait_until(
            client, task.task_id, lambda v: v.status == "SUCCEEDED", wanted="SUCCEEDED"
        )

    assert done.node_statuses == {
        "ok.call": "SUCCEEDED",
        "bad.call": "SUCCEEDED",
        "dep.call": "SUCCEEDED",
    }, dump(done)
    calls = await downstream.calls()
    assert calls[f"{task.task_id}/ok.call"] == 1  # succeeded before: never called again
    assert calls[f"{task.task_id}/bad.call"] == 2  # the refused call, then the resumed one
    assert calls[f"{task.task_id}/dep.call"] == 1
    await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_RESOLVED)
    detail = await reconciler.stub.GetRecoveryTask(pb.GetRecoveryTaskRequest(task_id=task.task_id))
    [resume] = detail.redrives
    assert resume.trigger == pb.REDRIVE_TRIGGER_RESUME
    assert sorted(resume.nodes_reset) == ["bad.call", "dep.call"]
    await eventually(
        lambda: executor_nodes(database_url, task.task_id),
        lambda nodes: set(nodes.values()) == {"succeeded"},
        timeout=10,
        wanted="the executor's nodes all succeeded",
    )


async def test_demoted_past_its_age_limit_ends_failed_with_the_reason_then_resumes(
    pipeline, downstream, start_reconciler, database_url
):
    reconciler = await start_reconciler(DISPO_RECONCILER_DEMOTED_MAX_AGE_SECONDS="60")
    await e2e.demote_from_now_on(pipeline, downstream)
    async with pipeline.client() as client:
        task = await client.submit(
            "tests", [cell("step", ref="d", name="d"), cell("step", ref="e", name="e").after("d")]
        )
        await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_DEMOTED)
        await reconciler.sweep(58, "expire")  # within its limit: still demoted
        assert (await reconciler.held(task.task_id)).state == pb.RECOVERY_STATE_DEMOTED
        assert (await client.get(task.task_id)).status == "DEMOTED"

        await reconciler.sweep(3, "expire")
        held = await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_FAILED)
        view = await client.wait(task.task_id, timeout=30)

        assert view.status == "FAILED", dump(view)
        assert view.status_reason == held.reason
        assert view.status_reason.startswith(
            "age limit reached: demoted, waiting for downstream demo"
        )
        assert "(limit 60 s)" in view.status_reason
        assert view.node_statuses == {"d.call": "FAILED", "e.call": "DEPENDENCY_FAILED"}, dump(view)
        assert view.node("d.call").last_error == held.reason
        await eventually(
            lambda: executor_nodes(database_url, task.task_id),
            lambda nodes: nodes == {"d.call": "failed", "e.call": "dependency_failed"},
            timeout=10,
            wanted="the executor's table agrees",
        )
        # In the one list of failed and parked work, then resumed once the downstream is back.
        listed = await reconciler.stub.ListFailedWork(
            pb.ListFailedWorkRequest(filter=pb.FailedWorkFilter(kinds=[pb.WORK_KIND_FAILED]))
        )
        assert [(w.task.task_id, w.task.reason) for w in listed.work] == [
            (task.task_id, held.reason)
        ]
        await downstream.control(down=False)
        await reconciler.stub.RedriveTask(pb.RedriveTaskRequest(task_id=task.task_id, actor="ops"))
        for _ in range(200):  # re-demoted while the breaker recovers: released as it heals
            await reconciler.tick()
            done = await client.get(task.task_id)
            if done.status == "SUCCEEDED":
                break
    assert done.node_statuses == {"d.call": "SUCCEEDED", "e.call": "SUCCEEDED"}, dump(done)
