"""The services' sessions plan without sequential scans (ADR-0063): a statement joining a
batch to a table by its key, planned once while the table is empty (asyncpg prepares it,
PostgreSQL keeps a generic plan), still reads the table by its index once it has grown."""

from __future__ import annotations

import pytest
from dispo.libs.db import create_engine
from sqlalchemy import text

SCHEMA = "plans_test"

# The shape of the hot statements: a batch as an array, joined to a table by its key.
BATCH_JOIN = text(
    "SELECT r.v FROM unnest(CAST(:ids AS text[])) AS u(id) JOIN runs r ON r.id = u.id"
)


@pytest.fixture
async def engine(database_url):
    engine = create_engine(database_url, SCHEMA, pool_size=1)
    async with engine.begin() as conn:
        await conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
        await conn.execute(text("CREATE TABLE runs (id text PRIMARY KEY, v int NOT NULL)"))
    yield engine
    await engine.dispose()


async def scans_of_runs(conn) -> tuple[int, int]:
    """(sequential, index) scans of ``runs`` so far in this transaction."""
    row = (
        await conn.execute(
            text(
                "SELECT seq_scan, coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables"
                f" WHERE schemaname = '{SCHEMA}' AND relname = 'runs'"
            )
        )
    ).one()
    return row[0], row[1]


async def test_a_batch_join_planned_on_an_empty_table_reads_the_grown_table_by_its_key(engine):
    async with engine.connect() as conn:  # one connection: one prepared statement
        batch = [f"k{n}" for n in range(100)]  # batches as a busy service flushes them
        for _ in range(8):  # past the custom plans: PostgreSQL keeps a generic one
            assert (await conn.execute(BATCH_JOIN, {"ids": batch})).all() == []
        await conn.commit()
        await conn.execute(
            text("INSERT INTO runs SELECT 'k' || n, n FROM generate_series(1, 20000) AS n")
        )
        await conn.commit()
        before = await scans_of_runs(conn)
        rows = (await conn.execute(BATCH_JOIN, {"ids": ["k7", "k19999", "nope"]})).all()
        after = await scans_of_runs(conn)
        await conn.commit()
    assert sorted(v for (v,) in rows) == [7, 19999]
    assert after[0] == before[0]  # no sequential scan of the 20,000 rows
    assert after[1] > before[1]  # read by its primary key
