"""Bulk cancels (ADR-0112): CancelByFilter's action takes exactly the unfinished tasks its
filter matched when it was asked, through CancelTask's path, at its rate on the gateway's
clock, and keeps a record of who asked; a dry run only counts. On the real database and
bus, with the bulk pass and the relay called one at a time."""

from __future__ import annotations

from datetime import timedelta

import pytest
from dispo.gateway.bulk import store as bulk_store
from dispo.gateway.bulk.convert import check_cancel
from dispo.gateway.bulk.operations import BulkCancels
from dispo.gateway.expand import CellRequest, Submission
from dispo.gateway.servicer import bulk_filter
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.gateway.v1 import gateway_pb2
from dispo.libs.clock import ManualClock
from dispo.libs.contracts import tasks
from dispo.libs.errors import InvalidArgument
from dispo.libs.timestamps import set_timestamp

# 5,000 tasks of the filter's business and window, as the issue asks.
IN_WINDOW = 5000
CHUNK = 500


async def submit(gateway, business: str, count: int, *, delayed: bool = True) -> list[str]:
    """``count`` tasks of ``business`` created now on the gateway's clock; delayed ones wait
    in the outbox (their start a day ahead), the others are published by the relay."""
    start = gateway.clock.now() + timedelta(days=1) if delayed else None
    ids: list[str] = []
    for first in range(0, count, CHUNK):
        subs = [
            Submission(business, [CellRequest("noop")], not_before=start)
            for _ in range(min(CHUNK, count - first))
        ]
        news = [await gateway.prepare(s) for s in subs]
        ids += [a.task_id for a in await gateway.submit_all(subs, news)]
    return ids


async def states(gateway, ids: list[str]) -> set[tuple[str, bool]]:
    """The (status, cancel asked) of ``ids``."""
    async with gateway.db.connection() as conn:
        rows = await conn.fetch(
            "SELECT status, cancel_requested FROM tasks WHERE task_id = ANY(CAST(:ids AS text[]))",
            {"ids": ids},
        )
    return {(r[0], r[1]) for r in rows}


def cancel_request(after, before, **fields) -> gateway_pb2.CancelByFilterRequest:
    request = gateway_pb2.CancelByFilterRequest(
        filter=gateway_pb2.CountTasksRequest(business="tests"), **fields
    )
    set_timestamp(request.filter.created_after, after)
    set_timestamp(request.filter.created_before, before)
    return request


async def test_a_bulk_cancel_takes_exactly_its_filters_tasks_at_its_rate(make_gateway, bus):
    await tasks.TASKS.ensure(bus)
    clock = ManualClock()
    gateway = make_gateway(clock=clock)
    bulk = BulkCancels(gateway, bulk_filter(128), batch=500, max_rate=1000)

    before_window = await submit(gateway, "tests", 20)
    clock.advance(60)
    window_start = clock.now()
    published = await submit(gateway, "tests", 30, delayed=False)
    while await gateway.relay.relay_once():
        pass
    in_window = published + await submit(gateway, "tests", IN_WINDOW - len(published))
    other_business = await submit(gateway, "other", 40)
    clock.advance(60)
    window_end = clock.now()
    after_window = await submit(gateway, "tests", 20)
    untouched = before_window + other_business + after_window

    # A dry run counts and writes nothing.
    dry = cancel_request(window_start, window_end, dry_run=True)
    matched, action = await bulk.start(dry, ["accepted", "running"], "tok-dry")
    assert (matched, action) == (IN_WINDOW, None)
    async with gateway.db.connection() as conn:
        assert await bulk_store.bulk_actions_list(conn, None, 10, 0) == []
    assert await states(gateway, in_window + untouched) == {("accepted", False)}

    asked = cancel_request(window_start, window_end, rate_per_second=1000, reason="import")
    matched, action = await bulk.start(asked, ["accepted", "running"], "tok-ops")
    assert matched == IN_WINDOW and action is not None

    # One second's worth at once, then the rest as the clock lets the rate allow it.
    assert await bulk.run_once() == 1000
    assert await bulk.run_once() == 0
    passes = 1
    while (await gateway.relay.relay_once()) or await bulk.run_once():
        clock.advance(1)
        passes += 1
    assert passes >= IN_WINDOW // 1000

    # Published ones stay ACCEPTED here until the executor ends them; their cancel is asked.
    assert await states(gateway, published) == {("accepted", True)}
    assert await states(gateway, in_window[len(published) :]) == {("cancelled", True)}
    assert await states(gateway, untouched) == {("accepted", False)}
    # Each asked on the bus as CancelTask asks it (task.cancel), no other task.
    cancels = await bus.read_subject("TASKS", tasks.TASK_CANCEL, limit=IN_WINDOW + 100)
    assert {m.msg_id for m in cancels} == {tasks.cancel_id(t) for t in in_window}

    async with gateway.db.connection() as conn:
        record = await bulk_store.bulk_action_get(conn, action.action_id)
    assert record is not None
    assert (record.state, record.actor, record.reason, record.kind) == (
        "done",
        "tok-ops",
        "import",
        "cancel",
    )
    assert (record.matched, record.processed, record.acted, record.skipped) == (
        IN_WINDOW,
        IN_WINDOW,
        IN_WINDOW,
        0,
    )
    assert record.finished_at is not None
    assert gateway_pb2.CancelByFilterRequest.FromString(record.request) == asked


async def test_a_bulk_cancel_skips_tasks_already_asked_and_never_takes_newer_ones(
    make_gateway, bus
):
    await tasks.TASKS.ensure(bus)
    clock = ManualClock()
    gateway = make_gateway(clock=clock)
    bulk = BulkCancels(gateway, bulk_filter(128), batch=2, max_rate=1000)
    start = clock.now() - timedelta(seconds=1)
    ids = await submit(gateway, "tests", 5)
    await gateway.cancel(ids[0])
    clock.advance(1)
    request = cancel_request(start, clock.now() + timedelta(hours=1), rate_per_second=3)
    matched, action = await bulk.start(request, ["accepted"], "tok")
    assert matched == 4  # the cancelled one is finished already
    newer = await submit(gateway, "tests", 3)  # after the call: not the action's

    while await bulk.run_once() or (await _running(gateway)):
        clock.advance(1)
    async with gateway.db.connection() as conn:
        record = await bulk_store.bulk_action_get(conn, action.action_id)
    assert record is not None
    assert (record.state, record.processed, record.acted) == ("done", 4, 4)
    assert await states(gateway, ids) == {("cancelled", True)}
    assert await states(gateway, newer) == {("accepted", False)}


async def _running(gateway) -> bool:
    async with gateway.db.connection() as conn:
        return bool(await bulk_store.bulk_actions_running(conn))


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"statuses": [common_pb2.TASK_STATUS_SUCCEEDED]}, "statuses[0]"),
        ({"statuses": [common_pb2.TASK_STATUS_UNSPECIFIED]}, "statuses[0]"),
        ({"rate_per_second": 0}, "rate_per_second"),
        ({"rate_per_second": 1001}, "rate_per_second"),
    ],
)
def test_a_bulk_cancel_refuses_a_finished_status_or_a_rate_out_of_bounds(fields, field):
    request = gateway_pb2.CancelByFilterRequest(**{"rate_per_second": 10, **fields})
    with pytest.raises(InvalidArgument) as refused:
        check_cancel(request, 1000)
    assert [v.field for v in refused.value.violations] == [field]
