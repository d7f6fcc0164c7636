"""The pool's data migrations, applied to rows written under the revision before them."""

from __future__ import annotations

from pathlib import Path

from dispo.libs.db import create_engine, migrate
from sqlalchemy import text

MIGRATIONS = Path(__file__).parents[2] / "services" / "pool" / "migrations"
SCHEMA = "pool_data_migration"


async def test_assignments_that_ended_stalled_end_stuck(database_url):
    engine = create_engine(database_url, SCHEMA)
    try:
        await migrate(engine, SCHEMA, MIGRATIONS, revision="pool_0002")
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO assignments (cron_id, evaluation_id, started_at, ended_at, end_reason)"
                    " VALUES ('c1', 'e1', now(), now(), 'stalled'), ('c2', 'e2', now(), now(), 'done'),"
                    " ('c3', 'e3', now(), NULL, NULL)"
                )
            )
        await migrate(engine, SCHEMA, MIGRATIONS)
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    text("SELECT cron_id, end_reason FROM assignments ORDER BY cron_id")
                )
            ).all()
        assert [tuple(r) for r in rows] == [("c1", "stuck"), ("c2", "done"), ("c3", None)]
    finally:
        async with engine.begin() as conn:
            await conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        await engine.dispose()
