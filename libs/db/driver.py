"""The driver port: the statements of a service's store run on asyncpg, through a small
interface of our own (pgqueuer's ``ports/driver.py`` is the model).

A statement through SQLAlchemy's ``AsyncConnection.execute`` costs several times the
driver's own work on the client: the compiled-cache lookup, the execution context, the
result object, a greenlet switch (measured on a two-core machine: 80-150 µs against 13-50 µs
for the same one-row statement, and about 300 µs more for a transaction). That is most of a
service's database CPU when every flush carries one task. A store's statements are
:class:`Statement` objects instead, run on a :class:`Conn` that a :class:`Database` hands
out:

    CLAIM = Statement("UPDATE node_runs SET ... WHERE task_id = ANY(CAST(:ids AS text[]))"
                      " RETURNING task_id")
    async with db.transaction() as conn:
        rows = await CLAIM.fetch(conn, {"ids": ids})

- written with ``:name`` parameters, as for SQLAlchemy's ``text()``, turned into asyncpg's
  ``$n`` once (and prepared once per connection by asyncpg's statement cache);
- in a transaction (:meth:`Database.transaction`, a savepoint inside it with
  :meth:`Conn.savepoint`) or each statement on its own (:meth:`Database.connection`);
- rows come back as :class:`Row`: by position, by name (``row["task_id"]``) or as an
  attribute (``row.task_id``);
- a failure that closed the connection (PostgreSQL gone) expires every connection of the
  pool, so the next checkout connects afresh; the failure is then a
  :class:`~dispo.libs.db.down.ConnectionLost`, which
  :func:`dispo.libs.db.database_unreachable` knows.

SQLAlchemy stays for what is not a store's statement: migrations (Alembic) and the reads of
the operator surfaces (the outbox relay, the quarantine and the token checks run here,
ADR-0097).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from dispo.libs.db.down import ConnectionLost, database_unreachable, interrupted
from sqlalchemy.engine import make_url

# A ``:name`` parameter; not the second colon of a ``::type`` cast, nor a name inside one.
_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")

# Called with each statement's SQL and arguments before it runs (see Database.watch).
Watcher = Callable[[str, list[Any]], None]


class Row(asyncpg.Record):  # type: ignore[misc]  # asyncpg ships no type hints
    """A row read by a :class:`Statement`: an asyncpg record whose columns are also
    attributes."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def asyncpg_dsn(url: str) -> str:
    """``url`` (``postgresql://`` or SQLAlchemy's ``postgresql+asyncpg://``) as asyncpg
    takes it."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _keep_session(raw: asyncpg.Connection) -> None:
    """A connection goes back to the pool as it is: a store sets no session state (no
    ``LISTEN``, no ``SET``, no cursor), so asyncpg's reset query would be a round trip per
    checkout for nothing (an open transaction is still rolled back by the pool)."""


class Database:
    """A pool of asyncpg connections to one service's schema: the port its store runs on.

    At most ``size`` connections, opened on demand and kept (a new PostgreSQL backend per
    burst would cost more than the queries); no ping at checkout (a round trip per
    transaction): a connection PostgreSQL dropped fails its first statement, which expires
    the whole pool. Sessions see ``schema`` first and plan without sequential scans, as the
    service's SQLAlchemy engine (:func:`dispo.libs.db.create_engine`, ADR-0063)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self._watchers: dict[bool, list[Watcher]] = {False: [], True: []}

    @classmethod
    async def open(cls, url: str, schema: str, *, size: int = 20) -> Database:
        pool = await asyncpg.create_pool(
            asyncpg_dsn(url),
            min_size=0,
            max_size=size,
            server_settings={
                "search_path": schema,
                "application_name": f"dispo-{schema}",
                "enable_seqscan": "off",
            },
            reset=_keep_session,
        )
        return cls(pool)

    async def close(self) -> None:
        await self.pool.close()

    def watch(self, watcher: Watcher, *, after: bool = False) -> None:
        """Call ``watcher`` with every statement's SQL and arguments before it runs (or,
        ``after``, once it ran)."""
        self._watchers[after].append(watcher)

    def unwatch(self, watcher: Watcher, *, after: bool = False) -> None:
        self._watchers[after].remove(watcher)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Conn]:
        """A connection on which each statement commits alone (no ``BEGIN``/``COMMIT``
        round trips around a flush's one statement)."""
        raw = await self._acquire()
        try:
            yield Conn(self, raw)
        finally:
            await self.pool.release(raw)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Conn]:
        """A connection in a transaction, committed when the block ends, rolled back when
        it raises."""
        raw = await self._acquire()
        try:
            conn = Conn(self, raw)
            transaction = raw.transaction()
            await conn.run(transaction.start())
            try:
                yield conn
            except BaseException:
                if not _closed(raw):
                    await conn.run(transaction.rollback())
                raise
            await conn.run(transaction.commit())
        finally:
            await self.pool.release(raw)

    async def _acquire(self) -> asyncpg.Connection:
        try:
            return await self.pool.acquire()
        except (OSError, asyncpg.PostgresConnectionError) as error:
            raise ConnectionLost(f"no connection to PostgreSQL: {error!r}") from error

    async def _lost(self, raw: asyncpg.Connection, error: BaseException) -> None:
        """PostgreSQL gone (the connection closed, or the failure says the server is out of
        reach): every connection the pool made before now is made afresh at its next
        checkout (they went with the server); a closed connection's failure is a
        :class:`ConnectionLost`, which says so whatever the driver raised."""
        if not _closed(raw):
            if database_unreachable(error):
                await self.pool.expire_connections()
            return
        await self.pool.expire_connections()
        if isinstance(error, ConnectionLost):
            return
        if isinstance(error, asyncio.CancelledError) and not interrupted():
            return  # a cancellation of the caller: it goes on as one
        raise ConnectionLost(f"the connection to PostgreSQL closed: {error!r}") from error


def _closed(raw: asyncpg.Connection) -> bool:
    """Whether the connection closed (one the pool took back as it closed counts)."""
    try:
        return bool(raw.is_closed())
    except asyncpg.InterfaceError:  # released back to the pool as it closed
        return True


class Conn:
    """One connection of a :class:`Database`, in a transaction or not."""

    def __init__(self, db: Database, raw: asyncpg.Connection) -> None:
        self.db = db
        self.raw = raw

    async def run(self, work: Any) -> Any:
        """Await ``work`` (a driver call on this connection), a closed connection reported
        as :class:`ConnectionLost`."""
        try:
            return await work
        except BaseException as error:
            await self.db._lost(self.raw, error)
            raise

    async def fetch(
        self, statement: Statement | str, params: Mapping[str, Any] | None = None
    ) -> list[Row]:
        """Run ``statement`` (a text is made a :class:`Statement` once) and return its rows
        (none for a statement without ``RETURNING``)."""
        if isinstance(statement, str):
            statement = _statement(statement)
        args = statement.arguments(params or {})
        for watcher in self.db._watchers[False]:
            watcher(statement.sql, args)
        rows: list[Row] = await self.run(self.raw.fetch(statement.sql, *args, record_class=Row))
        for watcher in self.db._watchers[True]:
            watcher(statement.sql, args)
        return rows

    async def scalars(
        self, statement: Statement | str, params: Mapping[str, Any] | None = None
    ) -> list[Any]:
        """Run it and return each row's first column."""
        return [row[0] for row in await self.fetch(statement, params)]

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        """A savepoint: what the block wrote is taken back if it raises, and the
        transaction goes on."""
        savepoint = self.raw.transaction()
        await self.run(savepoint.start())
        try:
            yield
        except BaseException:
            if not _closed(self.raw):
                await self.run(savepoint.rollback())
            raise
        await self.run(savepoint.commit())


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

    async def fetch(self, conn: Conn, params: Mapping[str, Any] | None = None) -> list[Row]:
        """Run it on ``conn`` and return its rows."""
        return await conn.fetch(self, params)

    async def scalars(self, conn: Conn, params: Mapping[str, Any] | None = None) -> list[Any]:
        """Run it and return each row's first column."""
        return await conn.scalars(self, params)

    def __repr__(self) -> str:
        return f"Statement({self.text!r})"


_STATEMENTS: dict[str, Statement] = {}


def _statement(sql: str) -> Statement:
    """The statement of ``sql``, made once per text (a store's statements are a fixed set:
    one per text, or per shape of a built one)."""
    statement = _STATEMENTS.get(sql)
    if statement is None:
        statement = _STATEMENTS.setdefault(sql, Statement(sql))
    return statement
