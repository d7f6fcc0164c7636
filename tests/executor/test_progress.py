"""A running task's progress is published at most once per progress interval, on the
executor's clock (ADR-0059): here the shared file clock, which moves only when the test
moves it, so what is published before and after the interval is exact."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
from dispo.executor.actions import http_session
from dispo.executor.envelope import overlay_row
from dispo.executor.passes import Opening
from dispo.executor.runner import Executor, ExecutorConfig, Progress
from dispo.executor.store.status_events import outbox
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.outbox import OutboxRelay
from dispo.sdk import cell
from pipeline_fixtures import Pipeline, dump, wait_until
from sqlalchemy import text


async def test_progress_waits_for_the_interval_and_a_settlement_is_published_at_once(
    start_service, catalogue_file, downstream, file_clock
):
    file_clock.set(datetime.now(UTC))
    pipeline = Pipeline(start_service, catalogue_file)
    await pipeline.start_gateway()
    await pipeline.start_executor(**file_clock.env, DISPO_EXECUTOR_PROGRESS_INTERVAL_SECONDS="1")
    async with pipeline.client() as client:
        # Within the interval: two calls, one after the other, and one status event, the
        # settlement's, saying all of it.
        quick = await client.submit("tests", [cell("pair", name="quick")])
        done = await client.wait(quick.task_id, timeout=30)
        assert done.status == "SUCCEEDED", dump(done)
        [event] = await client.events(quick.task_id)
        assert event.status == "SUCCEEDED" and event.previous_status == ""
        assert sorted((c.node_id, c.old_status, c.new_status, c.new_attempts)
                      for c in event.changes) == [
            ("pair.first", "", "SUCCEEDED", 1), ("pair.second", "", "SUCCEEDED", 1)
        ]  # fmt: skip

        # A call under way: its pass has progress (the first call ended, the second is
        # claimed), and nothing of it is published while the clock stands still.
        await downstream.control(hold={"path": "/pair/slow/second", "effect": True})
        slow = await client.submit("tests", [cell("pair", name="slow")])
        await downstream.wait_held(1)
        assert await client.events(slow.task_id) == ()
        assert (await client.get(slow.task_id)).status == "ACCEPTED"

        file_clock.advance(seconds=1)  # the interval has passed: the newest state, once
        view = await wait_until(
            client,
            slow.task_id,
            lambda v: v.status == "RUNNING",
            wanted="the progress published",
        )
        assert [(n.node_id, n.status, n.attempts) for n in view.nodes] == [
            ("pair.first", "SUCCEEDED", 1),
            ("pair.second", "RUNNING", 1),
        ], dump(view)

        await downstream.control(release=True)  # the held call answers: the task settles
        done = await client.wait(slow.task_id, timeout=30)
        assert done.status == "SUCCEEDED", dump(done)
        events = await client.events(slow.task_id)
        assert [e.status for e in events] == ["RUNNING", "SUCCEEDED"]
        assert [(c.node_id, c.new_status) for c in events[1].changes] == [
            ("pair.second", "SUCCEEDED")
        ]


async def test_a_progress_event_is_written_only_while_its_pass_holds_the_lease(
    service_engine, service_db, bus, manual_clock
):
    """The progress flush locks each task and writes its snapshot only while the pass that
    asked still holds the lease of a RUNNING task: a task taken over by another pass, or
    whose pass ended (its last event already said everything), gets nothing."""
    engine = await service_engine("executor")
    db = await service_db("executor")
    http, health = http_session(), httpx.AsyncClient()
    executor = Executor(
        db, OutboxRelay(db, outbox, bus), {}, manual_clock, ExecutorConfig(), http, health
    )
    try:
        envs = [running(task_id) for task_id in ("mine", "taken", "ended")]
        async with db.transaction() as conn:
            steps = await executor.passes.open_many(
                conn, [Opening(e, "me") for e in envs], manual_clock.now()
            )
            assert [s.state.unreported for s in steps] == [True] * 3  # a.x ran; b.y is to launch
            await conn.fetch("UPDATE task_runs SET lease_owner = 'other' WHERE task_id = 'taken'")
            await conn.fetch(
                "UPDATE task_runs SET status = 'succeeded', lease_owner = NULL"
                " WHERE task_id = 'ended'"
            )
            before = {r.task_id: r.version for r in await conn.fetch("SELECT * FROM task_runs")}
        written = await executor.flushes.progress(
            [Progress("mine", "me"), Progress("taken", "me"), Progress("ended", "me")]
        )
        assert written == [True, False, False]
        async with engine.connect() as conn:
            events = (
                await conn.execute(
                    text("SELECT msg_id, payload FROM outbox WHERE subject LIKE 'task.status.%'")
                )
            ).all()
            rows = {r.node_id: r for r in await conn.execute(
                text("SELECT *, octet_length(output) AS output_bytes FROM node_runs WHERE task_id = 'mine'"))}  # fmt: skip
        [(msg_id, payload)] = events
        snapshot = task_pb2.Task.FromString(payload)
        assert (snapshot.task_id, snapshot.status) == ("mine", common_pb2.TASK_STATUS_RUNNING)
        assert snapshot.version == before["mine"] + 1 and msg_id == f"mine:v{snapshot.version}"
        expected = task_pb2.Task()
        expected.CopyFrom(snapshot)
        for node in expected.nodes:
            overlay_row(node, rows[node.node_id])
        assert snapshot == expected  # the rows as they are
        assert [n.status for n in snapshot.nodes] == [
            common_pb2.NODE_STATUS_SUCCEEDED,
            common_pb2.NODE_STATUS_PENDING,
        ]
    finally:
        await http.close()
        await health.aclose()


def running(task_id: str) -> task_pb2.Task:
    """A task whose first step runs a noop and launches an HTTP call: it goes on running."""
    env = task_pb2.Task(task_id=task_id, business="b", status=common_pb2.TASK_STATUS_ACCEPTED)
    env.nodes.add(
        node_id="a.x", status=common_pb2.NODE_STATUS_PENDING, spec=task_pb2.ActionSpec(kind="noop")
    )
    env.nodes.add(
        node_id="b.y",
        depends_on=["a.x"],
        status=common_pb2.NODE_STATUS_PENDING,
        spec=task_pb2.ActionSpec(kind="http", downstream="up", path="/"),
    )
    return env
