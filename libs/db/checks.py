"""CHECK constraints that mirror enums: written by migrations, compared with the enums.

A service declares which column mirrors which enum (:class:`dispo.libs.states.EnumCheck`,
beside its state machines). A migration writes each constraint with
:func:`enum_check_sql` from the values the migration itself lists: a migration is
history, and must mean the same thing whenever it runs. The service's schema test calls
:func:`enum_check_drift` after migrating, so a value added to an enum without a migration
fails it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from dispo.libs.states import EnumCheck
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection


def enum_check_sql(table: str, column: str, constraint: str, values: Iterable[str]) -> list[str]:
    """Statements that (re)create ``constraint``: ``column IN (values)`` on ``table``."""
    listed = ", ".join("'" + v.replace("'", "''") + "'" for v in values)
    return [
        f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {constraint}",
        f"ALTER TABLE {table} ADD CONSTRAINT {constraint} CHECK ({column} IN ({listed}))",
    ]


_LISTED = re.compile(r"'((?:[^']|'')*)'::text")


async def enum_checks(conn: AsyncConnection, schema: str) -> dict[tuple[str, str], frozenset[str]]:
    """Every CHECK constraint of ``schema`` that lists text values:
    (table, constraint name) -> the values."""
    rows = await conn.execute(
        text(
            "SELECT rel.relname, c.conname, pg_get_constraintdef(c.oid) FROM pg_constraint c"
            " JOIN pg_class rel ON rel.oid = c.conrelid"
            " JOIN pg_namespace n ON n.oid = rel.relnamespace"
            " WHERE n.nspname = :schema AND c.contype = 'c'"
        ),
        {"schema": schema},
    )
    found: dict[tuple[str, str], frozenset[str]] = {}
    for table, name, definition in rows:
        if "ANY (ARRAY[" in definition:
            values = frozenset(v.replace("''", "'") for v in _LISTED.findall(definition))
            found[(table, name)] = values
    return found


async def enum_check_drift(
    conn: AsyncConnection, schema: str, checks: Iterable[EnumCheck]
) -> dict[str, tuple[frozenset[str] | None, frozenset[str]]]:
    """Declared checks whose live constraint differs: name -> (live values, enum values).
    Empty when the database and the enums agree; a constraint missing from its table
    shows as None."""
    live = await enum_checks(conn, schema)
    return {
        c.constraint: (live.get((c.table, c.constraint)), c.values)
        for c in checks
        if live.get((c.table, c.constraint)) != c.values
    }


def enum_recase_sql(
    table: str, column: str, constraint: str, values: Iterable[str], *, case: str
) -> list[str]:
    """Statements that rewrite the stored values of an enum column to ``case`` ("lower" or
    "upper") and recreate its CHECK over ``values`` (already in that case), in that order:
    the old CHECK goes first, the new one is checked against the rewritten data."""
    if case not in ("lower", "upper"):
        raise ValueError(f"case must be 'lower' or 'upper', not {case!r}")
    drop, add = enum_check_sql(table, column, constraint, values)
    return [drop, f"UPDATE {table} SET {column} = {case}({column})", add]
