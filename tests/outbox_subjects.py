"""What the services' outboxes have written, read straight from PostgreSQL, to check it
against the wire contracts (dispo.libs.contracts)."""

from __future__ import annotations

import asyncpg
from dispo.libs import contracts


async def outbox_subjects(database_url: str) -> dict[str, set[str]]:
    """``{"<schema>.<table>": {subjects}}`` for every outbox table in the database."""
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


async def assert_outbox_subjects_declared(database_url: str, *, schemas: set[str]) -> None:
    """Every subject in the outboxes of ``schemas`` is declared and one its service may
    publish, and each of them wrote some."""
    found = await outbox_subjects(database_url)
    written = {table.split(".")[0]: subjects for table, subjects in found.items()}
    assert schemas <= {s for s, subjects in written.items() if subjects}, found
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
