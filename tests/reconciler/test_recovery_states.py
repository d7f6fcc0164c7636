"""The state machines declared in dispo.reconciler.states agree with the database."""

import pytest
from dispo.libs.db.checks import enum_check_drift
from dispo.reconciler.states import (
    CHECKED_COLUMNS,
    RECOVERY_ENDED,
    RECOVERY_FINAL,
    RECOVERY_TRANSITIONS,
    RecoveryState,
)


async def test_check_constraints_match_enums(service_engine):
    engine = await service_engine("reconciler")
    async with engine.connect() as conn:
        assert await enum_check_drift(conn, "reconciler", CHECKED_COLUMNS) == {}


def test_every_state_has_a_transition_row_and_final_states_are_terminal():
    assert set(RECOVERY_TRANSITIONS) == set(RecoveryState)
    assert RECOVERY_FINAL == {RecoveryState.RESOLVED, RecoveryState.ABANDONED}
    # FAILED has ended: only an operator's resume (→ REDRIVEN) or decision (→ FAILED) moves it.
    assert RECOVERY_ENDED == RECOVERY_FINAL | {RecoveryState.FAILED}
    assert RECOVERY_TRANSITIONS[RecoveryState.FAILED] == {
        RecoveryState.REDRIVEN,
        RecoveryState.FAILED,
    }
    for state, targets in RECOVERY_TRANSITIONS.items():  # every other state can still end
        assert state in RECOVERY_ENDED or targets & RECOVERY_ENDED, state


async def test_a_move_outside_the_table_is_refused_before_any_sql():
    import pytest
    from dispo.libs.states import IllegalTransition
    from dispo.reconciler.recovery import store

    with pytest.raises(IllegalTransition, match="from resolved to redriven"):
        await store.task_set_state_if(
            None, "t", RecoveryState.RESOLVED, RecoveryState.REDRIVEN, None
        )
    with pytest.raises(IllegalTransition, match="from failed to parked_failed"):
        await store.task_set_state_if(
            None, "t", RecoveryState.FAILED, RecoveryState.PARKED_FAILED, None
        )


async def test_a_state_change_sets_only_its_declared_columns_refused_before_any_sql():
    import pytest
    from dispo.reconciler.recovery import store

    with pytest.raises(ValueError, match=r"not a column a state change sets: \['state'\]"):
        await store.task_set_state_if(
            None,
            "t",
            RecoveryState.PARKED_FAILED,
            RecoveryState.PARKED_FAILED,
            None,
            state="resolved",
        )


async def test_a_final_recovery_entry_refuses_every_move_and_stays_as_it_was(recon):
    import pytest
    from dispo.libs.states import IllegalTransition
    from dispo.reconciler.recovery import redrive, store

    from .conftest import envelope, node, row

    await redrive.intake(recon, envelope("gone", [node("a.x", "FAILED", task_id="gone")]), "fail")
    now = recon.clock.now()
    async with recon.db.transaction() as conn:
        assert await store.task_set_state_if(
            conn, "gone", RecoveryState.PARKED_FAILED, RecoveryState.ABANDONED, now
        )
    before = await row(recon, "gone")
    async with recon.db.transaction() as conn:
        with pytest.raises(IllegalTransition, match="from abandoned to redriven"):
            await store.task_redriven_if(
                conn,
                "gone",
                RecoveryState.ABANDONED,
                before.generation,
                before.envelope,
                now,
                release=False,
            )
        with pytest.raises(IllegalTransition, match="from abandoned to parked_failed"):
            await store.task_set_state_if(
                conn, "gone", (RecoveryState.ABANDONED,), RecoveryState.PARKED_FAILED, now
            )
    assert await row(recon, "gone") == before


@pytest.mark.blank_database  # migrates the reconciler schema from nothing, step by step
async def test_the_casing_migration_rewrites_stored_states_checks_and_indexes(database_url):
    from datetime import UTC, datetime
    from pathlib import Path

    from dispo.libs.db import create_engine, migrate
    from dispo.libs.db.driver import Database
    from dispo.reconciler.recovery import store
    from sqlalchemy import text

    migrations = Path(__file__).resolve().parents[2] / "services" / "reconciler" / "migrations"
    now = datetime(2026, 1, 1, tzinfo=UTC)
    engine = create_engine(database_url, "reconciler")
    try:
        await migrate(engine, "reconciler", migrations, "rec_0002")
        async with engine.begin() as conn:  # rows as the upper-case releases wrote them
            await conn.execute(
                text(
                    "INSERT INTO recovery_tasks (task_id, business, state, kind, envelope, generation,"
                    " task_created_at, first_parked_at, parked_at, next_redrive_at, updated_at)"
                    " VALUES ('old', 'b', 'PARKED_FAILED', 'fail', '', 2, :now, :now, :now, :now, :now)"
                ),
                {"now": now},
            )
            await conn.execute(
                text(
                    "INSERT INTO completions (task_id, business, status, version, envelope, finished_at,"
                    " recorded_at, notify_state, notify_next_at, reconcile_state)"
                    " VALUES ('old', 'b', 'SUCCEEDED', 1, '', :now, :now, 'PENDING', :now, 'MATCHED')"
                ),
                {"now": now},
            )

        await migrate(engine, "reconciler", migrations)

        async with engine.connect() as conn:
            assert await enum_check_drift(conn, "reconciler", CHECKED_COLUMNS) == {}
            completion = (
                await conn.execute(text("SELECT * FROM completions WHERE task_id = 'old'"))
            ).one()
            indexes = dict(
                (
                    await conn.execute(
                        text(
                            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'reconciler'"
                        )
                    )
                ).all()
            )
        db = await Database.open(database_url, "reconciler", size=1)
        try:
            async with db.connection() as conn:
                due = await store.tasks_due(conn, RecoveryState.PARKED_FAILED, now, 10)
        finally:
            await db.close()
        assert (completion.status, completion.notify_state, completion.reconcile_state) == (
            "succeeded",
            "pending",
            "matched",
        )
        assert "'parked_failed'" in indexes["recovery_tasks_due"]
        assert "'pending'" in indexes["completions_notify_due"]
        assert [r.task_id for r in due] == ["old"]
    finally:
        await engine.dispose()
