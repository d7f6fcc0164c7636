"""The state machines declared in dispo.reconciler.states agree with the database."""

from dispo.libs.db.checks import enum_check_drift
from dispo.reconciler.states import (
    CHECKED_COLUMNS,
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
    assert RECOVERY_FINAL == {RecoveryState.RESOLVED, RecoveryState.FAILED, RecoveryState.ABANDONED}
    for state, targets in RECOVERY_TRANSITIONS.items():  # every other state can still end
        assert state in RECOVERY_FINAL or targets & RECOVERY_FINAL, state


async def test_a_move_outside_the_table_is_refused_before_any_sql():
    import pytest
    from dispo.libs.states import IllegalTransition
    from dispo.reconciler import store

    with pytest.raises(IllegalTransition, match="from FAILED to REDRIVEN"):
        await store.task_set_state_if(None, "t", RecoveryState.FAILED, RecoveryState.REDRIVEN, None)


async def test_a_final_recovery_entry_refuses_every_move_and_stays_as_it_was(recon):
    import pytest
    from dispo.libs.states import IllegalTransition
    from dispo.reconciler import recovery, store

    from .conftest import envelope, node, row

    await recovery.intake(recon, envelope("gone", [node("a.x", "FAILED", task_id="gone")]), "fail")
    now = recon.clock.now()
    async with recon.engine.begin() as conn:
        assert await store.task_set_state_if(
            conn, "gone", RecoveryState.PARKED_FAILED, RecoveryState.ABANDONED, now
        )
    before = await row(recon, "gone")
    async with recon.engine.begin() as conn:
        with pytest.raises(IllegalTransition, match="from ABANDONED to REDRIVEN"):
            await store.task_redriven_if(
                conn,
                "gone",
                RecoveryState.ABANDONED,
                before.generation,
                before.envelope,
                now,
                release=False,
            )
        with pytest.raises(IllegalTransition, match="from ABANDONED to PARKED_FAILED"):
            await store.task_set_state_if(
                conn, "gone", (RecoveryState.ABANDONED,), RecoveryState.PARKED_FAILED, now
            )
    assert await row(recon, "gone") == before
