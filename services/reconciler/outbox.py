"""The reconciler's outbox: the one table its parts (recovery, arbitration) write the events
they publish to, in the transaction of the change they report; the relay publishes them."""

from __future__ import annotations

from datetime import datetime

from dispo.libs.db.driver import Conn
from dispo.libs.outbox import OutboxRow, outbox_add_many, outbox_table
from sqlalchemy import MetaData

metadata = MetaData()
outbox = outbox_table(metadata, traced=True)


async def emit(
    conn: Conn,
    subject: str,
    msg_id: str,
    payload: bytes,
    now: datetime,
    trace: str | None = None,
) -> None:
    """An event in the outbox, in the caller's transaction, with the trace context of the
    work it stems from (``trace``, published as its headers)."""
    await outbox_add_many(conn, outbox, [OutboxRow(subject, msg_id, payload, now, trace)])
