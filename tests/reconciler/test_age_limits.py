"""Age limits of parked work (on the injectable clock): a task DEMOTED or AWAITING_DECISION
longer than its configured limit ends FAILED with the reason, visibly — a final snapshot
with the nodes that can no longer run ended, and task.close for the executor."""

from dispo.libs.api.task.v1 import task_pb2
from dispo.reconciler.recovery import redrive
from dispo.reconciler.settings import ReconcilerSettings
from dispo.reconciler.states import RecoveryState
from dispo.reconciler.sweeps import run_sweeps

from .conftest import NS, TS, envelope, node, outbox, row

R = RecoveryState


def demoted(task_id: str) -> task_pb2.Task:
    return envelope(
        task_id,
        [
            node("a.set_label", "DEMOTED", error="downstream labels degraded", task_id=task_id),
            node("b.set_label", "PENDING", deps=("a.set_label",), task_id=task_id),
        ],
        status="DEMOTED",
    )


def undecided(task_id: str) -> task_pb2.Task:
    return envelope(
        task_id,
        [
            node("a.set_label", "UNKNOWN", probe=False, idempotent=False, task_id=task_id),
            node("b.set_label", "PENDING", deps=("a.set_label",), task_id=task_id),
        ],
    )


def limited(recon, demoted_s: float, decision_s: float) -> None:
    recon.settings = ReconcilerSettings(
        **{
            **recon.settings.model_dump(),
            "demoted_max_age_seconds": demoted_s,
            "decision_max_age_seconds": decision_s,
        }
    )


async def final_snapshot(recon, task_id: str) -> task_pb2.Task:
    [status] = await outbox(recon, f"task.status.{task_id}.failed")
    return task_pb2.Task.FromString(status.payload)


async def test_defaults_bound_both_waits():
    settings = ReconcilerSettings()
    assert settings.demoted_max_age_seconds == 86400
    assert settings.decision_max_age_seconds == 604800


async def test_demoted_past_its_limit_ends_failed_with_the_reason(recon, manual_clock):
    limited(recon, demoted_s=3600, decision_s=10**6)
    assert await redrive.intake(recon, demoted("d1"), "demote")
    manual_clock.advance(seconds=1800)
    assert await redrive.intake(recon, demoted("d2"), "demote")

    manual_clock.advance(seconds=1799)
    assert (await run_sweeps(recon, "expire"))["expire"] == 0
    assert (await row(recon, "d1")).state is R.DEMOTED
    manual_clock.advance(seconds=2)  # d1 parked 3601 s ago, d2 1801 s ago
    assert (await run_sweeps(recon, "expire"))["expire"] == 1

    held = await row(recon, "d1")
    assert held.state is R.FAILED
    assert held.reason == (
        "age limit reached: demoted, waiting for downstream labels, for 3601 s (limit 3600 s)"
    )
    assert (await row(recon, "d2")).state is R.DEMOTED
    snap = await final_snapshot(recon, "d1")
    assert snap.status == TS.TASK_STATUS_FAILED and snap.status_reason == held.reason
    assert {n.node_id: n.status for n in snap.nodes} == {
        "a.set_label": NS.NODE_STATUS_FAILED,
        "b.set_label": NS.NODE_STATUS_DEPENDENCY_FAILED,
    }
    [close] = await outbox(recon, "task.close")
    request = task_pb2.CloseRequest.FromString(close.payload)
    assert request.task_id == "d1" and request.reason == held.reason
    assert request.version == snap.version


async def test_awaiting_decision_past_its_limit_ends_failed_unknown_nodes_stay_unknown(
    recon, manual_clock
):
    limited(recon, demoted_s=10**6, decision_s=600)
    assert await redrive.intake(recon, undecided("u1"), "fail")
    await run_sweeps(recon, "settle")
    assert (await row(recon, "u1")).state is R.AWAITING_DECISION

    manual_clock.advance(seconds=599)
    assert (await run_sweeps(recon, "expire"))["expire"] == 0
    manual_clock.advance(seconds=2)
    assert (await run_sweeps(recon, "expire"))["expire"] == 1

    held = await row(recon, "u1")
    assert held.state is R.FAILED
    assert held.reason == (
        "age limit reached: awaiting an operator's decision on UNKNOWN node a.set_label,"
        " for 601 s (limit 600 s)"
    )
    snap = await final_snapshot(recon, "u1")
    assert {n.node_id: n.status for n in snap.nodes} == {
        "a.set_label": NS.NODE_STATUS_UNKNOWN,  # its effect may have happened
        "b.set_label": NS.NODE_STATUS_DEPENDENCY_FAILED,
    }
    # Not expired twice.
    manual_clock.advance(seconds=600)
    assert (await run_sweeps(recon, "expire"))["expire"] == 0
    assert len(await outbox(recon, "task.close")) == 1


async def test_other_parked_states_have_no_age_limit_here(recon, manual_clock):
    limited(recon, demoted_s=60, decision_s=60)
    failing = envelope("f1", [node("a.set_label", "FAILED", error="HTTP 503", task_id="f1")])
    assert await redrive.intake(recon, failing, "fail")  # PARKED_FAILED: the redrive policy's
    manual_clock.advance(seconds=5)
    assert (await run_sweeps(recon, "expire"))["expire"] == 0
    assert (await row(recon, "f1")).state is R.PARKED_FAILED
