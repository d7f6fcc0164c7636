"""One list of failed and parked work (ListFailedWork): tasks that ended FAILED from any
cause, failed ones awaiting a redrive, demoted ones and those with UNKNOWN nodes, with
filters by kind, business, downstream and age, in keyset pages."""

from typing import Any

import grpc
import pytest
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.libs.api.task.v1 import task_pb2
from dispo.reconciler.recovery import redrive
from dispo.reconciler.sweeps import run_sweeps

from .conftest import envelope, node

K = pb.WorkKind


def permanent(task_id: str, **kw: Any) -> task_pb2.Task:
    return envelope(
        task_id,
        [node("a.set_label", "FAILED", error="HTTP 400: no", retryable=False, task_id=task_id)],
        status="FAILED",
        **kw,
    )


async def fill(recon, manual_clock) -> None:
    """One of each kind, a second apart, oldest first: p (FAILED, a 4xx), r (awaiting a
    redrive), d (demoted, on review), u (UNKNOWN outcome), s (FAILED, policy spent)."""
    spent = envelope(
        "s", [node("a.set_label", "FAILED", error="HTTP 503", task_id="s")], business="search"
    )
    await redrive.intake(recon, spent, "fail")  # search: max_redrives 1
    manual_clock.advance(seconds=60)
    await run_sweeps(recon, "redrive")  # its one redrive
    await redrive.intake(recon, permanent("p", business="search"), "fail")
    manual_clock.advance(seconds=1)
    retry = envelope("r", [node("a.set_label", "FAILED", error="HTTP 503", task_id="r")])
    await redrive.intake(recon, retry, "fail")
    manual_clock.advance(seconds=1)
    demoted = envelope(
        "d", [node("a.set_label", "DEMOTED", downstream="review", task_id="d")], status="DEMOTED"
    )
    await redrive.intake(recon, demoted, "demote")
    manual_clock.advance(seconds=1)
    unknown = envelope(
        "u", [node("a.set_label", "UNKNOWN", probe=False, idempotent=False, task_id="u")]
    )
    await redrive.intake(recon, unknown, "fail")
    await run_sweeps(recon, "settle")  # AWAITING_DECISION
    manual_clock.advance(seconds=1)
    spent.generation += 1
    await redrive.intake(recon, spent, "fail")  # failed again: the policy is spent, FAILED
    manual_clock.advance(seconds=100)


async def listed(stub, **filter_kw) -> list[tuple[str, int]]:
    reply = await stub.ListFailedWork(
        pb.ListFailedWorkRequest(filter=pb.FailedWorkFilter(**filter_kw))
    )
    return [(w.task.task_id, w.kind) for w in reply.work]


async def test_every_kind_of_failed_and_parked_work_in_one_list(recon, manual_clock, stub):
    await fill(recon, manual_clock)

    assert await listed(stub) == [
        ("p", K.WORK_KIND_FAILED),
        ("r", K.WORK_KIND_AWAITING_REDRIVE),
        ("d", K.WORK_KIND_DEMOTED),
        ("u", K.WORK_KIND_UNKNOWN_OUTCOME),
        ("s", K.WORK_KIND_FAILED),
    ]
    assert await listed(stub, kinds=[K.WORK_KIND_FAILED]) == [
        ("p", K.WORK_KIND_FAILED),
        ("s", K.WORK_KIND_FAILED),
    ]
    assert await listed(stub, kinds=[K.WORK_KIND_DEMOTED, K.WORK_KIND_UNKNOWN_OUTCOME]) == [
        ("d", K.WORK_KIND_DEMOTED),
        ("u", K.WORK_KIND_UNKNOWN_OUTCOME),
    ]
    assert [t for t, _ in await listed(stub, business="search")] == ["p", "s"]
    assert [t for t, _ in await listed(stub, downstream="review")] == ["d"]
    # Ages on the reconciler's clock: parked 104, 103, 102, 101 and 100 s ago.
    assert [t for t, _ in await listed(stub, min_age_seconds=103)] == ["p", "r"]
    assert [t for t, _ in await listed(stub, max_age_seconds=101)] == ["u", "s"]
    reply = await stub.ListFailedWork(pb.ListFailedWorkRequest())
    ages = {w.task.task_id: w.age_seconds for w in reply.work}
    assert ages == {"p": 104, "r": 103, "d": 102, "u": 101, "s": 100}
    assert "HTTP 400" in reply.work[0].task.reason


async def test_paged_by_key_without_gaps_or_repeats(recon, manual_clock, stub):
    await fill(recon, manual_clock)
    seen, token, pages = [], "", 0
    while True:
        reply = await stub.ListFailedWork(
            pb.ListFailedWorkRequest(page=common_pb2.PageRequest(page_size=2, page_token=token))
        )
        seen += [w.task.task_id for w in reply.work]
        pages += 1
        token = reply.page.next_page_token
        if not token:
            break
    assert seen == ["p", "r", "d", "u", "s"] and pages == 3


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.ListFailedWorkRequest(filter=pb.FailedWorkFilter(kinds=[0])), "filter.kinds[0]"),
        (pb.ListFailedWorkRequest(filter=pb.FailedWorkFilter(kinds=[99])), "filter.kinds[0]"),
        (
            pb.ListFailedWorkRequest(filter=pb.FailedWorkFilter(max_age_seconds=2**62)),
            "filter.max_age_seconds",
        ),
        (
            pb.ListFailedWorkRequest(page=common_pb2.PageRequest(page_token="nope")),
            "page.page_token",
        ),
    ],
)
async def test_bad_filters_are_refused_naming_the_field(stub, request_, field):
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.ListFailedWork(request_)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in refused.value.details()
