"""Any FAILED task can be resumed through the reconciler: a permanent failure is held FAILED
(from its task.fail), a spent policy and an age limit end a task FAILED, and RedriveTask
resumes each from its failure — never an UNKNOWN node without a decision."""

import grpc
import pytest
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.libs.api.task.v1 import task_pb2
from dispo.reconciler.completion import facts
from dispo.reconciler.recovery import redrive as recovery
from dispo.reconciler.states import RecoveryState
from dispo.reconciler.sweeps import run_sweeps

from .conftest import TS, creates, envelope, node, outbox, row, status_of


def ended_failed(task_id: str, generation: int = 0) -> task_pb2.Task:
    """What the executor publishes on task.fail for a task it ended FAILED (a 4xx)."""
    env = envelope(
        task_id,
        [
            node("ok.set_label", "SUCCEEDED", task_id=task_id),
            node(
                "bad.set_label",
                "FAILED",
                error="HTTP 400: bad level",
                attempts=1,
                retryable=False,
                task_id=task_id,
            ),
            node("dep.set_label", "DEPENDENCY_FAILED", deps=("bad.set_label",), task_id=task_id),
        ],
        generation=generation,
        status="FAILED",
    )
    env.status_reason = "failed: bad.set_label"
    return env


async def test_a_permanent_failure_is_held_failed_with_its_reason_and_nothing_scheduled(recon):
    assert await recovery.intake(recon, ended_failed("p1"), "fail")

    held = await row(recon, "p1")
    assert held.state is RecoveryState.FAILED and held.next_redrive_at is None
    assert held.reason == "failed: bad.set_label; last error bad.set_label: HTTP 400: bad level"
    assert held.error_class == "http_4xx"
    # The executor ended it and published its own snapshot: nothing to publish here.
    assert await outbox(recon) == []
    # Its FAILED snapshot, seen by the completion consumer, leaves it held.
    await facts.on_status(recon, ended_failed("p1"))
    assert (await row(recon, "p1")).state is RecoveryState.FAILED


async def test_resume_resets_failed_and_dependency_failed_nodes_never_succeeded_ones(recon, stub):
    assert await recovery.intake(recon, ended_failed("p2", generation=3), "fail")

    reply = await stub.RedriveTask(pb.RedriveTaskRequest(task_id="p2", actor="ops", reason="fixed"))

    assert reply.task.state == pb.RECOVERY_STATE_REDRIVEN
    [sent] = await creates(recon)
    assert sent.generation == 4
    assert list(sent.redrive.reset_nodes) == ["bad.set_label", "dep.set_label"]
    assert "ok.set_label" not in sent.redrive.reset_nodes
    assert sent.payloads == ended_failed("p2").payloads
    detail = await stub.GetRecoveryTask(pb.GetRecoveryTaskRequest(task_id="p2"))
    [redrive] = detail.redrives
    assert redrive.trigger == pb.REDRIVE_TRIGGER_RESUME and redrive.actor == "ops"
    # A resume starts the redrive policy afresh.
    assert reply.task.redrives == 0
    # Resumed, it fails again for good: held FAILED again, resumable again.
    again = ended_failed("p2", generation=4)
    assert await recovery.intake(recon, again, "fail")
    assert (await row(recon, "p2")).state is RecoveryState.FAILED


async def test_a_resumed_task_that_finishes_is_resolved(recon, stub):
    assert await recovery.intake(recon, ended_failed("p3"), "fail")
    await stub.RedriveTask(pb.RedriveTaskRequest(task_id="p3", actor="ops"))
    done = ended_failed("p3", generation=1)
    done.status = TS.TASK_STATUS_SUCCEEDED
    await facts.on_status(recon, done)
    assert (await row(recon, "p3")).state is RecoveryState.RESOLVED


async def test_a_failed_task_with_unknown_nodes_resumes_only_after_a_decision(
    recon, stub, manual_clock
):
    """Its effect may have happened: an UNKNOWN node is never re-sent without a decision."""
    env = envelope(
        "u1",
        [
            node("a.set_label", "UNKNOWN", probe=False, idempotent=False, task_id="u1"),
            node("b.set_label", "DEPENDENCY_FAILED", deps=("a.set_label",), task_id="u1"),
        ],
    )
    assert await recovery.intake(recon, env, "fail")  # AWAITING_SETTLEMENT
    await run_sweeps(recon, "settle")  # no probe, not idempotent: AWAITING_DECISION
    manual_clock.advance(seconds=recon.settings.decision_max_age_seconds + 1)
    assert (await run_sweeps(recon, "expire"))["expire"] == 1  # FAILED, a.set_label UNKNOWN
    assert (await row(recon, "u1")).state is RecoveryState.FAILED

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.RedriveTask(pb.RedriveTaskRequest(task_id="u1", actor="ops"))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "a.set_label" in refused.value.details()
    assert await creates(recon) == []

    decided = await stub.ResolveNode(
        pb.ResolveNodeRequest(
            task_id="u1",
            node_id="a.set_label",
            resolution=pb.RESOLUTION_RETRY,
            actor="ops",
            reason="downstream confirms nothing happened",
        )
    )
    assert decided.task.state == pb.RECOVERY_STATE_FAILED and not decided.redriven
    assert await creates(recon) == []

    await stub.RedriveTask(pb.RedriveTaskRequest(task_id="u1", actor="ops"))
    [sent] = await creates(recon)
    assert sorted(sent.redrive.reset_nodes) == ["a.set_label", "b.set_label"]
    assert status_of(sent, "a.set_label") == "PENDING"
