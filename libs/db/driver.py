"""Hot statements straight on asyncpg, inside the connection and transaction SQLAlchemy holds.

A statement through SQLAlchemy's ``AsyncConnection.execute`` costs several times the
driver's own work on the client: the compiled-cache lookup, the execution context, the
result object, a greenlet switch (measured on a two-core machine: 80-150 µs against 13-50 µs
for the same one-row statement, and about 300 µs more for a transaction). That is most of a
service's database CPU when every flush carries one task. The statements a flush runs for
every batch of messages or requests are :class:`Statement` objects instead:

    CLAIM = Statement("UPDATE node_runs SET ... WHERE task_id = ANY(CAST(:ids AS text[]))"
                      " RETURNING task_id")
    rows = await CLAIM.fetch(conn, {"ids": ids})      # conn: a SQLAlchemy AsyncConnection

- written with ``:name`` parameters, as for ``text()``, turned into asyncpg's ``$n`` once;
- run on the asyncpg connection ``conn`` holds, in the transaction ``conn`` is in (begun
  here if it has not run a statement yet), so it commits or rolls back, and takes
  savepoints, with the statements SQLAlchemy runs on ``conn``; outside a transaction (an
  ``AUTOCOMMIT`` connection, or one that has not begun) it commits alone;
- rows come back as :class:`Row`: by position, by name (``row["task_id"]``) or as an
  attribute (``row.task_id``), as SQLAlchemy's rows;
- a failure that closed the connection (PostgreSQL gone) invalidates it in SQLAlchemy's
  pool, as SQLAlchemy does after its own statements, so the next checkout connects afresh;
  the failure is then a :class:`~dispo.libs.db.down.ConnectionLost`, which
  :func:`dispo.libs.db.database_unreachable` knows;
- the engine's ``before_cursor_execute`` and ``after_cursor_execute`` listeners hear of it,
  as of SQLAlchemy's own statements.

Everything else (the engine, the pool, migrations, the statements that are not per flush)
stays SQLAlchemy's.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any

import asyncpg
from dispo.libs.db.down import ConnectionLost, interrupted
from sqlalchemy.ext.asyncio import AsyncConnection

# A ``:name`` parameter; not the second colon of a ``::type`` cast, nor a name inside one.
_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


class Row(asyncpg.Record):  # type: ignore[misc]  # asyncpg ships no type hints
    """A row read by a :class:`Statement`: an asyncpg record whose columns are also
    attributes."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


async def _begun(conn: AsyncConnection) -> tuple[Any, asyncpg.Connection]:
    """The asyncpg connection under ``conn``, in ``conn``'s transaction: a SQLAlchemy
    transaction that has not run a statement yet has not sent its ``BEGIN``, so it is begun
    here. A failure that closed the connection invalidates it in the pool."""
    fairy = await conn.get_raw_connection()
    db: asyncpg.Connection = fairy.driver_connection
    adapted: Any = fairy.dbapi_connection
    try:
        if conn.in_transaction() and adapted._transaction is None:
            await adapted._start_transaction()  # a no-op on an AUTOCOMMIT connection
    except BaseException as error:
        await _invalidate_if_closed(conn, fairy, db, error)
        raise
    return fairy, db


def _announce(conn: AsyncConnection, event: str, sql: str, args: list[Any]) -> None:
    """SQLAlchemy's ``before_cursor_execute`` / ``after_cursor_execute`` listeners of the
    engine, if it has any, hear of a driver statement too (with no cursor and no execution
    context): whoever watches an engine's statements sees them all."""
    sync = conn.sync_connection
    listeners = getattr(sync.dispatch, event) if sync is not None else None
    if listeners:
        listeners(sync, None, sql, args, None, False)


async def _invalidate_if_closed(
    conn: AsyncConnection, fairy: Any, db: asyncpg.Connection, error: BaseException
) -> None:
    """PostgreSQL gone (the connection closed): as SQLAlchemy does on a disconnect, the
    connection leaves the pool and every connection the pool made before now is made
    afresh at its next checkout (they went with the server); the failure is a
    :class:`ConnectionLost`, which says so whatever the driver raised."""
    if not db.is_closed():
        return
    conn.sync_engine.pool._invalidate(fairy, error, _checkin=False)
    await conn.invalidate()
    if isinstance(error, ConnectionLost):
        return
    if isinstance(error, asyncio.CancelledError) and not interrupted():
        return  # a cancellation of the caller: it goes on as one
    raise ConnectionLost(f"the connection to PostgreSQL closed: {error!r}") from error


class Statement:
    """One SQL statement with ``:name`` parameters, run on asyncpg (see the module)."""

    def __init__(self, sql: str) -> None:
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"

        self.text = sql
        self.sql = _PARAM.sub(number, sql)
        self.names = tuple(names)

    def arguments(self, params: Mapping[str, Any]) -> list[Any]:
        missing = [n for n in self.names if n not in params]
        if missing:
            raise KeyError(f"statement parameters missing: {missing}")
        return [params[n] for n in self.names]

    async def fetch(
        self, conn: AsyncConnection, params: Mapping[str, Any] | None = None
    ) -> list[Row]:
        """Run it and return its rows (none for a statement without ``RETURNING``)."""
        args = self.arguments(params or {})
        fairy, db = await _begun(conn)
        _announce(conn, "before_cursor_execute", self.sql, args)
        try:
            rows: list[Row] = await db.fetch(self.sql, *args, record_class=Row)
        except BaseException as error:
            await _invalidate_if_closed(conn, fairy, db, error)
            raise
        _announce(conn, "after_cursor_execute", self.sql, args)
        return rows

    async def scalars(
        self, conn: AsyncConnection, params: Mapping[str, Any] | None = None
    ) -> list[Any]:
        """Run it and return each row's first column."""
        return [row[0] for row in await self.fetch(conn, params)]

    def __repr__(self) -> str:
        return f"Statement({self.text!r})"


_STATEMENTS: dict[str, Statement] = {}


async def fetch(
    conn: AsyncConnection, sql: str, params: Mapping[str, Any] | None = None
) -> list[Row]:
    """``Statement(sql).fetch(conn, params)``, the statement made once per text (a
    repository's statements are a fixed set: one per text, or per shape of a built one)."""
    statement = _STATEMENTS.get(sql)
    if statement is None:
        statement = _STATEMENTS.setdefault(sql, Statement(sql))
    return await statement.fetch(conn, params)
