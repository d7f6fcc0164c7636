"""The reconciler's outbox: the one table its parts (recovery, arbitration) write the events
they publish to, in the transaction of the change they report; the relay publishes them."""

from __future__ import annotations

from datetime import datetime

from dispo.libs.db.bridge import port_conn
from dispo.libs.outbox import outbox_add, outbox_table
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncConnection

metadata = MetaData()
outbox = outbox_table(metadata, traced=True)


async def emit(
    conn: AsyncConnection,
    subject: str,
    msg_id: str,
    payload: bytes,
    now: datetime,
    trace: str | None = None,
) -> None:
    """An event in the outbox, in the caller's transaction, with the trace context of the
    work it stems from (``trace``, published as its headers)."""
    await outbox_add(await port_conn(conn), outbox, subject, msg_id, payload, now, trace)
