"""Crashes and duplicates: SIGKILLed executor mid-node, the same task.create delivered to
two executors, NATS stopped while tasks are being accepted, a SIGKILLed gateway with
unpublished outbox rows, a PostgreSQL crash mid-node, malformed events."""

import asyncio

import pytest
from dispo.libs.api.task.v1 import task_pb2
from dispo.sdk import cell
from pipeline_fixtures import dump, stream_messages, wait_status
from sqlalchemy import text
from support import eventually


async def test_executor_killed_mid_call_of_idempotent_node_reruns_it_safely(pipeline, downstream):
    await downstream.control(hold={"path": "/step/mid"})
    async with pipeline.client() as client:
        task = await client.submit(
            "tests",
            [cell("step", ref="pre", name="pre"), cell("step", ref="mid", name="mid").after("pre")],
        )
        await downstream.wait_held()
        pipeline.executors[0].kill()  # SIGKILL while the downstream holds the call open
        await downstream.control(release=True)
        others = [
            await client.submit("tests", [cell("step", ref="o", name=f"o{i}")]) for i in range(5)
        ]
        await pipeline.start_executor()

        done = await client.wait(task.task_id, timeout=60)
        finished = [await client.wait(o.task_id, timeout=60) for o in others]

    assert done.status == "SUCCEEDED", dump(done)
    assert all(f.status == "SUCCEEDED" for f in finished)
    calls, effects = await downstream.calls(), await downstream.effects()
    assert calls[f"{task.task_id}/pre.call"] == 1  # succeeded node never re-executed
    assert calls[f"{task.task_id}/mid.call"] == 2  # interrupted idempotent node re-run, same key
    assert effects[f"{task.task_id}/mid.call"] == 1
    assert done.node("mid.call").attempts == 2


async def test_executor_killed_mid_call_of_non_idempotent_node_leaves_it_unknown(
    pipeline, downstream, bus
):
    await downstream.control(hold={"path": "/once/"})
    async with pipeline.client() as client:
        task = await client.submit(
            "tests",
            [
                cell("step", ref="pre", name="pre"),
                cell("step_once", ref="mid", name="mid").after("pre"),
                cell("step", ref="post", name="post").after("mid"),
                cell("step", ref="side", name="side"),
            ],
        )
        await downstream.wait_held()
        pipeline.executors[0].kill()
        await downstream.control(release=True)
        await pipeline.start_executor()

        view = await wait_status(client, task.task_id, {"RETRY_EXHAUSTED"}, timeout=60)

    assert view.node_statuses == {
        "pre.call": "SUCCEEDED",
        "mid.call": "UNKNOWN",
        "post.call": "PENDING",
        "side.call": "SUCCEEDED",
    }, dump(view)
    calls = await downstream.calls()
    assert calls[f"{task.task_id}/pre.call"] == 1
    assert calls[f"{task.task_id}/mid.call"] == 1  # never silently repeated
    assert f"{task.task_id}/post.call" not in calls
    # handed to recovery with its full state (the reconciler settles it by the probe)
    [message] = await stream_messages(bus, "task.fail")
    failed = task_pb2.Task.FromString(message.data)
    mid = next(n for n in failed.nodes if n.node_id == "mid.call")
    assert mid.spec.probe_path == f"/effects/{task.task_id}/mid.call"


async def test_same_task_create_delivered_to_two_executors_runs_each_effect_once(
    pipeline, downstream, bus, database_url
):
    await pipeline.start_executor()  # two executor processes on the same durable consumer
    await downstream.control(delay_ms=300)
    async with pipeline.client() as client:
        task = await client.submit(
            "tests", [cell("pair", name="p"), cell("step", name="s"), cell("step_once", name="o")]
        )
        [original] = await wait_for_messages(bus, "task.create", 1)
        # The same envelope published again under another message id: a duplicate delivery.
        await bus.publish("task.create", original.data, msg_id=f"{task.task_id}:duplicate")
        done = await client.wait(task.task_id, timeout=60)

    assert done.status == "SUCCEEDED", dump(done)
    calls = await downstream.calls()
    for node in ("pair.first", "pair.second", "step.call", "step_once.call"):
        assert calls[f"{task.task_id}/{node}"] == 1, node
    info = await bus.js.consumer_info("TASKS", "executor")
    assert info.delivered.consumer_seq >= 2


async def test_two_executors_given_every_task_of_a_batch_run_each_effect_once(
    pipeline, downstream, bus
):
    """Each executor opens a batch of passes in one transaction; with every task.create
    delivered to both (two durables), the batches overlap task by task, and still every
    node runs once: the HTTP calls counted by the downstream, the noop nodes by their
    attempts.

    Both run with leases far longer than the test: a heartbeat starved on a loaded machine
    must not hand a task to the twin mid-call (a legitimate re-run under the same key, but
    not what is tested here; the kill tests cover lease expiry)."""
    long_lease = {"DISPO_EXECUTOR_LEASE_TTL_SECONDS": "120"}
    pipeline.executors[0].kill()  # idle: it holds no lease
    await pipeline.start_executor(**long_lease)
    await pipeline.start_executor(DISPO_EXECUTOR_DURABLE="executor-twin", **long_lease)
    count = 40
    async with pipeline.client() as client:
        submitted = await asyncio.gather(
            *(
                client.submit(
                    "tests",
                    [
                        cell("noop", ref="first"),
                        cell("step", ref="s", name=f"s{i}").after("first"),
                        cell("noop", ref="last").after("s"),
                    ]
                    if i % 2
                    else [cell("noop", ref="a"), cell("noop", ref="b").after("a")],
                )
                for i in range(count)
            )
        )
        done = await asyncio.gather(*(client.wait(t.task_id, timeout=90) for t in submitted))

    assert [d.status for d in done] == ["SUCCEEDED"] * count, [dump(d) for d in done]
    calls = await downstream.calls()
    for i, task in enumerate(submitted):
        if i % 2:
            assert calls[f"{task.task_id}/s.call"] == 1
    for view in done:
        assert [n.attempts for n in view.nodes] == [1] * len(view.nodes), dump(view)
    for durable in ("executor", "executor-twin"):  # both were handed every task
        info = await bus.js.consumer_info("TASKS", durable)
        assert info.delivered.consumer_seq >= count, durable


async def wait_for_messages(bus, subject, count, timeout=10.0):
    return await eventually(
        lambda: stream_messages(bus, subject),
        lambda messages: len(messages) >= count,
        timeout=timeout,
        wanted=f"{count} message(s) on {subject}",
        describe=len,
    )


async def test_nats_down_during_submits_every_accepted_task_completes(
    pipeline, infra, downstream, service_engine
):
    async with pipeline.client() as client:
        before = [await client.submit("tests", [cell("step", name=f"b{i}")]) for i in range(3)]
        infra.nats.stop()
        during = [await client.submit("tests", [cell("step", name=f"d{i}")]) for i in range(10)]
        engine = await service_engine("gateway")
        async with engine.connect() as conn:
            unsent = (
                await conn.execute(text("SELECT count(*) FROM outbox WHERE sent_at IS NULL"))
            ).scalar()
        infra.restart_nats()

        results = [await client.wait(t.task_id, timeout=90) for t in before + during]

    assert unsent >= 1  # accepted while NATS was down: recorded, published later
    assert [r.status for r in results] == ["SUCCEEDED"] * 13
    calls = await downstream.calls()
    assert all(calls[f"{t.task_id}/step.call"] == 1 for t in before + during)


async def test_malformed_events_are_refused_and_do_not_block_the_consumers(client, bus):
    bad_dag = task_pb2.Task(task_id="bad1")
    bad_dag.nodes.add(node_id="a", depends_on=["ghost"], spec=task_pb2.ActionSpec(kind="noop"))
    bad_kind = task_pb2.Task(task_id="bad2")
    bad_kind.nodes.add(node_id="a", spec=task_pb2.ActionSpec(kind="shell"))
    for i, data in enumerate(
        [
            b"\xff\x00garbage",
            bad_dag.SerializeToString(),
            bad_kind.SerializeToString(),
            task_pb2.Task().SerializeToString(),
        ]
    ):
        await bus.publish("task.create", data, msg_id=f"malformed-{i}")
    await bus.publish("task.status.x", b"\xff\x00garbage", msg_id="malformed-status")
    await bus.publish("task.cancel", b"\xff\x00garbage", msg_id="malformed-cancel")

    task = await client.submit("tests", [cell("noop")])
    done = await client.wait(task.task_id, timeout=30)

    assert done.status == "SUCCEEDED"
    for stream, durable in (
        ("TASKS", "executor"),
        ("TASKS", "executor-cancel"),
        ("TASK_STATUS", "gateway-status"),
    ):
        info = await settled(bus, stream, durable)
        assert info.num_redelivered == 0, durable  # terminated at once, never retried


async def settled(bus, stream, durable, timeout=10.0):
    """Consumer info once nothing is waiting for an ack."""
    return await eventually(
        lambda: bus.js.consumer_info(stream, durable),
        lambda info: info.num_ack_pending == 0 and info.num_pending == 0,
        timeout=timeout,
        wanted=f"{durable} settled",
    )


async def test_gateway_killed_before_publishing_loses_no_accepted_task(pipeline, infra, downstream):
    async with pipeline.client() as client:
        infra.nats.stop()  # accepted tasks stay in the gateway's outbox
        accepted = [await client.submit("tests", [cell("step", name=f"g{i}")]) for i in range(5)]
    pipeline.gateway.kill()  # SIGKILL: the outbox rows were never published
    infra.restart_nats()
    await pipeline.gateway.restart()

    async with pipeline.client() as client:
        results = [await client.wait(t.task_id, timeout=60) for t in accepted]

    assert [r.status for r in results] == ["SUCCEEDED"] * 5
    calls = await downstream.calls()
    assert all(calls[f"{t.task_id}/step.call"] == 1 for t in accepted)


async def test_postgres_crash_loses_no_accepted_task_and_refuses_submits_while_down(
    pipeline, infra, downstream
):
    import grpc
    from dispo.sdk import DispoError

    await downstream.control(hold={"path": "/step/inflight"})
    async with pipeline.client() as client:
        inflight = await client.submit("tests", [cell("step", name="inflight")])
        await downstream.wait_held()
        infra.postgres.stop("immediate")  # a crash: no checkpoint, connections cut
        await downstream.control(release=True)
        with pytest.raises(DispoError) as refused:
            await client.submit("tests", [cell("step", name="refused")])
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE
        infra.postgres.start()
        after = [await client.submit("tests", [cell("step", name=f"a{i}")]) for i in range(3)]

        results = [await client.wait(t.task_id, timeout=90) for t in [inflight, *after]]

    assert [r.status for r in results] == ["SUCCEEDED"] * 4
    effects = await downstream.effects()
    assert effects[f"{inflight.task_id}/step.call"] == 1
    assert not any("refused" in key for key in await downstream.calls())
