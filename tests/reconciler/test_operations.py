"""Operators over gRPC: list with filters, redrive one, redrive by filter at a bounded
rate, abandon; bad input gets a precise status and changes nothing."""

import asyncio
from datetime import timedelta

import grpc
import pytest
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.libs.api.task.v1 import task_pb2
from dispo.reconciler.recovery import redrive
from dispo.reconciler.states import RecoveryState
from dispo.reconciler.sweeps import run_sweeps
from grpc_status import rpc_status

from .conftest import creates, envelope, node, outbox, row


def failed(
    task_id,
    *,
    business="ecommerce",
    downstream="labels",
    error="HTTP 503: busy",
    cell="update_quality_level",
):
    return envelope(
        task_id,
        [node("a.x", "FAILED", downstream=downstream, error=error, cell=cell, task_id=task_id)],
        business=business,
    )


async def park_several(recon, manual_clock):
    await redrive.intake(recon, failed("f1", business="ecommerce"), "fail")
    manual_clock.advance(seconds=100)
    await redrive.intake(
        recon,
        failed(
            "f2", business="ads", downstream="review", error="timeout after 2s", cell="start_review"
        ),
        "fail",
    )
    await redrive.intake(
        recon, failed("f3", business="ads", error="connection error: refused"), "fail"
    )
    await redrive.intake(
        recon,
        envelope("d1", [node("a.x", "DEMOTED", task_id="d1")], business="ads", status="DEMOTED"),
        "demote",
    )


async def expect_error(call, code, field=None):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value.details()
    if field is not None:
        status = rpc_status.from_call(info.value)
        from google.rpc import error_details_pb2

        bad = error_details_pb2.BadRequest()
        status.details[0].Unpack(bad)
        assert bad.field_violations[0].field == field
    return info.value


async def test_list_with_filters(recon, manual_clock, stub):
    await park_several(recon, manual_clock)

    async def ids(**f):
        states = f.pop("states", [])
        reply = await stub.ListRecoveryTasks(
            pb.ListRecoveryTasksRequest(filter=pb.RecoveryFilter(**f, states=states))
        )
        return sorted(t.task_id for t in reply.tasks)

    assert await ids() == ["d1", "f1", "f2", "f3"]
    assert await ids(business="ads") == ["d1", "f2", "f3"]
    assert await ids(cell="start_review") == ["f2"]
    assert await ids(downstream="review") == ["f2"]
    assert await ids(error_class="connection") == ["f3"]
    assert await ids(min_age_seconds=50) == ["f1"]
    assert await ids(states=[pb.RECOVERY_STATE_DEMOTED]) == ["d1"]
    first = await stub.ListRecoveryTasks(
        pb.ListRecoveryTasksRequest(page=common_pb2.PageRequest(page_size=3))
    )
    rest = await stub.ListRecoveryTasks(
        pb.ListRecoveryTasksRequest(
            page=common_pb2.PageRequest(page_size=3, page_token=first.page.next_page_token)
        )
    )
    assert len(first.tasks) == 3 and len(rest.tasks) == 1 and not rest.page.next_page_token
    await expect_error(
        stub.ListRecoveryTasks(
            pb.ListRecoveryTasksRequest(filter=pb.RecoveryFilter(min_age_seconds=-1))
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "filter.min_age_seconds",
    )


async def test_redrive_one_and_get_its_record(recon, manual_clock, stub):
    await park_several(recon, manual_clock)
    reply = await stub.RedriveTask(
        pb.RedriveTaskRequest(task_id="f1", actor="alice", reason="downstream fixed")
    )
    assert reply.task.state == pb.RECOVERY_STATE_REDRIVEN and reply.task.redrives == 1
    [sent] = await creates(recon)
    assert sent.task_id == "f1" and sent.generation == 3
    detail = await stub.GetRecoveryTask(pb.GetRecoveryTaskRequest(task_id="f1"))
    assert [h.kind for h in detail.history] == [pb.RECOVERY_KIND_FAIL] and detail.history[0].nodes[
        0
    ].last_error == "HTTP 503: busy"
    assert [(r.trigger, r.actor, r.reason) for r in detail.redrives] == [
        (pb.REDRIVE_TRIGGER_MANUAL, "alice", "downstream fixed")
    ]
    assert detail.envelope.generation == 3
    # Redriving again while it is with the executor is refused, and changes nothing.
    await expect_error(
        stub.RedriveTask(pb.RedriveTaskRequest(task_id="f1")), grpc.StatusCode.FAILED_PRECONDITION
    )
    await expect_error(
        stub.RedriveTask(pb.RedriveTaskRequest(task_id="nope")), grpc.StatusCode.NOT_FOUND
    )
    await expect_error(
        stub.RedriveTask(pb.RedriveTaskRequest()), grpc.StatusCode.INVALID_ARGUMENT, "task_id"
    )
    assert len(await creates(recon)) == 1


async def test_redrive_by_filter_is_spaced_to_the_rate(recon, manual_clock, stub):
    for i in range(6):
        await redrive.intake(recon, failed(f"r{i}", business="ads"), "fail")
        manual_clock.advance(seconds=1)
    await redrive.intake(recon, failed("other"), "fail")
    start = manual_clock.now()
    reply = await stub.RedriveByFilter(
        pb.RedriveByFilterRequest(
            filter=pb.RecoveryFilter(business="ads"),
            rate_per_second=2,
            actor="bob",
            reason="incident 12 over",
        )
    )
    assert reply.scheduled == 6 and list(reply.task_ids) == [
        f"r{i}" for i in range(6)
    ]  # oldest first
    assert reply.last_due_at.ToDatetime().timestamp() == pytest.approx(
        (start + timedelta(seconds=2.5)).timestamp()
    )
    sent_at = {}
    for step in range(8):  # sweep every half second of clock time
        await run_sweeps(recon, "redrive")
        for env in await creates(recon):
            sent_at.setdefault(env.task_id, step * 0.5)
        manual_clock.advance(seconds=0.5)
    assert sent_at == {f"r{i}": i * 0.5 for i in range(6)}
    assert (await row(recon, "other")).state is RecoveryState.PARKED_FAILED
    await expect_error(
        stub.RedriveByFilter(pb.RedriveByFilterRequest(rate_per_second=0)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "rate_per_second",
    )
    await expect_error(
        stub.RedriveByFilter(
            pb.RedriveByFilterRequest(
                rate_per_second=1, filter=pb.RecoveryFilter(states=[pb.RECOVERY_STATE_FAILED])
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "filter.states",
    )


async def test_abandon_cancels_through_the_normal_path(recon, manual_clock, stub):
    await park_several(recon, manual_clock)
    reply = await stub.AbandonTask(
        pb.AbandonTaskRequest(task_id="f2", actor="carol", reason="obsolete")
    )
    assert reply.task.state == pb.RECOVERY_STATE_ABANDONED and "obsolete" in reply.task.reason
    [cancel] = await outbox(recon, "task.cancel")
    assert task_pb2.CancelRequest.FromString(cancel.payload).task_id == "f2"
    manual_clock.advance(seconds=10_000)
    await run_sweeps(recon, "redrive")
    assert "f2" not in {e.task_id for e in await creates(recon)}
    await expect_error(
        stub.AbandonTask(pb.AbandonTaskRequest(task_id="f2")), grpc.StatusCode.FAILED_PRECONDITION
    )


async def test_unknown_sweep_is_refused(stub):
    await expect_error(
        stub.RunSweep(pb.RunSweepRequest(sweep=99)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "sweep",
    )
    reply = await stub.RunSweep(pb.RunSweepRequest(sweep=pb.SWEEP_ALL))
    assert set(reply.handled) == {
        "arbitrate",
        "compensate",
        "settle",
        "redrive",
        "health",
        "release",
        "notify",
        "reconcile",
        "expire",
    }
    assert set((await stub.RunSweep(pb.RunSweepRequest())).handled) == set(reply.handled)
    one = await stub.RunSweep(pb.RunSweepRequest(sweep=pb.SWEEP_RECONCILE))
    assert set(one.handled) == {"reconcile"}


async def test_a_second_redrive_by_filter_queues_behind_the_first(recon, manual_clock, stub):
    for i in range(4):
        await redrive.intake(recon, failed(f"q{i}", business="ads" if i < 2 else "search"), "fail")
    start = manual_clock.now()
    first = await stub.RedriveByFilter(
        pb.RedriveByFilterRequest(filter=pb.RecoveryFilter(business="ads"), rate_per_second=1)
    )
    second = await stub.RedriveByFilter(
        pb.RedriveByFilterRequest(filter=pb.RecoveryFilter(business="search"), rate_per_second=1)
    )
    assert first.last_due_at.ToDatetime().timestamp() == pytest.approx(
        (start + timedelta(seconds=1)).timestamp()
    )
    assert second.last_due_at.ToDatetime().timestamp() == pytest.approx(
        (start + timedelta(seconds=3)).timestamp()
    )


async def test_a_rate_too_small_or_a_filter_that_means_nothing_is_refused_and_changes_nothing(
    recon, manual_clock, stub
):
    """A rate whose spacing no time can hold (the console's "resume matching" field takes
    any number), an error class no task has, an age range that is empty: INVALID_ARGUMENT
    naming the field, no task scheduled."""
    await park_several(recon, manual_clock)
    ids = ["f1", "f2", "f3", "d1"]
    before = [
        (r.state, r.next_redrive_at, r.redrive_trigger) for r in [await row(recon, t) for t in ids]
    ]
    for request, field in [
        (pb.RedriveByFilterRequest(rate_per_second=1e-12), "rate_per_second"),
        (pb.RedriveByFilterRequest(rate_per_second=1e-300), "rate_per_second"),
        (
            pb.RedriveByFilterRequest(
                rate_per_second=1, filter=pb.RecoveryFilter(error_class="bogus")
            ),
            "filter.error_class",
        ),
    ]:
        await expect_error(stub.RedriveByFilter(request), grpc.StatusCode.INVALID_ARGUMENT, field)
    await expect_error(
        stub.ListRecoveryTasks(
            pb.ListRecoveryTasksRequest(filter=pb.RecoveryFilter(error_class="bogus"))
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "filter.error_class",
    )
    await expect_error(
        stub.ListFailedWork(
            pb.ListFailedWorkRequest(
                filter=pb.FailedWorkFilter(min_age_seconds=100, max_age_seconds=10)
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "filter.max_age_seconds",
    )
    after = [
        (r.state, r.next_redrive_at, r.redrive_trigger) for r in [await row(recon, t) for t in ids]
    ]
    assert after == before
    assert await creates(recon) == []
    # The slowest rate still taken: one a day.
    reply = await stub.RedriveByFilter(
        pb.RedriveByFilterRequest(
            rate_per_second=1 / 86400, filter=pb.RecoveryFilter(business="ads")
        )
    )
    assert reply.scheduled >= 1


async def test_abandon_by_filter_abandons_exactly_the_matching_parked_tasks_at_its_rate(
    recon, manual_clock, stub
):
    """AbandonByFilter (ADR-0112): a dry run counts and changes nothing; then each matching
    parked task is abandoned as AbandonTask does, one batch a rate's second apart on the
    clock, the others left parked."""
    await park_several(recon, manual_clock)  # ads: f2, f3, d1; ecommerce: f1
    ads = pb.RecoveryFilter(business="ads")
    dry = await stub.AbandonByFilter(pb.AbandonByFilterRequest(filter=ads, dry_run=True))
    assert (dry.matched, list(dry.task_ids)) == (3, [])
    assert await outbox(recon, "task.cancel") == []

    call = asyncio.ensure_future(
        stub.AbandonByFilter(
            pb.AbandonByFilterRequest(filter=ads, rate_per_second=1, reason="campaign over")
        )
    )
    # One task a second: the call waits on the clock between the three.
    sleeps_before = len(manual_clock.sleeps)
    for _ in range(200):
        if call.done():
            break
        manual_clock.advance(seconds=1)
        await asyncio.sleep(0.05)
    reply = await call
    assert manual_clock.sleeps[sleeps_before:].count(1.0) >= 2
    assert reply.matched == 3 and sorted(reply.task_ids) == ["d1", "f2", "f3"]
    cancels = await outbox(recon, "task.cancel")
    assert sorted(task_pb2.CancelRequest.FromString(c.payload).task_id for c in cancels) == [
        "d1",
        "f2",
        "f3",
    ]
    for task_id in ("d1", "f2", "f3"):
        got = await stub.GetRecoveryTask(pb.GetRecoveryTaskRequest(task_id=task_id))
        assert got.task.state == pb.RECOVERY_STATE_ABANDONED
        assert "campaign over" in got.task.reason
        assert "campaign over" in [r.reason for r in got.redrives]
    kept = await stub.GetRecoveryTask(pb.GetRecoveryTaskRequest(task_id="f1"))
    assert kept.task.state == pb.RECOVERY_STATE_PARKED_FAILED


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.AbandonByFilterRequest(rate_per_second=0), "rate_per_second"),
        (pb.AbandonByFilterRequest(rate_per_second=1001), "rate_per_second"),
        (pb.AbandonByFilterRequest(rate_per_second=1, limit=1001), "limit"),
        (
            pb.AbandonByFilterRequest(
                rate_per_second=1,
                filter=pb.RecoveryFilter(states=[pb.RECOVERY_STATE_RESOLVED]),
            ),
            "filter.states",
        ),
    ],
)
async def test_abandon_by_filter_refuses_bad_input_naming_the_field_and_changes_nothing(
    recon, manual_clock, stub, request_, field
):
    await park_several(recon, manual_clock)
    await expect_error(stub.AbandonByFilter(request_), grpc.StatusCode.INVALID_ARGUMENT, field)
    assert await outbox(recon, "task.cancel") == []
