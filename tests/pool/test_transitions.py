"""Every status write of an evaluation or a cron is checked against its declared table
first: an undeclared move is refused with nothing written, and of racing moves one wins."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from dispo.libs.states import IllegalTransition
from dispo.pool import store
from dispo.pool.domain import CronStatus, EvaluationStatus

from .conftest import evaluation

NOW = datetime(2026, 1, 1, tzinfo=UTC)
E = EvaluationStatus


async def test_an_undeclared_evaluation_or_cron_move_is_refused_and_changes_nothing(pool_db):
    async with pool_db.transaction() as conn:
        await store.evaluation_insert(conn, evaluation("ev"), NOW)
        assert await store.evaluation_set_status_if(conn, "ev", (E.QUEUED,), E.CANCELLED, NOW)
        await store.cron_insert(conn, "c1", NOW)
    async with pool_db.transaction() as conn:
        cancelled = await store.evaluation_get(conn, "ev")
        with pytest.raises(
            IllegalTransition, match="evaluation state cannot move from cancelled to queued"
        ):
            await store.evaluation_set_status_if(conn, "ev", (E.CANCELLED,), E.QUEUED, NOW)
        with pytest.raises(IllegalTransition, match="from queued to stuck"):
            await store.evaluation_set_status_if(conn, "ev", (E.QUEUED,), E.STUCK, NOW)
        cron = await store.cron_get(conn, "c1")
        assert await store.cron_mark_stuck_if_silent(conn, cron, NOW)
        stuck = await store.cron_get(conn, "c1")
        with pytest.raises(IllegalTransition, match="cron state cannot move from stuck to stuck"):
            await store.cron_mark_stuck_if_silent(conn, stuck, NOW)
    async with pool_db.connection() as conn:
        assert await store.evaluation_get(conn, "ev") == cancelled
        assert (await store.cron_get(conn, "c1")).status is CronStatus.STUCK


async def test_racing_operator_moves_on_one_evaluation_exactly_one_is_recorded(pool_db):
    async with pool_db.transaction() as conn:
        await store.evaluation_insert(conn, evaluation("ev"), NOW)

    async def move(new):
        async with pool_db.transaction() as conn:
            return await store.evaluation_set_status_if(conn, "ev", (E.QUEUED,), new, NOW)

    targets = [E.PAUSED, E.CANCELLED] * 5
    results = await asyncio.gather(*(move(new) for new in targets))

    assert sorted(results) == [False] * 9 + [True]
    async with pool_db.connection() as conn:
        assert (await store.evaluation_get(conn, "ev")).status is targets[results.index(True)]
