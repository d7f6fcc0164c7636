"""The driver port (:mod:`dispo.libs.db.driver`) against real PostgreSQL: statements commit,
roll back and take savepoints with their transaction, each commits alone outside one, and a
server that went away is reported unreachable and leaves no dead connection in the pool."""

from __future__ import annotations

import asyncio

import pytest
from dispo.libs.db import create_engine, database_unreachable
from dispo.libs.db.bridge import port_conn
from dispo.libs.db.driver import Database, Statement, asyncpg_dsn
from sqlalchemy import text

SCHEMA = "driver_test"
INSERT = Statement("INSERT INTO items (name, size) VALUES (:name, :size) RETURNING id, name")
NAMES = Statement("SELECT name FROM items ORDER BY id")


@pytest.fixture
async def db(database_url):
    engine = create_engine(database_url, SCHEMA)
    async with engine.begin() as conn:
        await conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
        await conn.execute(text("CREATE TABLE items (id serial PRIMARY KEY, name text, size int)"))
    await engine.dispose()
    db = await Database.open(database_url, SCHEMA, size=4)
    yield db
    await db.close()


async def names(db: Database) -> list[str]:
    async with db.connection() as conn:
        return await NAMES.scalars(conn)


def test_named_parameters_become_numbered_ones_once_each():
    s = Statement("SELECT CAST(:ids AS text[]), :n::int, 'a:b', :n + :m FROM t WHERE x = ANY(:ids)")
    assert s.sql == "SELECT CAST($1 AS text[]), $2::int, 'a:b', $2 + $3 FROM t WHERE x = ANY($1)"
    assert s.names == ("ids", "n", "m")
    assert s.arguments({"ids": [1], "n": 2, "m": 3, "other": 4}) == [[1], 2, 3]
    with pytest.raises(KeyError, match="'m'"):
        s.arguments({"ids": [1], "n": 2})


def test_a_sqlalchemy_url_is_taken_as_asyncpg_takes_it():
    assert asyncpg_dsn("postgresql+asyncpg://u:p%40w@h:5/d") == "postgresql://u:p%40w@h:5/d"
    assert asyncpg_dsn("postgres://u@/d?host=/run/pg") == "postgresql://u@/d?host=%2Frun%2Fpg"


async def test_rows_read_by_position_name_and_attribute(db):
    async with db.transaction() as conn:
        [row] = await INSERT.fetch(conn, {"name": "a", "size": 1})
    assert (row[1], row["name"], row.name) == ("a", "a", "a")
    assert tuple(row) == (row.id, "a")
    with pytest.raises(AttributeError):
        _ = row.size


async def test_a_transaction_commits_its_statements_together_or_none(db):
    with pytest.raises(RuntimeError):
        async with db.transaction() as conn:
            await INSERT.fetch(conn, {"name": "first", "size": 1})
            await conn.fetch("INSERT INTO items (name) VALUES ('second')")  # a text, made once
            assert await NAMES.scalars(conn) == ["first", "second"]
            assert await names(db) == []  # not seen from another connection before commit
            raise RuntimeError("roll back")
    assert await names(db) == []
    async with db.transaction() as conn:
        await conn.fetch("INSERT INTO items (name) VALUES ('third')")
        await INSERT.fetch(conn, {"name": "fourth", "size": 1})
    assert await names(db) == ["third", "fourth"]


async def test_a_savepoint_takes_back_the_statements_made_in_it(db):
    async with db.transaction() as conn:
        await INSERT.fetch(conn, {"name": "kept", "size": 1})
        with pytest.raises(RuntimeError):
            async with conn.savepoint():
                await INSERT.fetch(conn, {"name": "taken back", "size": 1})
                raise RuntimeError("roll back to the savepoint")
        await INSERT.fetch(conn, {"name": "after", "size": 1})
    assert await names(db) == ["kept", "after"]


async def test_outside_a_transaction_each_statement_commits_alone(db):
    async with db.connection() as conn:
        await INSERT.fetch(conn, {"name": "alone", "size": 1})
        assert await names(db) == ["alone"]  # seen from another connection at once


async def test_a_failed_statement_rolls_back_its_transaction(db):
    with pytest.raises(Exception, match="division by zero"):
        async with db.transaction() as conn:
            await INSERT.fetch(conn, {"name": "first", "size": 1})
            await Statement("SELECT 1 / CAST(:zero AS int)").fetch(conn, {"zero": 0})
    assert await names(db) == []
    async with db.transaction() as conn:  # the connection went back to the pool usable
        await INSERT.fetch(conn, {"name": "next", "size": 1})
    assert await names(db) == ["next"]


async def test_a_session_sees_its_schema_first_and_plans_without_sequential_scans(db):
    async with db.connection() as conn:
        [row] = await conn.fetch("SELECT current_setting('search_path') AS path,"
                                 " current_setting('enable_seqscan') AS seqscan")  # fmt: skip
    assert (row.path, row.seqscan) == (SCHEMA, "off")


@pytest.mark.parametrize("noticed", [False, True], ids=["unnoticed", "noticed"])
async def test_postgres_gone_is_unreachable_and_leaves_no_dead_connection(db, infra, noticed):
    async with db.transaction() as conn, db.connection() as other:
        await INSERT.fetch(conn, {"name": "before", "size": 1})
        await NAMES.fetch(other)  # the pool holds two connections
    infra.postgres.stop("immediate")
    if noticed:  # the driver has read the server's goodbye: the pooled connection is closed
        await asyncio.sleep(0.5)
    try:
        with pytest.raises(Exception) as raised:
            async with db.transaction() as conn:
                await INSERT.fetch(conn, {"name": "lost", "size": 1})
        assert database_unreachable(raised.value), repr(raised.value)
    finally:
        infra.postgres.start()
    # Every connection of the pool went with the server: each checkout connects afresh.
    async with db.transaction() as conn, db.connection() as other:
        await INSERT.fetch(conn, {"name": "after", "size": 1})
        assert await NAMES.scalars(other) == ["before"]
    assert await names(db) == ["before", "after"]


async def test_watchers_hear_of_every_statement_with_its_arguments(db):
    heard: list[tuple[str, list]] = []
    db.watch(lambda sql, args: heard.append((sql, args)))
    async with db.transaction() as conn:
        await INSERT.fetch(conn, {"name": "a", "size": 2})
    assert heard == [(INSERT.sql, ["a", 2])]


async def test_a_sqlalchemy_connection_lends_its_transaction_to_the_port(db, database_url):
    """``port_conn``: a statement on the port, on a SQLAlchemy connection that has sent
    nothing yet, is in that connection's transaction: taken back with it, committed with it."""
    engine = create_engine(database_url, SCHEMA)
    try:
        with pytest.raises(RuntimeError, match="taken back"):
            async with engine.begin() as conn:
                await INSERT.fetch(await port_conn(conn), {"name": "lost", "size": 1})
                raise RuntimeError("taken back")
        async with engine.begin() as conn:
            await INSERT.fetch(await port_conn(conn), {"name": "kept", "size": 1})
            await conn.execute(text("INSERT INTO items (name) VALUES ('after')"))
    finally:
        await engine.dispose()
    assert await names(db) == ["kept", "after"]
