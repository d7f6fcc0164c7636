"""Retention of what a service keeps besides its tasks' rows, on each service's store and a
real PostgreSQL with a manual clock: the gateway's finished bulk actions go past their
business's retention (an action of every business past the longest), a running one never;
a quarantined outbox row or a quarantined message of a status snapshot or a callback goes
once set aside longer than the longest retention, and one of work (task.create, task.fail,
task.cancel) is kept until an operator replays or discards it; the dry run counts both."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from dispo.executor.store.status_events import outbox as executor_outbox
from dispo.gateway import store as gateway_store
from dispo.gateway.bulk import store as bulk_store
from dispo.libs import metrics
from dispo.libs.business_policy import BusinessPolicy, Terms
from dispo.libs.clock import ManualClock
from dispo.libs.contracts import AGING_STREAMS, aging_subjects_pattern, tasks
from dispo.libs.outbox import OutboxRow, outbox_add_many
from dispo.libs.quarantine import Poisoned, QuarantineStore
from dispo.libs.retention import (
    BULK_ACTIONS_RULE,
    RecordCounts,
    Retention,
    RetentionSettings,
    business_records,
    outbox_records,
    quarantine_records,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = BusinessPolicy(Terms(30), {"keeper": Terms(90)})


async def nothing(conn, *args):
    return []


async def no_tasks(conn, cutoffs, limit):
    raise AssertionError("no business holds tasks here")


def retention(db, clock: ManualClock, records, batch: int = 500) -> Retention:
    """The service's retention with no task of its own, only ``records``."""
    return Retention(
        "test",
        db,
        POLICY,
        clock,
        nothing,
        no_tasks,
        RetentionSettings(batch=batch),
        records=records,
    )


def bulk_records():
    return business_records(
        "bulk_actions",
        BULK_ACTIONS_RULE,
        bulk_store.bulk_actions_businesses,
        bulk_store.bulk_actions_delete_if_done_many,
        bulk_store.bulk_actions_due,
    )


def action(action_id: str, business: str) -> bulk_store.BulkActionRow:
    return bulk_store.BulkActionRow(
        action_id, "cancel", business, "admin", "", b"", 10.0, T0, "running", 1, 0, 0, 0,
        None, None, T0, T0, None,
    )  # fmt: skip


async def rows(db, sql: str) -> set:
    async with db.connection() as conn:
        return {tuple(r) if len(r) > 1 else r[0] for r in await conn.fetch(sql)}


async def test_finished_bulk_actions_go_past_their_business_retention_a_running_one_never(
    service_db,
):
    db = await service_db("gateway")
    async with db.transaction() as conn:
        await bulk_store.bulk_actions_insert_many(
            conn,
            [
                action("shop-done", "shop"),
                action("shop-running", "shop"),
                action("keeper-done", "keeper"),
                action("every-done", ""),  # an admin's action across every business
            ],
            T0,
        )
        await bulk_store.bulk_actions_advance_if_running_many(
            conn,
            [
                bulk_store.Advance(a, 0, 1, 1, 0, (T0, "t"), True)
                for a in ("shop-done", "keeper-done", "every-done")
            ],
            T0 + timedelta(hours=1),
        )
    clock = ManualClock(T0 + timedelta(days=30))
    purging = retention(db, clock, [bulk_records()], batch=1)
    before = metrics._RETENTION_PURGED("bulk_actions")._value.get()

    # 30 days after it finished, the shop's action is within its period still
    assert (await purging.purge_once()).rows == {"bulk_actions": 0}
    clock.set(T0 + timedelta(days=31))
    [report] = await purging.records_report()
    assert (report.table, report.counts) == ("bulk_actions", RecordCounts(due=1))
    purged = await purging.purge_once()
    assert purged.rows == {"bulk_actions": 1} and purged.full  # a batch of one, full
    assert await rows(db, "SELECT action_id FROM bulk_actions") == {
        "shop-running",
        "keeper-done",
        "every-done",
    }
    # the keeper's 90 days; an action of every business is kept as long as the longest
    clock.set(T0 + timedelta(days=91))
    assert (await purging.records_report())[0].counts == RecordCounts(due=2)
    while (await purging.purge_once()).rows["bulk_actions"]:
        pass
    assert await rows(db, "SELECT action_id FROM bulk_actions") == {"shop-running"}
    assert metrics._RETENTION_PURGED("bulk_actions")._value.get() - before == 3


async def quarantine_outbox(db, table, subjects: dict[str, str], at: datetime) -> None:
    """One outbox row per msg_id with its subject, every one but ``unsent`` quarantined at
    ``at``."""
    async with db.transaction() as conn:
        await outbox_add_many(
            conn, table, [OutboxRow(s, m, b"payload", T0) for m, s in subjects.items()]
        )
        await conn.fetch(
            f"UPDATE {table.fullname} SET quarantined_at = :at, attempts = 8,"
            " last_error = 'refused' WHERE msg_id <> 'unsent'",
            {"at": at},
        )


async def test_quarantined_outbox_rows_of_snapshots_go_past_the_longest_retention_work_stays(
    service_db,
):
    db = await service_db("executor")
    await quarantine_outbox(
        db,
        executor_outbox,
        {
            "snapshot": "task.status.t1.succeeded",
            "failure": "task.fail",  # parked work the reconciler never heard of
            "retry": "task.create",  # a task never run again
            "unsent": "task.status.t2.running",  # not quarantined: the relay's
        },
        T0 + timedelta(days=1),
    )
    clock = ManualClock(T0 + timedelta(days=90))  # created 90 days ago, set aside 89
    purging = retention(db, clock, [outbox_records(executor_outbox)])
    assert (await purging.records_report())[0].counts == RecordCounts(due=0, held=2)
    assert (await purging.purge_once()).rows == {"outbox": 0}
    # the longest retention (90 days) since it was set aside, not since it was written
    clock.set(T0 + timedelta(days=91, seconds=1))
    assert (await purging.records_report())[0].counts == RecordCounts(due=1, held=2)
    assert (await purging.purge_once()).rows == {"outbox": 1}
    assert await rows(db, "SELECT msg_id FROM outbox") == {"failure", "retry", "unsent"}
    # work is kept however old, until an operator replays or discards it
    clock.set(T0 + timedelta(days=3650))
    assert (await purging.purge_once()).rows == {"outbox": 0}
    assert await rows(db, "SELECT msg_id FROM outbox") == {"failure", "retry", "unsent"}


async def test_the_gateways_quarantined_task_create_is_kept_for_an_operator(service_db):
    db = await service_db("gateway")
    await quarantine_outbox(
        db,
        gateway_store.outbox,
        {"create": "task.create", "cancel": "task.cancel", "erase": "task.erase"},
        T0,
    )
    purging = retention(db, ManualClock(T0 + timedelta(days=3650)), [
        outbox_records(gateway_store.outbox)
    ])  # fmt: skip
    assert (await purging.records_report())[0].counts == RecordCounts(due=0, held=3)
    assert (await purging.purge_once()).rows == {"outbox": 0}
    assert await rows(db, "SELECT msg_id FROM outbox") == {"create", "cancel", "erase"}


async def test_quarantined_messages_of_aging_streams_go_those_of_work_wait_for_an_operator(
    service_db,
):
    db = await service_db("reconciler")
    clock = ManualClock(T0)
    quarantine = QuarantineStore(db, clock)
    for seq, (stream, subject) in enumerate(
        [
            ("TASK_STATUS", "task.status.t1.succeeded"),
            ("CALLBACKS", "callbacks.shop.done"),
            ("TASKS", "task.fail"),
            ("TASKS", "task.demote"),
        ],
        start=1,
    ):
        await quarantine.hold(Poisoned("reconciler", stream, subject, seq, b"m", "boom", 5, 0, T0))
    clock.set(T0 + timedelta(days=10))
    await quarantine.hold(  # seen again ten days on: its last sight counts
        Poisoned("reconciler", "TASK_STATUS", "task.status.t1.succeeded", 1, b"m", "boom", 6, 0, T0)
    )
    purging = retention(db, clock, [quarantine_records()])
    clock.set(T0 + timedelta(days=91))
    assert (await purging.records_report())[0].counts == RecordCounts(due=1, held=2)
    assert (await purging.purge_once()).rows == {"quarantine": 1}
    assert await rows(db, "SELECT stream, subject FROM quarantine") == {
        ("TASK_STATUS", "task.status.t1.succeeded"),
        ("TASKS", "task.fail"),
        ("TASKS", "task.demote"),
    }
    clock.set(T0 + timedelta(days=101))
    assert (await purging.purge_once()).rows == {"quarantine": 1}
    clock.set(T0 + timedelta(days=3650))
    assert (await purging.purge_once()).rows == {"quarantine": 0}
    assert await rows(db, "SELECT subject FROM quarantine") == {"task.fail", "task.demote"}


def test_only_the_subjects_of_streams_that_age_their_messages_out_may_be_purged():
    aging = re.compile(aging_subjects_pattern())
    assert AGING_STREAMS == ("TASK_STATUS", "CALLBACKS")
    assert aging.match("task.status.t1.succeeded") and aging.match("callbacks.shop.x.done")
    for work in [*tasks.TASKS.subjects, "evaluation.started", "task.statusx", "callbacks"]:
        assert not aging.match(work), work
