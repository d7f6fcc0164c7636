"""UNKNOWN nodes settled: by the action's status probe (both ways), by re-running an
idempotent action, or by an operator's recorded decision; nothing is re-run blindly."""

import grpc
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.reconciler import recovery
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
    assert await recovery.intake(recon, uncertain("yes", idempotent=False), "fail")
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


async def test_probe_says_not_done_node_runs_again(recon, fake_downstream, stub):
    assert await recovery.intake(recon, uncertain("no", idempotent=False), "fail")
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
    assert await recovery.intake(recon, uncertain("later", idempotent=False), "fail")
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
    assert await recovery.intake(recon, uncertain("idem", probe=False, idempotent=True), "fail")
    assert await settle_and_redrive(recon) == {"redrive": 1}
    [sent] = await creates(recon)
    assert after_redrive(sent, "a.call") == "PENDING"
    [s] = await settlements(stub, "idem")
    assert s.method == pb.SETTLEMENT_METHOD_IDEMPOTENT_RERUN


async def test_non_idempotent_without_probe_waits_for_an_operator(recon, stub):
    assert await recovery.intake(recon, uncertain("op", probe=False, idempotent=False), "fail")
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
    assert await recovery.intake(recon, env, "fail")
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
