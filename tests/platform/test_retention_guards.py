"""Retention's guards, on each service's store and a real PostgreSQL with a manual clock:
parked and uncertain work is never purged, a resumed task is not finished, a run whose
business is not recorded is kept as long as the longest retention, a reconciler fact still
to notify or parked again is kept; and the business policy file and its errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from dispo.executor.plan import TaskStatusChange
from dispo.executor.states import TaskState
from dispo.executor.store import retention as executor_retention
from dispo.executor.store import task_runs
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.business_policy import BusinessPolicy, PolicyError, Terms, load_policy, parse_policy
from dispo.libs.clock import ManualClock
from dispo.libs.retention import Retention, RetentionSettings
from dispo.reconciler import retention as reconciler_retention

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = BusinessPolicy(Terms(30), {"keeper": Terms(90)})


def envelope(task_id: str, business: str = "shop") -> task_pb2.Task:
    env = task_pb2.Task(task_id=task_id, business=business, status=common_pb2.TASK_STATUS_ACCEPTED)
    env.nodes.add(
        node_id="a.x", status=common_pb2.NODE_STATUS_PENDING, spec=task_pb2.ActionSpec(kind="noop")
    )
    return env


async def executor_ids(db) -> set[str]:
    async with db.connection() as conn:
        return {r.task_id for r in await conn.fetch("SELECT task_id FROM task_runs")}


async def test_the_executor_purges_only_finished_runs_past_their_business_period(service_db):
    db = await service_db("executor")
    clock = ManualClock(T0)
    running = TaskState.RUNNING
    moves = {
        "done": TaskState.SUCCEEDED,
        "failed": TaskState.FAILED,
        "parked": TaskState.RETRY_EXHAUSTED,  # uncertain or spent work, the reconciler's
        "demoted": TaskState.DEMOTED,
        "resumed": TaskState.FAILED,  # opened again by a resume below
        "running": None,
    }
    async with db.transaction() as conn:
        await task_runs.tasks_insert_many(
            conn,
            [(envelope(t), "me") for t in moves] + [(envelope("keeper-done", "keeper"), "me")],
            T0,
            10,
        )
        # a cancel that came before its task.create: no business recorded
        await task_runs.tasks_insert_cancelled_many(conn, ["bare"], "cancelled", T0)
        changes = [
            TaskStatusChange(t, (running,), new, "")
            for t, new in [*moves.items(), ("keeper-done", TaskState.SUCCEEDED)]
            if new is not None
        ]
        await task_runs.tasks_set_status_if_many(conn, changes, T0)
    async with db.transaction() as conn:  # the resume, a month later
        assert await task_runs.tasks_open_many(
            conn, [("resumed", "me")], T0 + timedelta(days=29), 10
        ) == {"resumed"}
    retention = Retention(
        "executor",
        db,
        POLICY,
        clock,
        executor_retention.tasks_businesses_finished,
        executor_retention.tasks_delete_if_finished_many,
        RetentionSettings(batch=1),
        executor_retention.tasks_due,
    )
    clock.set(T0 + timedelta(days=31))
    assert await retention.due() == {"shop": 2}
    purged = [await retention.purge_once() for _ in range(3)]
    assert [p.tasks for p in purged] == [1, 1, 0]  # a batch of one at a time
    assert purged[0].rows == {
        "task_runs": 1,
        "node_runs": 1,
        "worker_runs": 0,
        "signals": 0,
        "waits": 0,
        "task_deadlines": 0,
    }
    assert await executor_ids(db) == {
        "parked",
        "demoted",
        "resumed",
        "running",
        "keeper-done",
        "bare",
    }
    # the keeper's 90 days, and the longest retention for a run with no business
    clock.set(T0 + timedelta(days=91))
    while (await retention.purge_once()).tasks:
        pass
    assert await executor_ids(db) == {"parked", "demoted", "resumed", "running"}


async def test_the_reconciler_keeps_a_fact_still_to_notify_and_a_task_parked_again(service_db):
    db = await service_db("reconciler")
    async with db.transaction() as conn:
        for task_id, notify, reconcile in [
            ("notified", "delivered", "matched"),
            ("to-notify", "pending", "matched"),
            ("to-reconcile", "none", "pending"),
            ("parked-again", "none", "matched"),
            ("ended-after-recovery", "none", "not_sampled"),
        ]:
            await conn.fetch(
                "INSERT INTO completions (task_id, business, status, version, envelope,"
                " finished_at, recorded_at, notify_state, reconcile_state)"
                " VALUES (:id, 'shop', 'succeeded', 1, '', :t, :t, :n, :r)",
                {"id": task_id, "t": T0, "n": notify, "r": reconcile},
            )
        for task_id, state in [
            ("parked-again", "awaiting_decision"),
            ("ended-after-recovery", "redriven"),
        ]:
            await conn.fetch(
                "INSERT INTO recovery_tasks (task_id, business, state, kind, envelope,"
                " generation, task_created_at, first_parked_at, parked_at, updated_at)"
                " VALUES (:id, 'shop', :s, 'fail', '', 1, :t, :t, :t, :t)",
                {"id": task_id, "s": state, "t": T0},
            )
            await conn.fetch(
                "INSERT INTO failure_history (task_id, kind, generation, received_at)"
                " VALUES (:id, 'fail', 1, :t)",
                {"id": task_id, "t": T0},
            )
        # erased tasks' seals (ADR-0114): one of a task the reconciler never held
        for task_id in ("notified", "parked-again", "ended-after-recovery"):
            await conn.fetch(
                "INSERT INTO erasure_seals (task_id, sealed_at, erased_by) VALUES (:id, :t, 'admin')",
                {"id": task_id, "t": T0},
            )
    retention = Retention(
        "reconciler",
        db,
        POLICY,
        ManualClock(T0 + timedelta(days=31)),
        reconciler_retention.businesses,
        reconciler_retention.purge,
        due=reconciler_retention.due,
    )
    assert await retention.due() == {"shop": 2}
    purged = await retention.purge_once()
    assert purged.tasks == 2
    assert purged.rows["recovery_tasks"] == 1 and purged.rows["failure_history"] == 1
    assert purged.rows["erasure_seals"] == 2
    async with db.connection() as conn:
        facts = {r.task_id for r in await conn.fetch("SELECT task_id FROM completions")}
        parked = {r.task_id for r in await conn.fetch("SELECT task_id FROM recovery_tasks")}
        sealed = {r.task_id for r in await conn.fetch("SELECT task_id FROM erasure_seals")}
    assert facts == {"to-notify", "to-reconcile", "parked-again"}
    assert parked == {"parked-again"}
    assert sealed == {"parked-again"}


def test_a_business_takes_the_default_terms_and_its_own_over_them(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("default: {retention_days: 10}\nbusinesses:\n  keeper: {retention_days: 90}\n")
    policy = load_policy(path)
    assert policy.terms("keeper").retention_days == 90
    assert policy.terms("anyone").retention_days == 10
    assert policy.longest_retention == timedelta(days=90)
    assert policy.cutoffs(["anyone", ""], T0) == {
        "anyone": T0 - timedelta(days=10),
        "": T0 - timedelta(days=90),
    }
    assert load_policy("").terms("x").retention_days == 30


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"default": {"retention_days": 0}}, "default.retention_days"),
        ({"default": {"retention_days": "30"}}, "default.retention_days"),
        ({"businesses": {"shop": {"retention": 3}}}, "businesses.shop.retention"),
        ({"businesses": ["shop"]}, "businesses"),
        ({"defaults": {}}, "defaults"),
    ],
)
def test_a_policy_that_is_not_one_names_its_entry(data, named):
    with pytest.raises(PolicyError, match=named):
        parse_policy(data)
