"""The executor's guarded writes against real PostgreSQL, including true races."""

import asyncio
import re
from datetime import UTC, datetime

from dispo.executor import repository as repo
from dispo.executor.states import NodeState, TaskState
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.task.v1 import task_pb2
from sqlalchemy import text

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def envelope(task_id="t1"):
    env = task_pb2.Task(task_id=task_id, business="b", status=common_pb2.TASK_STATUS_ACCEPTED)
    env.nodes.add(
        node_id="a.x", status=common_pb2.NODE_STATUS_PENDING, spec=task_pb2.ActionSpec(kind="noop")
    )
    return env


async def check_values(conn, constraint):
    definition = (
        await conn.execute(
            text("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = :n"),
            {"n": constraint},
        )
    ).scalar()
    return set(re.findall(r"'([A-Z_]+)'", definition))


async def test_database_checks_mirror_the_state_machines(service_engine):
    engine = await service_engine("executor")
    async with engine.connect() as conn:
        assert await check_values(conn, "ck_node_run_status") == {s.value for s in NodeState}
        assert await check_values(conn, "ck_task_run_status") == {s.value for s in TaskState}
    gateway = await service_engine("gateway")
    async with gateway.connect() as conn:
        assert await check_values(conn, "ck_task_status") == {s.value for s in TaskState}


async def test_exactly_one_of_concurrent_lease_takers_wins(service_engine):
    engine = await service_engine("executor")
    async with engine.begin() as conn:
        await repo.task_insert(conn, envelope(), "t1", NOW)

    async def take(owner):
        async with engine.begin() as conn:
            return await repo.lease_take(conn, "t1", owner, NOW, 10)

    results = await asyncio.gather(*(take(f"o{i}") for i in range(8)))

    assert sorted(results) == [False] * 7 + [True]


async def test_exactly_one_of_concurrent_node_claims_wins_and_only_the_owner_records(
    service_engine,
):
    engine = await service_engine("executor")
    async with engine.begin() as conn:
        await repo.task_insert(conn, envelope(), "t1", NOW)
        await repo.lease_take(conn, "t1", "me", NOW, 10)

    async def claim():
        async with engine.begin() as conn:
            return await repo.node_claim_if_pending(conn, "t1", "a.x", "me", NOW)

    results = await asyncio.gather(*(claim() for _ in range(8)))
    assert sorted(results) == [False] * 7 + [True]

    async with engine.begin() as conn:
        assert not await repo.node_claim_if_pending(
            conn, "t1", "a.x", "other", NOW
        )  # not the lease holder
        assert not await repo.node_set_status_if(
            conn, "t1", "a.x", NodeState.RUNNING, NodeState.SUCCEEDED, owner="other"
        )
        assert await repo.node_set_status_if(
            conn, "t1", "a.x", NodeState.RUNNING, NodeState.SUCCEEDED, owner="me"
        )
        # A SUCCEEDED node is never claimed again, and a newer envelope cannot reset it.
        assert not await repo.node_claim_if_pending(conn, "t1", "a.x", "me", NOW)
        newer = envelope()
        newer.generation = 5
        await repo.nodes_adopt(conn, newer)
        nodes = await repo.nodes_get(conn, newer)
    assert nodes["a.x"].status is NodeState.SUCCEEDED
