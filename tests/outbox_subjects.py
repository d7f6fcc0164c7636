"""What the services' outboxes hold and have written, read straight from PostgreSQL, to
check it against the wire contracts (dispo.libs.contracts). A published row is deleted
(ADR-0062): what an outbox still holds is what was not published (yet)."""

from __future__ import annotations

import asyncpg
from dispo.libs import contracts


async def outbox_subjects(database_url: str) -> dict[str, set[str]]:
    """``{"<schema>.<table>": {subjects}}`` of the rows every outbox table in the database
    still holds."""
    conn = await asyncpg.connect(database_url)
    try:
        tables = await conn.fetch(
            "SELECT table_schema, table_name FROM information_schema.tables"
            " WHERE table_name = 'outbox' ORDER BY table_schema"
        )
        found: dict[str, set[str]] = {}
        for t in tables:
            name = f'"{t["table_schema"]}"."{t["table_name"]}"'
            rows = await conn.fetch(f"SELECT DISTINCT subject FROM {name}")
            found[f"{t['table_schema']}.{t['table_name']}"] = {r["subject"] for r in rows}
        return found
    finally:
        await conn.close()


def rows_written(schema: str = "") -> str:
    """SQL reading how many rows an outbox has ever written: the ids its sequence handed
    out (a published row is deleted, so counting rows would not tell). ``schema``: the
    outbox's, or empty for the one on the search path. The database is the test's own."""
    sequence = f"{schema}.outbox_id_seq" if schema else "outbox_id_seq"
    return f"SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {sequence}"


async def outboxes_written(database_url: str) -> set[str]:
    """The schemas whose outbox has written a row (its id sequence was used), published
    and deleted since or not."""
    conn = await asyncpg.connect(database_url)
    try:
        tables = await conn.fetch(
            "SELECT table_schema FROM information_schema.tables WHERE table_name = 'outbox'"
        )
        return {
            t["table_schema"]
            for t in tables
            if await conn.fetchval(rows_written(t["table_schema"]))
        }
    finally:
        await conn.close()


async def assert_outbox_subjects_declared(database_url: str, *, schemas: set[str]) -> None:
    """Each outbox of ``schemas`` wrote rows, and every subject still in an outbox is
    declared and one its service may publish (an outbox keeps a row its service's bus user
    may not publish: refused, it is never sent). An undeclared subject is refused before it
    is written (``require_declared``)."""
    found = await outbox_subjects(database_url)
    assert schemas <= await outboxes_written(database_url), found
    undeclared = {
        table: sorted(s for s in subjects if not contracts.declared(s))
        for table, subjects in found.items()
    }
    assert not any(undeclared.values()), undeclared
    # Each service's bus user may publish what its outbox wrote (the permissions follow the
    # declared flows, so a publication the flows miss would be refused by the bus).
    refused = {
        table: sorted(s for s in subjects if not contracts.may_publish(table.split(".")[0], s))
        for table, subjects in found.items()
    }
    assert not any(refused.values()), refused
