"""task.fail: recorded with history, redriven automatically after a jittered backoff from
the breakpoint, terminally FAILED (visible on the status subject) when the policy is spent."""

import asyncio

from dispo.libs.api.task.v1 import task_pb2
from dispo.reconciler.intake import consumers
from dispo.reconciler.recovery import redrive, store
from dispo.reconciler.states import RecoveryState
from dispo.reconciler.sweeps import run_sweeps
from support import eventually

from .conftest import NS, TS, after_redrive, creates, envelope, node, outbox, row, status_of


def failing(task_id: str, generation: int = 2, **kw) -> task_pb2.Task:
    return envelope(
        task_id,
        [
            node("a.set_label", "SUCCEEDED", task_id=task_id),
            node(
                "a.audit",
                "FAILED",
                deps=("a.set_label",),
                error="HTTP 503: busy",
                attempts=4,
                task_id=task_id,
            ),
            node("b.notify", "PENDING", deps=("a.audit",), task_id=task_id),
        ],
        generation=generation,
        **kw,
    )


async def test_task_fail_from_the_bus_is_recorded_with_its_history(recon, bus):
    env = failing("t-bus")
    await bus.publish("task.fail", env.SerializeToString(), msg_id="t-bus:fail:g2")
    await bus.publish("task.fail", b"\xff not a task", msg_id="garbage")
    parts = consumers(recon, bus, "reconciler")
    runs = [asyncio.create_task(c.run()) for _, c in parts]
    try:

        async def recorded():
            async with recon.db.connection() as conn:
                return await store.task_get(conn, "t-bus")

        await eventually(recorded, timeout=15, wanted="t-bus recorded")
    finally:
        for _, c in parts:
            c.stop()
        await asyncio.gather(*runs)
    parked = await row(recon, "t-bus")
    assert parked.state is RecoveryState.PARKED_FAILED
    assert parked.error_class == "http_5xx" and parked.downstreams == ["labels"]
    assert parked.cells == ["update_quality_level"]


async def test_auto_redrive_waits_for_the_backoff_then_resumes_from_the_breakpoint(
    recon, manual_clock, bus
):
    assert await redrive.intake(recon, failing("t1"), "fail")
    parked = await row(recon, "t1")
    wait = (parked.next_redrive_at - manual_clock.now()).total_seconds()
    assert 5 <= wait <= 15  # base 10 s, jitter ±50 %

    assert await run_sweeps(recon, "redrive") == {"redrive": 0}
    manual_clock.advance(seconds=wait - 0.5)
    assert await run_sweeps(recon, "redrive") == {"redrive": 0}
    manual_clock.advance(seconds=1)
    assert await run_sweeps(recon, "redrive") == {"redrive": 1}
    assert await run_sweeps(recon, "redrive") == {"redrive": 0}  # never twice

    [sent] = await creates(recon)
    assert sent.generation == 3
    assert after_redrive(sent, "a.set_label") == "SUCCEEDED"
    assert (
        after_redrive(sent, "a.audit") == "PENDING" and after_redrive(sent, "b.notify") == "PENDING"
    )
    [msg] = await outbox(recon, "task.create")
    assert msg.msg_id == "t1:g3"
    redriven = await row(recon, "t1")
    assert redriven.state is RecoveryState.REDRIVEN and redriven.redrives == 1

    # The relay puts it on task.create for the executor's normal path.
    assert await recon.relay.relay_once() == 1
    info = await bus.js.stream_info("TASKS", subjects_filter="task.create")
    assert info.state.subjects == {"task.create": 1}


async def test_stale_and_repeated_envelopes_are_ignored(recon, manual_clock):
    assert await redrive.intake(recon, failing("t2", generation=5), "fail")
    first = await row(recon, "t2")
    assert await redrive.intake(recon, failing("t2", generation=5), "fail")  # redelivery
    assert await redrive.intake(recon, failing("t2", generation=4), "fail")  # older
    again = await row(recon, "t2")
    assert again.generation == 5 and again.next_redrive_at == first.next_redrive_at
    async with recon.db.connection() as conn:
        assert len(await store.history_get(conn, "t2")) == 1


async def test_backoff_grows_and_a_spent_policy_ends_the_task_failed_with_the_reason(
    recon, manual_clock
):
    gen = 2
    waits = []
    for _attempt in range(3):  # max_redrives 3
        assert await redrive.intake(recon, failing("t3", generation=gen), "fail")
        parked = await row(recon, "t3")
        assert parked.state is RecoveryState.PARKED_FAILED
        waits.append((parked.next_redrive_at - manual_clock.now()).total_seconds())
        manual_clock.advance(seconds=waits[-1] + 0.001)
        assert (await run_sweeps(recon, "redrive"))["redrive"] == 1
        gen = (await row(recon, "t3")).generation  # the executor fails it again at this generation
    assert 5 <= waits[0] <= 15 and 10 <= waits[1] <= 30 and 20 <= waits[2] <= 60

    assert await redrive.intake(recon, failing("t3", generation=gen, version=40), "fail")
    final = await row(recon, "t3")
    assert final.state is RecoveryState.FAILED
    assert "3 of 3 redrives" in final.reason and "HTTP 503" in final.reason
    [status] = await outbox(recon, "task.status.t3.failed")
    snap = task_pb2.Task.FromString(status.payload)
    assert snap.status == TS.TASK_STATUS_FAILED and snap.version == 41
    assert snap.status_reason == final.reason
    # The dependant that can no longer run says so, in the snapshot and the held envelope.
    nodes = {n.node_id: (n.status, n.last_error) for n in snap.nodes}
    assert nodes == {
        "a.set_label": (NS.NODE_STATUS_SUCCEEDED, ""),
        "a.audit": (NS.NODE_STATUS_FAILED, "HTTP 503: busy"),
        "b.notify": (NS.NODE_STATUS_DEPENDENCY_FAILED, "a dependency failed"),
    }
    assert status_of(final.envelope, "b.notify") == "DEPENDENCY_FAILED"
    [close] = await outbox(recon, "task.close")
    request = task_pb2.CloseRequest.FromString(close.payload)
    assert (request.task_id, request.status, request.generation, request.version) == (
        "t3",
        TS.TASK_STATUS_FAILED,
        gen,
        41,
    )
    assert request.reason == final.reason and close.msg_id == f"t3:close:g{gen}"
    # Further failures of a FAILED task change nothing.
    assert await redrive.intake(recon, failing("t3", generation=gen + 1), "fail")
    assert (await row(recon, "t3")).state is RecoveryState.FAILED
    assert len(await creates(recon)) == 3


async def test_policy_per_business(recon, manual_clock):
    assert await redrive.intake(recon, failing("t4", business="search"), "fail")  # max_redrives 1
    manual_clock.advance(seconds=60)
    await run_sweeps(recon, "redrive")
    assert await redrive.intake(recon, failing("t4", business="search", generation=3), "fail")
    assert (await row(recon, "t4")).state is RecoveryState.FAILED


async def test_a_redriven_task_that_finishes_is_resolved(recon, manual_clock):
    from dispo.reconciler.completion import facts

    assert await redrive.intake(recon, failing("t5"), "fail")
    manual_clock.advance(seconds=60)
    await run_sweeps(recon, "redrive")
    done = failing("t5", generation=3, status="SUCCEEDED")
    await facts.on_status(recon, done)
    assert (await row(recon, "t5")).state is RecoveryState.RESOLVED
