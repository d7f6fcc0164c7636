"""Tasks found by priority: ListTasks, CountTasks and CancelByFilter take ``priorities``
(any of them, 1 highest … 5), within the caller's business, refused naming the field for a
value outside 1..5; a rare priority is read through ix_tasks_priority, whose tasks' status
updates stay HOT. Through the real gateway, or on the real database and bus."""

from __future__ import annotations

import grpc
import pytest
from dispo.gateway import store
from dispo.gateway.bulk import store as bulk_store
from dispo.gateway.bulk.operations import BulkCancels
from dispo.gateway.expand import CellRequest, Submission
from dispo.gateway.servicer import bulk_filter
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.clock import ManualClock
from dispo.libs.contracts import tasks
from dispo.sdk import DispoError, cell
from sqlalchemy import text
from support import eventually
from support.auth import admin_channel, business_token
from support.plans import hot_updates, plan_nodes


def status_counts(**given: int) -> dict[str, int]:
    """CountTasks' answer: every status, ``given`` ones as given, the others 0."""
    names = [common_pb2.TaskStatus.Name(v).removeprefix("TASK_STATUS_") for v in range(1, 8)]
    return {name: given.get(name, 0) for name in names}


async def test_tasks_are_listed_and_counted_by_priority_within_the_callers_business(
    gateway_only, database_url
):
    async with gateway_only.client() as admin:
        by_priority = {
            p: [(await admin.submit("pri-a", [cell("noop")], priority=p)).task_id for _ in range(n)]
            for p, n in ((1, 2), (2, 1), (5, 3))
        }
        plain = (await admin.submit("pri-a", [cell("noop")])).task_id  # the default, 3
        theirs = (await admin.submit("pri-b", [cell("noop")], priority=1)).task_id

        async def ids(**filters) -> set[str]:
            return {t.task_id async for t in admin.list(**filters)}

        assert await ids(priorities=[1]) == {*by_priority[1], theirs}
        assert await ids(business="pri-a", priorities=[1]) == set(by_priority[1])
        assert await ids(business="pri-a", priorities=[1, 2]) == {
            *by_priority[1],
            *by_priority[2],
        }
        assert await ids(business="pri-a", priorities=[3]) == {plain}
        assert await ids(business="pri-a", priorities=[4]) == set()
        assert len(await ids(business="pri-a")) == 7
        page = await admin.list_page(business="pri-a", priorities=[5], page_size=2)
        assert page.more and {t.priority for t in page.tasks} == {5}
        assert await admin.count(business="pri-a", priorities=[1, 5]) == status_counts(ACCEPTED=5)
        assert await admin.count(priorities=[1]) == status_counts(ACCEPTED=3)

    # A business token finds its own tasks of that priority only.
    _, secret = await business_token(database_url, "pri-b")
    async with gateway_only.client(secret) as own:
        assert [t.task_id async for t in own.list(priorities=[1])] == [theirs]
        assert await own.count(priorities=[2]) == status_counts()


async def test_a_priority_filter_outside_1_to_5_is_refused_naming_it_and_changes_nothing(
    gateway_only, gateway_client, service_engine
):
    for call in (gateway_client.list_page, gateway_client.count):
        for given, named in (([0], "priorities[0]"), ([1, 6], "priorities[1]"), ([-1], None)):
            with pytest.raises(DispoError) as refused:
                await call(priorities=given)
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT, given
            assert set(refused.value.violations) == {named or "priorities[0]"}, given
    request = gateway_pb2.CancelByFilterRequest(
        filter=gateway_pb2.CountTasksRequest(business="pri-c", priorities=[2, 9]),
        rate_per_second=10,
    )
    async with admin_channel(gateway_only.gateway.address) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.CancelByFilter(request)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert set(DispoError.from_rpc(refused.value).violations) == {"filter.priorities[1]"}
    engine = await service_engine("gateway")
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM bulk_actions"))).scalar() == 0


async def test_a_bulk_cancel_by_priority_takes_only_the_tasks_of_that_priority(make_gateway, bus):
    await tasks.TASKS.ensure(bus)
    clock = ManualClock()
    gateway = make_gateway(clock=clock)
    bulk = BulkCancels(gateway, bulk_filter(128), batch=500, max_rate=1000)
    subs = [Submission("tests", [CellRequest("noop")], priority=1 + i % 5) for i in range(50)]
    accepted = await gateway.submit_all(subs, [await gateway.prepare(s) for s in subs])
    low = {a.task_id for a, s in zip(accepted, subs, strict=True) if s.priority in (4, 5)}

    clock.advance(1)  # a bulk action takes the tasks created before it was asked
    asked = gateway_pb2.CancelByFilterRequest(
        filter=gateway_pb2.CountTasksRequest(business="tests", priorities=[4, 5]),
        rate_per_second=1000,
    )
    matched, action = await bulk.start(asked, ["accepted"], "tok-ops")
    assert matched == 20 and action is not None
    while await bulk.run_once():
        pass
    async with gateway.db.connection() as conn:
        rows = await conn.fetch("SELECT task_id, cancel_requested FROM tasks")
        [done] = await bulk_store.bulk_actions_list(conn, None, 10, 0)
    assert {r[0] for r in rows if r[1]} == low
    assert (done.acted, done.state) == (20, "done")


async def test_a_rare_priority_is_read_through_its_index_and_status_updates_stay_hot(
    make_gateway, bus
):
    """ListTasks of one business at priority 1, planned as a prepared statement is once
    PostgreSQL keeps its generic plan, reads ix_tasks_priority (the partial index over the
    tasks not at the default priority), not every task of the business; a priority-1
    task's status update is HOT (ADR-0061): the priority never changes."""
    await tasks.TASKS.ensure(bus)
    gateway = make_gateway(clock=ManualClock())
    subs = [
        Submission("tests", [CellRequest("noop")], priority=1 if i % 100 == 0 else 3)
        for i in range(3000)
    ]
    for first in range(0, len(subs), 500):
        chunk = subs[first : first + 500]
        await gateway.submit_all(chunk, [await gateway.prepare(s) for s in chunk])
    matching = store.TaskFilter(business="tests", priorities=(1,))
    params: dict = {}
    where = " AND ".join(matching.where(params)).replace(":business", "$1")
    assert params == {"business": "tests"}
    async with gateway.db.transaction() as conn:
        await conn.fetch("ANALYZE tasks")
        await conn.fetch("SET LOCAL plan_cache_mode = force_generic_plan")
        await conn.fetch(
            f"PREPARE by_priority(text) AS SELECT task_id FROM tasks WHERE {where}"
            " ORDER BY created_at DESC, task_id DESC LIMIT 51"
        )
        [[plan]] = await conn.fetch("EXPLAIN (FORMAT JSON) EXECUTE by_priority('tests')")
        await conn.fetch("DEALLOCATE by_priority")
    async with gateway.db.connection() as conn:
        found = await gateway.list(matching, statuses=[], after=None, limit=100)
        assert len(found) == 30 and {t.priority for t in found} == {1}
        before = await hot_updates(conn, "tasks")
        first = found[0].task_id
        await store.task_set_view(
            conn, first, task_pb2.Task(task_id=first), "running", gateway.clock.now()
        )
    nodes = plan_nodes(plan)
    assert "ix_tasks_priority" in [n.get("Index Name") for n in nodes], nodes
    assert not any(n["Node Type"] == "Seq Scan" for n in nodes), nodes

    async def counted() -> int:
        async with gateway.db.connection() as conn:
            return await hot_updates(conn, "tasks")

    await eventually(counted, lambda after: after == before + 1, timeout=10)
