"""Statements run on asyncpg inside SQLAlchemy's connections and transactions, against real
PostgreSQL: they commit, roll back and take savepoints with SQLAlchemy's own statements, and
a server that went away leaves no dead connection in the pool."""

from __future__ import annotations

import asyncio

import pytest
from dispo.libs.db import create_engine, database_unreachable
from dispo.libs.db.driver import Statement
from sqlalchemy import event, text

SCHEMA = "driver_test"
INSERT = Statement("INSERT INTO items (name, size) VALUES (:name, :size) RETURNING id, name")
NAMES = Statement("SELECT name FROM items ORDER BY id")


@pytest.fixture
async def engine(database_url):
    engine = create_engine(database_url, SCHEMA)
    async with engine.begin() as conn:
        await conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
        await conn.execute(text("CREATE TABLE items (id serial PRIMARY KEY, name text, size int)"))
    yield engine
    await engine.dispose()


async def names(engine) -> list[str]:
    async with engine.connect() as conn:
        return await NAMES.scalars(conn)


def test_named_parameters_become_numbered_ones_once_each():
    s = Statement("SELECT CAST(:ids AS text[]), :n::int, 'a:b', :n + :m FROM t WHERE x = ANY(:ids)")
    assert s.sql == "SELECT CAST($1 AS text[]), $2::int, 'a:b', $2 + $3 FROM t WHERE x = ANY($1)"
    assert s.names == ("ids", "n", "m")
    assert s.arguments({"ids": [1], "n": 2, "m": 3, "other": 4}) == [[1], 2, 3]
    with pytest.raises(KeyError, match="'m'"):
        s.arguments({"ids": [1], "n": 2})


async def test_rows_read_by_position_name_and_attribute(engine):
    async with engine.begin() as conn:
        [row] = await INSERT.fetch(conn, {"name": "a", "size": 1})
    assert (row[1], row["name"], row.name) == ("a", "a", "a")
    assert tuple(row) == (row.id, "a")
    with pytest.raises(AttributeError):
        _ = row.size


async def test_statements_share_sqlalchemys_transaction(engine):
    # Begun by the driver's statement: SQLAlchemy's next one is in the same transaction.
    with pytest.raises(RuntimeError):
        async with engine.begin() as conn:
            await INSERT.fetch(conn, {"name": "first", "size": 1})
            await conn.execute(text("INSERT INTO items (name) VALUES ('second')"))
            assert await NAMES.scalars(conn) == ["first", "second"]
            raise RuntimeError("roll back")
    assert await names(engine) == []
    # Begun by SQLAlchemy's statement, committed with the driver's.
    async with engine.begin() as conn:
        await conn.execute(text("INSERT INTO items (name) VALUES ('third')"))
        await INSERT.fetch(conn, {"name": "fourth", "size": 1})
    assert await names(engine) == ["third", "fourth"]


async def test_a_savepoint_takes_back_the_driver_statements_made_in_it(engine):
    async with engine.begin() as conn:
        await INSERT.fetch(conn, {"name": "kept", "size": 1})
        with pytest.raises(RuntimeError):
            async with conn.begin_nested():
                await INSERT.fetch(conn, {"name": "taken back", "size": 1})
                raise RuntimeError("roll back to the savepoint")
        await INSERT.fetch(conn, {"name": "after", "size": 1})
    assert await names(engine) == ["kept", "after"]


async def test_outside_a_transaction_each_statement_commits_alone(engine):
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await INSERT.fetch(conn, {"name": "alone", "size": 1})
        assert await names(engine) == ["alone"]  # seen from another connection at once


async def test_a_failed_statement_rolls_back_its_transaction(engine):
    with pytest.raises(Exception, match="division by zero"):
        async with engine.begin() as conn:
            await INSERT.fetch(conn, {"name": "first", "size": 1})
            await Statement("SELECT 1 / CAST(:zero AS int)").fetch(conn, {"zero": 0})
    assert await names(engine) == []
    async with engine.begin() as conn:  # the connection went back to the pool usable
        await INSERT.fetch(conn, {"name": "next", "size": 1})
    assert await names(engine) == ["next"]


@pytest.mark.parametrize("noticed", [False, True], ids=["unnoticed", "noticed"])
async def test_postgres_gone_is_unreachable_and_leaves_no_dead_connection(engine, infra, noticed):
    async with engine.begin() as conn, engine.connect() as other:
        await INSERT.fetch(conn, {"name": "before", "size": 1})
        await NAMES.fetch(other)  # the pool holds two connections
    infra.postgres.stop("immediate")
    if noticed:  # the driver has read the server's goodbye: the pooled connection is closed
        await asyncio.sleep(0.5)
    try:
        with pytest.raises(Exception) as raised:
            async with engine.begin() as conn:
                await INSERT.fetch(conn, {"name": "lost", "size": 1})
        assert database_unreachable(raised.value), repr(raised.value)
    finally:
        infra.postgres.start()
    # Every connection of the pool went with the server: each checkout connects afresh.
    async with engine.begin() as conn, engine.connect() as other:
        await INSERT.fetch(conn, {"name": "after", "size": 1})
        assert await NAMES.scalars(other) == ["before"]
    assert await names(engine) == ["before", "after"]


async def test_the_engines_statement_listeners_hear_of_driver_statements(engine):
    heard: list[tuple[str, str, list]] = []
    for when in ("before_cursor_execute", "after_cursor_execute"):
        event.listen(
            engine.sync_engine,
            when,
            lambda conn, cursor, sql, params, *rest, when=when: heard.append((when, sql, params)),
        )
    async with engine.begin() as conn:
        await INSERT.fetch(conn, {"name": "a", "size": 2})
    assert heard == [
        ("before_cursor_execute", INSERT.sql, ["a", 2]),
        ("after_cursor_execute", INSERT.sql, ["a", 2]),
    ]
