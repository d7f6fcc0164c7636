"""Delayed starts (ADR-0103): a task submitted with ``not_before`` is accepted at once and
durably, and its task.create is published no earlier than ``not_before`` on the gateway's
clock; until then it is listed as scheduled and a cancel takes it back whole. On the real
database and bus, with the relay's passes called one at a time."""

from __future__ import annotations

from datetime import timedelta

import pytest
from dispo.gateway import store
from dispo.gateway.expand import CellRequest, Submission
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.clock import ManualClock
from dispo.libs.contracts import tasks
from dispo.libs.db.driver import Statement
from dispo.libs.errors import InvalidArgument
from dispo.libs.outbox import _sql
from dispo.libs.timestamps import from_timestamp
from support.plans import plan_nodes


async def on_the_bus(bus) -> list[str]:
    return [m.msg_id for m in await bus.read_subject("TASKS", tasks.TASK_CREATE, limit=100)]


async def scheduled(gateway, now) -> list[str]:
    return [
        t.task_id
        for t in await gateway.list(
            store.TaskFilter(scheduled_at=now), statuses=[], after=None, limit=10
        )
    ]


async def test_a_delayed_task_is_published_on_time_not_before(make_gateway, bus):
    await tasks.TASKS.ensure(bus)
    clock = ManualClock()
    gateway = make_gateway(clock=clock)
    start = clock.now() + timedelta(seconds=60)
    delayed = Submission("tests", [CellRequest("noop")], not_before=start)
    task_id = (await gateway.submit(delayed)).task_id
    view = await gateway.get(task_id)
    assert view.status == common_pb2.TASK_STATUS_ACCEPTED
    assert from_timestamp(view.not_before, view.HasField("not_before")) == start
    assert await scheduled(gateway, clock.now()) == [task_id]

    clock.advance(59)
    assert await gateway.relay.relay_once() == 0  # not due: the pass leaves it
    assert await on_the_bus(bus) == []
    assert await scheduled(gateway, clock.now()) == [task_id]

    clock.advance(1)
    assert await gateway.relay.relay_once() == 1  # due: released, claimed, published
    assert await on_the_bus(bus) == [tasks.create_id(task_id, 0)]
    assert await scheduled(gateway, clock.now()) == []


async def test_a_task_cancelled_before_its_start_never_reaches_the_bus(make_gateway, bus):
    await tasks.TASKS.ensure(bus)
    clock = ManualClock()
    gateway = make_gateway(clock=clock)
    start = clock.now() + timedelta(hours=1)
    task_id = (
        await gateway.submit(Submission("tests", [CellRequest("noop")], not_before=start))
    ).task_id

    view = await gateway.cancel(task_id)

    assert view.status == common_pb2.TASK_STATUS_CANCELLED
    assert view.status_reason == "cancelled before publication"
    clock.advance(hours=2)
    await gateway.relay.relay_once()
    await gateway.relay.relay_once()
    assert await on_the_bus(bus) == []
    assert await scheduled(gateway, clock.now() - timedelta(hours=2)) == []


async def test_a_start_in_the_past_runs_now(make_gateway, bus):
    """A not_before not after now is no delay: the row goes out as any other."""
    await tasks.TASKS.ensure(bus)
    clock = ManualClock()
    gateway = make_gateway(clock=clock)
    past = clock.now() - timedelta(minutes=5)
    task_id = (
        await gateway.submit(Submission("tests", [CellRequest("noop")], not_before=past))
    ).task_id
    assert not (await gateway.get(task_id)).HasField("not_before")
    assert await gateway.relay.relay_once() == 1
    assert await on_the_bus(bus) == [tasks.create_id(task_id, 0)]


@pytest.mark.parametrize(
    ("asked", "field"),
    [
        ({"not_before": timedelta(days=367)}, "not_before"),
        ({"deadline": timedelta(days=367)}, "deadline"),
        ({"deadline": timedelta(seconds=-1)}, "deadline"),
        ({"not_before": timedelta(hours=2), "deadline": timedelta(hours=1)}, "deadline"),
    ],
)
async def test_times_beyond_the_horizon_or_past_are_refused_naming_the_field(
    make_gateway, bus, asked, field
):
    clock = ManualClock()
    gateway = make_gateway(clock=clock)
    times = {name: clock.now() + delta for name, delta in asked.items()}
    with pytest.raises(InvalidArgument) as refused:
        await gateway.submit(Submission("tests", [CellRequest("noop")], **times))
    assert [v.field for v in refused.value.violations] == [field]
    async with gateway.db.connection() as conn:
        assert await conn.scalars("SELECT count(*) FROM tasks") == [0]


async def test_the_passes_hot_query_reads_no_delayed_row(make_gateway, bus):
    """The pass's query runs on the unsent index, which leaves the delayed rows out: a
    thousand tasks waiting for their start cost it nothing (no row read and filtered)."""
    await tasks.TASKS.ensure(bus)
    clock = ManualClock()
    gateway = make_gateway(clock=clock)
    start = clock.now() + timedelta(days=1)
    subs = [Submission("tests", [CellRequest("noop")], not_before=start) for _ in range(1000)]
    await gateway.submit_all(subs, [await gateway.prepare(s) for s in subs])
    unsent = _sql(store.outbox).unsent(ordered=False, held=False)
    explain = Statement("EXPLAIN (ANALYZE, FORMAT JSON) " + unsent.text)
    async with gateway.db.connection() as conn:
        await conn.fetch("ANALYZE outbox")
        [[plan]] = await explain.fetch(conn, {"now": clock.now(), "limit": 500})
    nodes = plan_nodes(plan)
    scans = [n for n in nodes if "Index Name" in n]
    assert [n["Index Name"] for n in scans] == ["outbox_unsent"], nodes
    assert all(n.get("Rows Removed by Filter", 0) == 0 for n in nodes), nodes
    assert await gateway.relay.relay_once() == 0


async def test_a_tasks_status_is_still_updated_in_place(make_gateway, bus):
    """The scheduled index covers the start alone, not the status: a snapshot taking a
    task's view to RUNNING stays a HOT update (ADR-0061), delayed task or not."""
    from dispo.libs.api.task.v1 import task_pb2

    await tasks.TASKS.ensure(bus)
    clock = ManualClock()
    gateway = make_gateway(clock=clock)
    start = clock.now() + timedelta(hours=1)
    subs = [
        Submission("tests", [CellRequest("noop")], not_before=start if i % 2 else None)
        for i in range(40)
    ]
    accepted = await gateway.submit_all(subs, [await gateway.prepare(s) for s in subs])
    snapshots = [
        store.Snapshot(
            a.task_id,
            1,
            "running",
            task_pb2.Task(
                task_id=a.task_id, status=common_pb2.TASK_STATUS_RUNNING
            ).SerializeToString(),
        )
        for a in accepted
    ]
    async with gateway.db.transaction() as conn:
        applied = await store.tasks_apply_snapshots(conn, snapshots, clock.now())
        [(updated, hot)] = await conn.fetch(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'tasks'"
        )
    assert len(applied) == 40
    assert updated == 40 and hot >= 0.9 * updated, (updated, hot)
