"""Recovery with the real pipeline: gateway, executor and reconciler processes, the demo
downstream as a real process. The reconciler's clock is a file the test moves, so no
test sleeps through a backoff; the executor keeps its fast test timings."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from dispo.auth.signing import signature
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.executor.v1 import executor_pb2, executor_pb2_grpc
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.sdk import cell
from outbox_subjects import assert_outbox_subjects_declared
from pipeline_fixtures import dump, wait_status, wait_until
from support import eventually
from support.auth import admin_channel, signing_secret


@pytest.fixture
def egress_allow(downstream, receiver) -> str:
    """The gateway's and the reconciler's allow-list: the demo downstream and the callbacks'
    receiver (overrides the pipeline's)."""
    return f"{downstream.url},{receiver.server.url}"


async def test_retry_exhaustion_redriven_after_backoff_succeeds_without_rerunning_succeeded_nodes(
    pipeline, downstream, reconciler
):
    await downstream.control(fail={"status": 500, "times": 4, "path": "/step/x"})
    async with pipeline.client() as client:
        task = await client.submit(
            "tests",
            [
                cell("step", ref="ok", name="ok"),
                cell("step", ref="x", name="x").after("ok"),
                cell("step", ref="after", name="after").after("x"),
                cell("noop"),
            ],
        )
        await wait_status(client, task.task_id, {"RETRY_EXHAUSTED"})
        held = await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_PARKED_FAILED)
        assert held.error_class == "http_5xx" and list(held.downstreams) == ["demo"]
        calls_before = await downstream.calls()
        assert (
            calls_before[f"{task.task_id}/ok.call"] == 1
            and calls_before[f"{task.task_id}/x.call"] == 4
        )

        assert (await reconciler.sweep(9, "redrive"))["redrive"] == 0  # backoff is 10 s: not yet
        assert (await reconciler.held(task.task_id)).state == pb.RECOVERY_STATE_PARKED_FAILED
        await reconciler.sweep(1.5, "redrive")  # due now
        done = await client.wait(task.task_id, timeout=30)

    assert done.status == "SUCCEEDED", dump(done)
    calls = await downstream.calls()
    assert calls[f"{task.task_id}/ok.call"] == 1  # succeeded before the failure: not called again
    assert calls[f"{task.task_id}/x.call"] == 5
    assert calls[f"{task.task_id}/after.call"] == 1
    resolved = await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_RESOLVED)
    assert resolved.redrives == 1


async def test_spent_policy_shows_the_task_failed_with_the_reason_through_the_gateway(
    pipeline, downstream, reconciler, database_url
):
    await downstream.control(fail={"status": 503, "times": 1000, "path": "/step/x"})
    async with pipeline.client() as client:
        task = await client.submit("flaky", [cell("step", ref="x", name="x"), cell("noop")])
        await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_PARKED_FAILED)
        await reconciler.sweep(11, "redrive")
        await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_FAILED)
        view = await client.wait(task.task_id, timeout=30)

    assert view.status == "FAILED", dump(view)
    assert "redrive policy spent: 1 of 1 redrives used" in view.status_reason
    assert "HTTP 503" in view.status_reason
    assert (await downstream.calls())[
        f"{task.task_id}/x.call"
    ] == 8  # two rounds of 1 + 3 short retries
    # task.close: the executor's own record agrees (read here only to check it).
    import asyncpg

    conn = await asyncpg.connect(database_url)
    try:
        await eventually(
            lambda: conn.fetchval(
                "SELECT status FROM executor.task_runs WHERE task_id = $1", task.task_id
            ),
            lambda recorded: recorded == "failed",
            timeout=10,
            wanted="the executor's run failed",
        )
    finally:
        await conn.close()
    # task.create, task.status, task.fail, task.close from all three services' outboxes.
    await assert_outbox_subjects_declared(
        database_url, schemas={"gateway", "executor", "reconciler"}
    )


async def test_callback_down_then_up_is_notified_once(
    pipeline, downstream, reconciler, bus, receiver, database_url
):
    import json

    secret = await signing_secret(database_url, "tests")
    # The receiver is not listening yet: the caller is down.
    subscription = await bus.nc.subscribe("callbacks.tests.done")
    try:
        async with pipeline.client() as client:
            task = await client.submit(
                "tests", [cell("step", name="cb")], callback_url=receiver.url
            )
            by_nats = await client.submit(
                "tests", [cell("noop")], callback_url="nats:callbacks.tests.done"
            )
            await client.wait(task.task_id, timeout=30)
            await client.wait(by_nats.task_id, timeout=30)

        async def facts():
            try:
                return await reconciler.stub.GetCompletion(
                    pb.GetCompletionRequest(task_id=task.task_id)
                )
            except grpc.aio.AioRpcError:
                return None

        for _ in range(100):
            await reconciler.tick()
            reply = await facts()
            if reply is not None and reply.completion.notify_attempts >= 1:
                break
        assert (
            reply.completion.notify_state == pb.NOTIFY_STATE_PENDING and not reply.deliveries[0].ok
        )
        await receiver.start()
        for _ in range(100):
            await reconciler.tick(2)
            if receiver.received:
                break
        await reconciler.sweep(60)  # later rounds deliver nothing more; the reconcile sweep runs
        reply = await facts()
        message = await subscription.next_msg(timeout=10)
    finally:
        await receiver.stop()
        await subscription.unsubscribe()
    assert len(receiver.received) == 1
    assert json.loads(receiver.received[0]["body"])["task_id"] == task.task_id
    headers = receiver.received[0]["headers"]
    assert headers["X-Dispo-Signature"] == signature(
        secret, headers["X-Dispo-Timestamp"], receiver.received[0]["body"]
    )
    assert reply.completion.notify_state == pb.NOTIFY_STATE_DELIVERED and reply.completion.HasField(
        "notified_at"
    )
    assert [d.ok for d in reply.deliveries][-1] and not reply.deliveries[0].ok
    assert reply.completion.reconcile_state == pb.RECONCILE_STATE_MATCHED
    assert json.loads(message.data)["task_id"] == by_nats.task_id


async def demote_from_now_on(pipeline: Any, downstream: Any) -> None:
    """The downstream down, and the pipeline's executor replaced by one whose breaker opens
    after two failures and whose health checks run every 0.1 s: work for the downstream is
    demoted at once, and released soon after the downstream is back."""
    await downstream.control(down=True)
    pipeline.executors[0].kill()
    await pipeline.start_executor(
        DISPO_EXECUTOR_HEALTH_INTERVAL_SECONDS="0.1",
        DISPO_EXECUTOR_BREAKER_THRESHOLD="2",
        DISPO_EXECUTOR_BREAKER_COOLDOWN_SECONDS="0.5",
    )


async def test_downstream_down_demotes_then_released_at_the_rate_and_completed(
    pipeline, downstream, reconciler, database_url
):
    await demote_from_now_on(pipeline, downstream)
    async with pipeline.client() as client:
        tasks = [
            await client.submit("tests", [cell("step", name=f"d{i}"), cell("noop")])
            for i in range(5)
        ]
        for task in tasks:
            view = await wait_status(client, task.task_id, {"DEMOTED"})
            assert view.node_statuses == {"step.call": "DEMOTED", "noop.noop": "SUCCEEDED"}, dump(
                view
            )
            await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_DEMOTED)
        depth = {
            d.name: d
            for d in (
                await reconciler.stub.ListDownstreams(pb.ListDownstreamsRequest())
            ).downstreams
        }
        assert depth["demo"].demoted_depth == 5

        for _ in range(6):  # still down: probed, nothing released
            assert (await reconciler.sweep())["release"] == 0
        assert [(await reconciler.held(t.task_id)).state for t in tasks] == [
            pb.RECOVERY_STATE_DEMOTED
        ] * 5

        await downstream.control(down=False)
        for _ in range(200):
            await reconciler.tick()
            views = [await client.get(t.task_id) for t in tasks]
            if all(v.status == "SUCCEEDED" for v in views):
                break
        assert [v.status for v in views] == ["SUCCEEDED"] * 5, [dump(v) for v in views]

    released = []
    for task in tasks:
        detail = await reconciler.stub.GetRecoveryTask(
            pb.GetRecoveryTaskRequest(task_id=task.task_id)
        )
        released += [
            r.at.ToDatetime().timestamp()
            for r in detail.redrives
            if r.trigger == pb.REDRIVE_TRIGGER_RELEASE
        ]
    released.sort()
    assert len(released) >= 5
    # Rate 2/s, bucket 2: any T seconds of the reconciler's clock see at most 2 + 2·T releases.
    for i in range(len(released)):
        for j in range(i, len(released)):
            assert j - i + 1 <= 2 + 2 * (released[j] - released[i]) + 1e-6
    calls = await downstream.calls()
    assert all(
        calls[f"{t.task_id}/noop.noop"] == 0 for t in tasks if f"{t.task_id}/noop.noop" in calls
    )
    await assert_outbox_subjects_declared(  # task.demote and the releases' task.create
        database_url, schemas={"gateway", "executor", "reconciler"}
    )


async def test_a_release_waits_for_the_executors_breaker_not_only_the_health_url(
    pipeline, downstream, reconciler
):
    """The downstream goes down and comes back; its health URL says so at once, but the
    executor's breaker stays OPEN for its cooldown (an hour of the clock the executor shares
    with the reconciler; no executor health checks here). Nothing is released while it is: a
    release would be demoted again at once and spend one of the task's three redrives
    (released every second, all three in three seconds: FAILED). Once the cooldown ends,
    one release, and the task succeeds."""
    clock = reconciler.clock
    await downstream.control(down=True)
    pipeline.executors[0].kill()
    executor = await pipeline.start_executor(
        **clock.env,
        DISPO_EXECUTOR_BREAKER_THRESHOLD="2",
        DISPO_EXECUTOR_BREAKER_COOLDOWN_SECONDS="3600",
        DISPO_EXECUTOR_HEALTH_INTERVAL_SECONDS="0",
    )
    async with admin_channel(executor.address) as channel:
        stub = executor_pb2_grpc.ExecutorServiceStub(channel)

        async def breaker() -> int:
            reply = await stub.ListDownstreams(executor_pb2.ListDownstreamsRequest())
            return {d.name: d.breaker_state for d in reply.downstreams}["demo"]

        async with pipeline.client() as client:
            task = await client.submit("tests", [cell("step", name="brk")])
            async with clock.running():  # the calls' retries run on the executor's clock
                await wait_status(client, task.task_id, {"DEMOTED"})
                await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_DEMOTED)
            await downstream.control(down=False)
            for _ in range(6):  # healthy by its URL; the breaker OPEN for the hour
                handled = await reconciler.sweep()
                assert await breaker() == executor_pb2.BREAKER_STATE_OPEN
                assert handled["release"] == 0, handled
                held = await reconciler.held(task.task_id)
                assert held.state == pb.RECOVERY_STATE_DEMOTED, held
                listed = await reconciler.stub.ListDownstreams(pb.ListDownstreamsRequest())
                demo = {d.name: d for d in listed.downstreams}["demo"]
                assert not demo.healthy and "breaker is open until" in demo.probe_error, demo
            clock.advance(seconds=3600)  # the cooldown over: trial calls allowed
            assert await breaker() == executor_pb2.BREAKER_STATE_HALF_OPEN
            for _ in range(200):
                await reconciler.tick()
                view = await client.get(task.task_id)
                if view.status == "SUCCEEDED":
                    break
            assert view.status == "SUCCEEDED", dump(view)
    detail = await reconciler.stub.GetRecoveryTask(pb.GetRecoveryTaskRequest(task_id=task.task_id))
    releases = [r for r in detail.redrives if r.trigger == pb.REDRIVE_TRIGGER_RELEASE]
    assert len(releases) == 1, detail


async def test_unknown_nodes_settled_by_their_probes_both_ways(pipeline, downstream, reconciler):
    """Two non-idempotent nodes interrupted mid-call (executor SIGKILL) are UNKNOWN. Where
    the probe says the effect did not happen, the node runs again; where it did, it is
    recorded SUCCEEDED without another call."""
    import httpx

    await downstream.control(hold={"path": "/once/"})
    async with pipeline.client() as client:
        task = await client.submit(
            "tests", [cell("step_once", ref="a", name="a"), cell("step_once", ref="b", name="b")]
        )
        await downstream.wait_held(2)
        pipeline.executors[0].kill()
        await downstream.control(release=True)
        # b's effect did happen (say the downstream committed just before the crash).
        async with httpx.AsyncClient() as http:
            (
                await http.post(
                    f"{downstream.url}/once/b",
                    json={"name": "b"},
                    headers={"Idempotency-Key": f"{task.task_id}/b.call"},
                )
            ).raise_for_status()
        await pipeline.start_executor()
        held = await reconciler.wait_state(
            task.task_id, pb.RECOVERY_STATE_AWAITING_SETTLEMENT, timeout=60
        )
        assert held.error_class == "unknown_outcome"
        await reconciler.sweep()
        # a's "not done" is not final yet: its request may land up to max_effect_seconds
        # (ten times the 5 s timeout) after it became UNKNOWN. b's "done" is.
        held = await reconciler.held(task.task_id)
        assert held.state == pb.RECOVERY_STATE_AWAITING_SETTLEMENT
        assert "a.call: probe reports done=false, not final before" in held.reason
        assert f"{task.task_id}/a.call" not in await downstream.effects()
        await reconciler.sweep_past_effects(50)
        view = await client.wait(task.task_id, timeout=30)

    assert view.status == "SUCCEEDED", dump(view)
    calls, effects = await downstream.calls(), await downstream.effects()
    assert (
        calls[f"{task.task_id}/a.call"] == 2 and effects[f"{task.task_id}/a.call"] == 1
    )  # re-run once
    assert (
        calls[f"{task.task_id}/b.call"] == 2
    )  # the interrupted call and the effect: never a third
    detail = await reconciler.stub.GetRecoveryTask(pb.GetRecoveryTaskRequest(task_id=task.task_id))
    assert sorted((s.node_id, s.method, s.outcome) for s in detail.settlements) == [
        ("a.call", pb.SETTLEMENT_METHOD_PROBE, common_pb2.NODE_STATUS_PENDING),
        ("b.call", pb.SETTLEMENT_METHOD_PROBE, common_pb2.NODE_STATUS_SUCCEEDED),
    ]


async def test_ambiguous_calls_of_non_idempotent_actions_are_settled_by_their_probes(
    pipeline, downstream, reconciler
):
    """A downstream that performs the effect and then answers too late, and one that
    answers 500 without having acted, for actions that are not idempotent: each node is
    UNKNOWN after its one call, and the noop node after the first waits; the probe settles
    the first SUCCEEDED with no second call (the noop then runs, in the executor's batched
    step) and runs the second again. The downstream does not deduplicate: every effect
    counts."""
    await downstream.control(
        dedupe=False,
        hold={"path": "/quick-once/late", "effect": True, "times": 1},
        fail={"path": "/quick-once/broken", "status": 500, "times": 1},
    )
    async with pipeline.client() as client:
        late = await client.submit(
            "tests", [cell("quick_once", name="late"), cell("noop").after("quick_once")]
        )
        broken = await client.submit("tests", [cell("quick_once", name="broken")])
        for task in (late, broken):
            held = await reconciler.wait_state(
                task.task_id, pb.RECOVERY_STATE_AWAITING_SETTLEMENT, timeout=60
            )
            assert held.error_class == "unknown_outcome"
        parked = {"quick_once.call": "UNKNOWN", "noop.noop": "PENDING"}
        await wait_until(client, late.task_id, lambda v: v.node_statuses == parked)
        assert (await downstream.calls()) == {
            f"{late.task_id}/quick_once.call": 1,
            f"{broken.task_id}/quick_once.call": 1,
        }
        await reconciler.sweep()
        # broken's "not done" is final only max_effect_seconds (30 s, the least) after it
        # became UNKNOWN: nothing is sent again before.
        assert (await reconciler.held(broken.task_id)).state == (
            pb.RECOVERY_STATE_AWAITING_SETTLEMENT
        )
        assert (await downstream.calls())[f"{broken.task_id}/quick_once.call"] == 1
        await reconciler.sweep_past_effects(30)
        views = [await client.wait(t.task_id, timeout=30) for t in (late, broken)]
    await downstream.control(release=True)

    assert [v.status for v in views] == ["SUCCEEDED", "SUCCEEDED"], [dump(v) for v in views]
    late_key, broken_key = f"{late.task_id}/quick_once.call", f"{broken.task_id}/quick_once.call"
    calls, effects = await downstream.calls(), await downstream.effects()
    assert calls[late_key] == 1 and effects[late_key] == 1  # settled by the probe alone
    assert views[0].node("noop.noop").status == "SUCCEEDED"
    assert views[0].node("noop.noop").attempts == 1
    assert calls[broken_key] == 2 and effects[broken_key] == 1  # not done: run once more
    for task, outcome in (
        (late, common_pb2.NODE_STATUS_SUCCEEDED),
        (broken, common_pb2.NODE_STATUS_PENDING),
    ):
        detail = await reconciler.stub.GetRecoveryTask(
            pb.GetRecoveryTaskRequest(task_id=task.task_id)
        )
        assert [(s.node_id, s.method, s.outcome) for s in detail.settlements] == [
            ("quick_once.call", pb.SETTLEMENT_METHOD_PROBE, outcome)
        ]


async def test_conflicting_tasks_one_verdict_loser_cancelled(
    pipeline, downstream, reconciler, database_url
):
    await downstream.control(hold={"path": "/pair/c-7/first"})
    async with pipeline.client() as client:
        loser = await client.submit("ecommerce", [cell("pair", name="c-7")])
        winner = await client.submit("trust_safety", [cell("pair", name="c-7")])
        await downstream.wait_held(1)
        for _ in range(40):
            await reconciler.tick()
            verdicts = (await reconciler.stub.ListVerdicts(pb.ListVerdictsRequest())).verdicts
            if verdicts:
                break
        await downstream.control(release=True)
        lost = await client.wait(loser.task_id, timeout=30)
        won = await client.wait(winner.task_id, timeout=30)
    [verdict] = verdicts
    assert verdict.winner_task_id == winner.task_id and list(verdict.loser_task_ids) == [
        loser.task_id
    ]
    assert lost.status == "CANCELLED", dump(lost)
    assert lost.node("pair.second").status == "CANCELLED"
    assert won.status == "SUCCEEDED", dump(won)
    await assert_outbox_subjects_declared(  # the verdict's task.cancel among them
        database_url, schemas={"gateway", "executor", "reconciler"}
    )


async def test_redrive_including_permanent_failures_revives_dependants(
    pipeline, downstream, reconciler
):
    await downstream.control(fail={"status": 400, "times": 1, "path": "/step/bad"})
    await downstream.control(fail={"status": 503, "times": 4, "path": "/step/flaky"})
    async with pipeline.client() as client:
        task = await client.submit(
            "tests",
            [
                cell("step", ref="bad", name="bad"),
                cell("step", ref="dep", name="dep").after("bad"),
                cell("step", ref="flaky", name="flaky"),
            ],
        )
        await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_PARKED_FAILED)
        view = await client.get(task.task_id)
        assert view.node_statuses["dep.call"] == "DEPENDENCY_FAILED", dump(view)
        await reconciler.stub.RedriveTask(
            pb.RedriveTaskRequest(
                task_id=task.task_id, actor="ops", reason="bad input fixed", include_permanent=True
            )
        )
        done = await client.wait(task.task_id, timeout=30)
    assert done.status == "SUCCEEDED", dump(done)


async def test_reconciler_killed_mid_redrive_with_the_real_pipeline(
    pipeline, downstream, start_reconciler
):
    """SIGKILL between redrive batches: after a restart every task completes, each failed
    node ran exactly once more, and no succeeded node ran again."""
    reconciler = await start_reconciler(DISPO_RECONCILER_BATCH="2")
    names = [f"k{i}z" for i in range(6)]
    for name in names:
        await downstream.control(fail={"status": 500, "times": 4, "path": f"/step/{name}"})
    async with pipeline.client() as client:
        tasks = [
            await client.submit(
                "tests",
                [
                    cell("step", ref="ok", name=f"ok-{name}"),
                    cell("step", ref="x", name=name).after("ok"),
                ],
            )
            for name in names
        ]
        for task in tasks:
            await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_PARKED_FAILED)

        reconciler.clock.advance(seconds=11)  # all due; one round redrives a batch of 2

        async def redriven() -> int:
            states = [(await reconciler.held(t.task_id)).state for t in tasks]
            return sum(s != pb.RECOVERY_STATE_PARKED_FAILED for s in states)

        await eventually(redriven, lambda n: n >= 2, wanted="a first batch redriven")
        reconciler.clock.advance(seconds=0.5)  # the next round starts...
        await asyncio.sleep(0.02)
        reconciler.process.kill()  # ...and is cut short wherever it is
        await reconciler.process.restart()
        views = []
        for _ in range(200):
            await reconciler.tick()
            views = [await client.get(t.task_id) for t in tasks]
            if all(v.status == "SUCCEEDED" for v in views):
                break
    assert [v.status for v in views] == ["SUCCEEDED"] * len(tasks), [dump(v) for v in views]
    calls = await downstream.calls()
    for task in tasks:
        assert calls[f"{task.task_id}/ok.call"] == 1
        assert calls[f"{task.task_id}/x.call"] == 5  # 4 before the redrive, exactly 1 after
        detail = await reconciler.stub.GetRecoveryTask(
            pb.GetRecoveryTaskRequest(task_id=task.task_id)
        )
        assert len(detail.redrives) == 1


async def test_a_callback_carries_the_result_and_waits_for_the_executor_to_give_it(
    pipeline, downstream, start_reconciler, receiver, database_url
):
    """The body of a SUCCEEDED task's callback holds its result, read from the executor
    (ADR-0093); while the executor does not answer, no body goes without it: the attempt is
    recorded failed and retried as a failed delivery is."""
    import json

    await signing_secret(database_url, "tests")
    await receiver.start()
    async with pipeline.client() as client:
        task = await client.submit(
            "tests", [cell("review_and_close", ref="r", name="cb")], callback_url=receiver.url
        )
        done = await client.wait(task.task_id, timeout=30)
    assert done.status == "SUCCEEDED" and done.result == {"r.open": done.node("r.open").output}
    [executor] = pipeline.executors
    executor.kill()  # before the reconciler hears of the finish
    reconciler = await start_reconciler()

    async def completion():
        try:
            return await reconciler.stub.GetCompletion(
                pb.GetCompletionRequest(task_id=task.task_id)
            )
        except grpc.aio.AioRpcError:
            return None

    for _ in range(100):
        await reconciler.tick()
        reply = await completion()
        if reply is not None and reply.completion.notify_attempts >= 1:
            break
    assert reply.completion.notify_state == pb.NOTIFY_STATE_PENDING, reply
    assert "not sent: the task's result was not read" in reply.deliveries[0].error, reply
    assert not receiver.received

    executor.spawn()  # back on its address
    await executor.wait_ready()
    for _ in range(100):
        await reconciler.tick(2)
        if receiver.received:
            break
    [delivered] = receiver.received
    body = json.loads(delivered["body"])
    assert body["task_id"] == task.task_id and body["status"] == "SUCCEEDED"
    assert body["result"] == done.result


async def test_a_task_ended_by_its_deadline_gets_its_completion_callback(
    start_service,
    catalogue_file,
    egress_allow,
    executor_port,
    downstream,
    file_clock,
    start_reconciler,
    receiver,
    database_url,
):
    """A deadline ends a task FAILED by the path of any failure (ADR-0103): its terminal
    status reaches the reconciler, which notifies the caller. Every service on one file
    clock: the deadline passes while ``a``'s call is under way."""
    import json
    from datetime import timedelta

    from pipeline_fixtures import Pipeline

    await signing_secret(database_url, "tests")
    await receiver.start()
    reconciler = await start_reconciler()  # the file clock set to now
    pipeline = Pipeline(start_service, catalogue_file, egress_allow, executor_port=executor_port)
    await pipeline.start_gateway(**file_clock.env)
    await pipeline.start_executor(**file_clock.env)
    await downstream.control(hold={"path": "/step/a", "effect": True})
    async with pipeline.client() as client:
        task = await client.submit(
            "tests",
            [cell("step", ref="a", name="a"), cell("step", ref="b", name="b").after("a")],
            callback_url=receiver.url,
            deadline=file_clock.now + timedelta(minutes=5),
        )
        key = f"{task.task_id}/a.call"
        await eventually(downstream.calls, lambda calls: key in calls, wanted="a under way")
        file_clock.advance(minutes=6)
        await downstream.control(release=True)
        done = await client.wait(task.task_id, timeout=30)
    assert (done.status, done.status_reason) == ("FAILED", "deadline reached"), dump(done)

    for _ in range(100):
        await reconciler.tick()
        if receiver.received:
            break
    [delivered] = receiver.received
    body = json.loads(delivered["body"])
    assert (body["task_id"], body["status"]) == (task.task_id, "FAILED")
    assert body["status_reason"] == "deadline reached", body
