"""The driver port's :class:`~dispo.libs.db.driver.Conn` on a SQLAlchemy connection, for a
store not yet on the port that calls a kernel function taking a Conn (the outbox's): the
statement runs on the same PostgreSQL connection, in the caller's transaction. It goes once
every store is on the port (ADR-0088, ADR-0097)."""

from __future__ import annotations

from typing import Any

from dispo.libs.db.driver import Conn, Database
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection


class _Borrowed(Database):
    """No pool of its own: the connection is SQLAlchemy's, which makes it afresh if it
    broke."""

    def __init__(self) -> None:
        super().__init__(pool=None)

    async def _lost(self, raw: Any, error: BaseException) -> None:
        return None


_BORROWED = _Borrowed()


async def port_conn(conn: AsyncConnection) -> Conn:
    """``conn`` as a :class:`Conn`, in its transaction (begun now if SQLAlchemy has not sent
    its first statement yet: it begins the driver's transaction with it)."""
    raw = (await conn.get_raw_connection()).driver_connection
    assert raw is not None, "a connection SQLAlchemy has checked out"
    if not raw.is_in_transaction():
        await conn.execute(text("SELECT 1"))
    return Conn(_BORROWED, raw)
