"""UNKNOWN nodes settled: by the action's status probe (both ways), by re-running an
idempotent action, or by an operator's recorded decision; nothing is re-run blindly."""

import grpc
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.reconciler.recovery import redrive
from dispo.reconciler.states import RecoveryState
from dispo.reconciler.sweeps import run_sweeps

from .conftest import after_redrive, creates, envelope, node, row, status_of
from .test_operations import expect_error


def uncertain(task_id, **kw):
    return envelope(
        task_id,
        [
            node("a.first", "SUCCEEDED", task_id=task_id),
            node("a.call", "UNKNOWN", deps=("a.first",), task_id=task_id, **kw),
            node("b.after", "PENDING", deps=("a.call",), task_id=task_id),
        ],
    )


async def settle_and_redrive(recon):
    await run_sweeps(recon, "settle")
    return await run_sweeps(recon, "redrive")


async def settlements(stub, task_id):
    return (await stub.GetRecoveryTask(pb.GetRecoveryTaskRequest(task_id=task_id))).settlements


async def test_probe_says_done_node_recorded_succeeded_not_rerun(recon, fake_downstream, stub):
    fake_downstream.done["yes/a.call"] = True
    assert await redrive.intake(recon, uncertain("yes", idempotent=False), "fail")
    assert (await row(recon, "yes")).state is RecoveryState.AWAITING_SETTLEMENT
    assert await settle_and_redrive(recon) == {"redrive": 1}
    [sent] = await creates(recon)
    assert (
        after_redrive(sent, "a.call") == "SUCCEEDED" and after_redrive(sent, "b.after") == "PENDING"
    )
    # The executor is told, not overwritten: settled as done, nothing to reset.
    assert list(sent.redrive.settled_nodes) == ["a.call"] and not sent.redrive.reset_nodes
    assert sent.generation == 3
    assert fake_downstream.probes == {"yes/a.call": 1}
    [s] = await settlements(stub, "yes")
    assert (s.node_id, s.method, s.outcome) == (
        "a.call",
        pb.SETTLEMENT_METHOD_PROBE,
        common_pb2.NODE_STATUS_SUCCEEDED,
    ) and "done=true" in s.reason


async def test_probe_says_not_done_node_runs_again_once_its_effect_can_no_longer_land(
    recon, fake_downstream, stub, manual_clock
):
    """An unfenced "not done" is final only once the action's max_effect_seconds (here the
    default: ten times the labels downstream's 5 s timeout) have passed since the node
    became UNKNOWN: a request still under way may land until then."""
    assert await redrive.intake(recon, uncertain("no", idempotent=False), "fail")
    assert await settle_and_redrive(recon) == {"redrive": 0}
    parked = await row(recon, "no")
    assert parked.state is RecoveryState.AWAITING_SETTLEMENT
    assert (
        "done=false, not final before" in parked.reason and "max_effect_seconds 50" in parked.reason
    )
    for _ in range(6):  # asked again, sooner than settle_retry_delay, never re-sent
        manual_clock.advance(seconds=7)
        assert await settle_and_redrive(recon) == {"redrive": 0}
    # At 0, 7, 14, 21 and 35 s: each wait half the time UNKNOWN so far (at least 1 s).
    assert fake_downstream.probes["no/a.call"] == 5 and await creates(recon) == []
    manual_clock.advance(seconds=9)  # 51 s after it was parked
    assert await settle_and_redrive(recon) == {"redrive": 1}
    [sent] = await creates(recon)
    assert (
        after_redrive(sent, "a.call") == "PENDING" and after_redrive(sent, "a.first") == "SUCCEEDED"
    )
    assert list(sent.redrive.reset_nodes) == ["a.call"] and not sent.redrive.settled_nodes
    [s] = await settlements(stub, "no")
    assert (s.method, s.outcome) == (pb.SETTLEMENT_METHOD_PROBE, common_pb2.NODE_STATUS_PENDING)


async def test_probe_without_an_answer_is_asked_again_later(recon, fake_downstream, manual_clock):
    fake_downstream.broken.add("later/a.call")
    assert await redrive.intake(recon, uncertain("later", idempotent=False), "fail")
    assert await settle_and_redrive(recon) == {"redrive": 0}
    parked = await row(recon, "later")
    assert parked.state is RecoveryState.AWAITING_SETTLEMENT and "HTTP 500" in parked.reason
    assert (await run_sweeps(recon, "settle"))["settle"] == 0  # not before settle_retry_delay
    fake_downstream.broken.clear()
    fake_downstream.done["later/a.call"] = True
    manual_clock.advance(seconds=31)
    assert await settle_and_redrive(recon) == {"redrive": 1}
    assert fake_downstream.probes["later/a.call"] == 2


async def test_idempotent_without_probe_is_rerun(recon, stub):
    assert await redrive.intake(recon, uncertain("idem", probe=False, idempotent=True), "fail")
    assert await settle_and_redrive(recon) == {"redrive": 1}
    [sent] = await creates(recon)
    assert after_redrive(sent, "a.call") == "PENDING"
    [s] = await settlements(stub, "idem")
    assert s.method == pb.SETTLEMENT_METHOD_IDEMPOTENT_RERUN


async def test_non_idempotent_without_probe_waits_for_an_operator(recon, stub):
    assert await redrive.intake(recon, uncertain("op", probe=False, idempotent=False), "fail")
    assert await settle_and_redrive(recon) == {"redrive": 0}
    listed = await stub.ListRecoveryTasks(
        pb.ListRecoveryTasksRequest(
            filter=pb.RecoveryFilter(states=[pb.RECOVERY_STATE_AWAITING_DECISION])
        )
    )
    [task] = listed.tasks
    assert (
        task.task_id == "op"
        and list(task.undecided_nodes) == ["a.call"]
        and "operator" in task.reason
    )
    assert await creates(recon) == []

    await expect_error(
        stub.ResolveNode(
            pb.ResolveNodeRequest(task_id="op", node_id="a.call", resolution=pb.RESOLUTION_DONE)
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "reason",
    )
    await expect_error(
        stub.ResolveNode(
            pb.ResolveNodeRequest(
                task_id="op", node_id="a.first", reason="x", resolution=pb.RESOLUTION_DONE
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "node_id",
    )
    await expect_error(
        stub.ResolveNode(pb.ResolveNodeRequest(task_id="op", node_id="a.call", reason="x")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "resolution",
    )
    await expect_error(
        stub.RedriveTask(pb.RedriveTaskRequest(task_id="op")), grpc.StatusCode.FAILED_PRECONDITION
    )

    reply = await stub.ResolveNode(
        pb.ResolveNodeRequest(
            task_id="op",
            node_id="a.call",
            resolution=pb.RESOLUTION_DONE,
            actor="erin",
            reason="ticket 881 exists in the review system",
        )
    )
    assert reply.redriven and reply.task.state == pb.RECOVERY_STATE_REDRIVEN
    [sent] = await creates(recon)
    assert (
        after_redrive(sent, "a.call") == "SUCCEEDED" and after_redrive(sent, "b.after") == "PENDING"
    )
    [s] = await settlements(stub, "op")
    assert (s.method, s.outcome, s.actor, s.reason) == (
        pb.SETTLEMENT_METHOD_OPERATOR,
        common_pb2.NODE_STATUS_SUCCEEDED,
        "erin",
        "ticket 881 exists in the review system",
    )


async def test_unknown_and_failed_nodes_settle_then_wait_for_backoff(
    recon, fake_downstream, manual_clock
):
    env = envelope(
        "mix",
        [
            node("a.call", "UNKNOWN", task_id="mix", idempotent=False),
            node("b.flaky", "FAILED", task_id="mix", error="HTTP 502: x"),
        ],
    )
    fake_downstream.done["mix/a.call"] = True
    assert await redrive.intake(recon, env, "fail")
    assert await settle_and_redrive(recon) == {"redrive": 0}
    parked = await row(recon, "mix")
    assert (
        parked.state is RecoveryState.PARKED_FAILED
        and status_of(parked.envelope, "a.call") == "SUCCEEDED"
    )
    manual_clock.advance(seconds=16)
    assert await run_sweeps(recon, "redrive") == {"redrive": 1}
    [sent] = await creates(recon)
    assert (
        after_redrive(sent, "a.call") == "SUCCEEDED" and after_redrive(sent, "b.flaky") == "PENDING"
    )


async def test_a_request_that_lands_late_is_found_done_not_sent_again(
    recon, fake_downstream, stub, manual_clock
):
    """The probe says "not done" while the first request is still on its way, then "done"
    once its effect landed: SUCCEEDED, never PENDING."""
    assert await redrive.intake(recon, uncertain("late", idempotent=False), "fail")
    assert await settle_and_redrive(recon) == {"redrive": 0}
    manual_clock.advance(seconds=3)
    fake_downstream.done["late/a.call"] = True  # the late request's effect
    assert await settle_and_redrive(recon) == {"redrive": 1}
    [sent] = await creates(recon)
    assert after_redrive(sent, "a.call") == "SUCCEEDED" and not sent.redrive.reset_nodes
    [s] = await settlements(stub, "late")
    assert s.outcome == common_pb2.NODE_STATUS_SUCCEEDED


async def test_a_fencing_probe_settles_not_done_at_once_naming_the_attempt(
    recon, fake_downstream, stub
):
    """A downstream that fences the key up to the attempt the probe names will refuse the
    late request: its "not done" is final at once. The probe names the node's attempts."""
    fake_downstream.fencing.add("fence/a.call")
    env = uncertain("fence", idempotent=False)
    next(n for n in env.nodes if n.node_id == "a.call").retry.attempts = 3
    assert await redrive.intake(recon, env, "fail")
    assert await settle_and_redrive(recon) == {"redrive": 1}
    [sent] = await creates(recon)
    assert after_redrive(sent, "a.call") == "PENDING"
    [probe] = fake_downstream.server.received("/effects/fence/a.call")
    assert probe.headers["X-Dispo-Attempt"] == "3"
    assert probe.headers["Idempotency-Key"] == "fence/a.call"
    [s] = await settlements(stub, "fence")
    assert s.outcome == common_pb2.NODE_STATUS_PENDING and "fenced" in s.reason


async def test_a_probe_without_a_final_answer_past_its_limit_waits_for_an_operator(
    recon, fake_downstream, manual_clock
):
    """Unreachable, nonsense ("fenced" not a boolean) or never final: asked again until the
    probe limit (settle_probe_limit, an hour), then AWAITING_DECISION — never re-sent on a
    guess."""
    fake_downstream.broken.add("dark/a.call")
    fake_downstream.answers["odd/a.call"] = {"done": False, "fenced": "yes"}
    for task_id in ("dark", "odd"):
        assert await redrive.intake(recon, uncertain(task_id, idempotent=False), "fail")
    assert await settle_and_redrive(recon) == {"redrive": 0}
    assert "'fenced' is not a boolean" in (await row(recon, "odd")).reason
    for _ in range(130):
        manual_clock.advance(seconds=30)
        await settle_and_redrive(recon)
        if (await row(recon, "dark")).state is RecoveryState.AWAITING_DECISION:
            break
    for task_id in ("dark", "odd"):
        parked = await row(recon, task_id)
        assert parked.state is RecoveryState.AWAITING_DECISION, parked
        assert "no final probe answer in 3600 s" in parked.reason
    assert await creates(recon) == []
