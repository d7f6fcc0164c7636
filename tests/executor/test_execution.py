"""Execution guarantees through real processes: gateway, executor, demo downstream,
PostgreSQL and NATS JetStream."""

from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.executor.v1 import executor_pb2, executor_pb2_grpc
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.contracts import tasks
from dispo.libs.payload import payload_data
from dispo.sdk import cell
from pipeline_fixtures import dump, stream_messages, wait_status, wait_until
from support import eventually
from support.auth import admin_channel


async def test_dependency_failure_blocks_dependant_but_not_independent_branch(client, downstream):
    await downstream.control(fail={"status": 400, "times": 1, "path": "/step/a"})
    task = await client.submit(
        "tests",
        [
            cell("step", ref="a", name="a"),
            cell("step", ref="b", name="b").after("a"),
            cell("step", ref="c", name="c"),
        ],
    )

    done = await client.wait(task.task_id, timeout=30)

    assert done.status == "FAILED", dump(done)
    assert done.node_statuses == {
        "a.call": "FAILED",
        "b.call": "DEPENDENCY_FAILED",
        "c.call": "SUCCEEDED",
    }
    assert "HTTP 400" in done.node("a.call").last_error
    calls = await downstream.calls()
    assert f"{task.task_id}/b.call" not in calls
    assert calls[f"{task.task_id}/a.call"] == 1  # a 4xx is permanent: not retried


async def test_retryable_failure_is_retried_by_republishing_then_succeeds(client, downstream, bus):
    await downstream.control(fail={"status": 503, "times": 2, "path": "/step/r"})
    task = await client.submit("tests", [cell("step", name="r")])

    done = await client.wait(task.task_id, timeout=30)

    assert done.status == "SUCCEEDED", dump(done)
    node = done.node("step.call")
    assert node.attempts == 3
    key = f"{task.task_id}/step.call"
    assert (await downstream.calls())[key] == 3  # same idempotency key on every attempt
    assert (await downstream.effects())[key] == 1
    generations = sorted(
        task_pb2.Task.FromString(m.data).generation
        for m in await stream_messages(bus, "task.create")
    )
    assert generations == [0, 1, 2]  # each short retry travelled as a new task.create


async def test_retry_exhaustion_publishes_task_fail_with_full_state(client, downstream, bus):
    await downstream.control(fail={"status": 500, "times": 1000, "path": "/step/x"})
    task = await client.submit(
        "tests",
        [
            cell("step", ref="x", name="x"),
            cell("step", ref="after", name="y").after("x"),
            cell("noop"),
        ],
    )

    view = await wait_status(client, task.task_id, {"RETRY_EXHAUSTED"})

    assert view.node_statuses == {
        "x.call": "FAILED",
        "after.call": "PENDING",
        "noop.noop": "SUCCEEDED",
    }, dump(view)
    assert view.node("x.call").attempts == 4  # 1 + 3 short retries (default)
    assert (await downstream.calls())[f"{task.task_id}/x.call"] == 4
    [message] = await stream_messages(bus, "task.fail")
    failed = task_pb2.Task.FromString(message.data)
    assert failed.task_id == task.task_id
    x = next(n for n in failed.nodes if n.node_id == "x.call")
    assert x.retry.retryable and x.retry.attempts == 4 and "HTTP 500" in x.last_error
    # Self-contained: the payload travels with it, the canonical JSON bytes as accepted.
    assert payload_data(failed.payloads["x"]) == b'{"name":"x"}'


async def test_degraded_downstream_demotes_its_nodes_while_other_branches_finish(
    pipeline, downstream, bus
):
    await downstream.control(down=True)
    executor = pipeline.executors[0]
    executor.kill()
    await pipeline.start_executor(
        DISPO_EXECUTOR_HEALTH_INTERVAL_SECONDS="0.1", DISPO_EXECUTOR_BREAKER_THRESHOLD="2"
    )
    async with pipeline.client() as client:
        task = await client.submit("tests", [cell("step", name="d"), cell("noop")])

        view = await wait_status(client, task.task_id, {"DEMOTED"})

    assert view.node_statuses == {"step.call": "DEMOTED", "noop.noop": "SUCCEEDED"}, dump(view)
    [message] = await stream_messages(bus, "task.demote")
    assert task_pb2.Task.FromString(message.data).task_id == task.task_id
    async with admin_channel(pipeline.executors[-1].address) as channel:
        reply = await executor_pb2_grpc.ExecutorServiceStub(channel).ListDownstreams(
            executor_pb2.ListDownstreamsRequest()
        )
    breakers = {d.name: d.breaker_state for d in reply.downstreams}
    assert breakers == {
        "demo": executor_pb2.BREAKER_STATE_OPEN,
        "narrow": executor_pb2.BREAKER_STATE_CLOSED,
    }


async def test_redrive_with_a_newer_generation_resumes_from_the_breakpoint(client, downstream, bus):
    """What the reconciler does with a task.fail envelope: name the nodes to reset, bump
    the generation, publish task.create. The executor resets them under its own state
    table: a SUCCEEDED node is never run again, even when named, and node states written
    into the envelope are not adopted."""
    await downstream.control(fail={"status": 500, "times": 4, "path": "/step/x"})
    task = await client.submit(
        "tests",
        [
            cell("step", ref="ok", name="ok"),
            cell("step", ref="x", name="x").after("ok"),
            cell("step", ref="after", name="after").after("x"),
        ],
    )
    await wait_status(client, task.task_id, {"RETRY_EXHAUSTED"})
    [message] = await stream_messages(bus, "task.fail")
    redrive = task_pb2.Task.FromString(message.data)
    for node in redrive.nodes:  # a publisher's picture, not an instruction: ignored
        node.status = common_pb2.NODE_STATUS_PENDING
    redrive.redrive.reset_nodes.extend(["ok.call", "x.call"])
    redrive.generation += 1
    await bus.publish(
        tasks.TASK_CREATE,
        redrive.SerializeToString(),
        msg_id=tasks.create_id(task.task_id, redrive.generation),
    )
    # A stale copy (older generation) arriving late changes nothing.
    await bus.publish("task.create", message.data, msg_id=f"{task.task_id}:stale")

    done = await client.wait(task.task_id, timeout=30)

    assert done.status == "SUCCEEDED", dump(done)
    calls = await downstream.calls()
    assert calls[f"{task.task_id}/ok.call"] == 1
    assert calls[f"{task.task_id}/x.call"] == 5
    assert calls[f"{task.task_id}/after.call"] == 1


async def test_task_close_from_the_reconciler_ends_a_parked_task_in_the_executor(
    client, downstream, bus, service_engine
):
    from dispo.libs.api.common.v1 import common_pb2
    from sqlalchemy import text

    await downstream.control(fail={"status": 500, "times": 1000, "path": "/step/x"})
    task = await client.submit(
        "tests",
        [
            cell("step", ref="x", name="x"),
            cell("step", ref="after", name="y").after("x"),
            cell("step", ref="later", name="z").after("after"),
            cell("noop"),
        ],
    )
    await wait_status(client, task.task_id, {"RETRY_EXHAUSTED"})
    [message] = await stream_messages(bus, "task.fail")
    parked = task_pb2.Task.FromString(message.data)
    engine = await service_engine("executor")

    async def executor_status():
        async with engine.connect() as conn:
            return (
                await conn.execute(
                    text("SELECT status, status_reason FROM task_runs WHERE task_id = :id"),
                    {"id": task.task_id},
                )
            ).one()

    stale = task_pb2.CloseRequest(
        task_id=task.task_id,
        status=common_pb2.TASK_STATUS_FAILED,
        reason="old",
        generation=parked.generation - 1,
    )
    await bus.publish("task.close", stale.SerializeToString(), msg_id=f"{task.task_id}:close:stale")
    close = task_pb2.CloseRequest(
        task_id=task.task_id,
        status=common_pb2.TASK_STATUS_FAILED,
        reason="redrive policy spent",
        generation=parked.generation,
        version=parked.version + 1,
    )
    await bus.publish("task.close", close.SerializeToString(), msg_id=f"{task.task_id}:close")

    row = await eventually(
        executor_status, lambda row: row.status == "failed", timeout=10, wanted="the run failed"
    )
    assert tuple(row) == ("failed", "redrive policy spent")
    # The dependants that had not run end DEPENDENCY_FAILED in the executor's own table.
    async with engine.connect() as conn:
        nodes = dict(
            (
                await conn.execute(
                    text("SELECT node_id, status FROM node_runs WHERE task_id = :id"),
                    {"id": task.task_id},
                )
            ).all()
        )
        version = (
            await conn.execute(
                text("SELECT version FROM task_runs WHERE task_id = :id"), {"id": task.task_id}
            )
        ).scalar_one()
    assert nodes == {
        "x.call": "failed",
        "after.call": "dependency_failed",
        "later.call": "dependency_failed",
        "noop.noop": "succeeded",
    }
    # The next snapshot from the executor comes after the closer's final one.
    assert version == parked.version + 1


async def test_task_close_ends_demoted_nodes_failed_and_their_dependants(
    pipeline, downstream, bus, service_engine
):
    from sqlalchemy import text

    await downstream.control(down=True)
    pipeline.executors[0].kill()
    await pipeline.start_executor(
        DISPO_EXECUTOR_HEALTH_INTERVAL_SECONDS="0.1", DISPO_EXECUTOR_BREAKER_THRESHOLD="2"
    )
    async with pipeline.client() as client:
        task = await client.submit(
            "tests", [cell("step", ref="d", name="d"), cell("step", ref="e", name="e").after("d")]
        )
        await wait_status(client, task.task_id, {"DEMOTED"})
    [message] = await stream_messages(bus, "task.demote")
    parked = task_pb2.Task.FromString(message.data)
    close = task_pb2.CloseRequest(
        task_id=task.task_id,
        status=common_pb2.TASK_STATUS_FAILED,
        reason="demoted too long",
        generation=parked.generation,
        version=parked.version + 1,
    )
    await bus.publish("task.close", close.SerializeToString(), msg_id=f"{task.task_id}:close")
    engine = await service_engine("executor")

    async def nodes():
        async with engine.connect() as conn:
            return {
                r.node_id: (r.status, r.last_error)
                for r in await conn.execute(
                    text("SELECT node_id, status, last_error FROM node_runs WHERE task_id = :id"),
                    {"id": task.task_id},
                )
            }

    found = await eventually(
        nodes, lambda n: n["d.call"][0] == "failed", timeout=10, wanted="the demoted node failed"
    )
    assert found == {
        "d.call": ("failed", "demoted too long"),
        "e.call": ("dependency_failed", "a dependency failed"),
    }


async def test_ready_nodes_run_concurrently_within_their_downstream_limit(client, downstream):
    await downstream.control(hold={"path": "/narrow/"})
    task = await client.submit(
        "tests",
        [cell("narrow_step", ref=f"n{i}", name=f"n{i}") for i in range(3)]
        + [cell("step", name="wide")],
    )

    await downstream.wait_held(2)  # two calls to `narrow` in flight at once, its limit
    view = await wait_until(
        client,
        task.task_id,
        lambda v: (
            list(v.node_statuses.values()).count("RUNNING") == 2
            and v.node_statuses["step.call"] == "SUCCEEDED"
        ),
    )
    # the third waits for a slot (not even claimed), while the other downstream's node finished
    assert sorted(view.node_statuses.values()) == ["PENDING", "RUNNING", "RUNNING", "SUCCEEDED"], (
        dump(view)
    )
    assert (await downstream.state())["held"] == 2
    await downstream.control(release=True)  # held calls answer 503: retried, then succeed

    done = await client.wait(task.task_id, timeout=60)

    assert done.status == "SUCCEEDED", dump(done)
