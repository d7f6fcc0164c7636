"""Alembic migrations per service, applied on start and safe when replicas start together.

Each service keeps ``services/<svc>/migrations/`` with ``versions/`` (ordinary Alembic
revision files) and an ``env.py`` that is just::

    from dispo.libs.db.migrations import run_env
    run_env()

:func:`migrate` takes a PostgreSQL advisory lock per schema, creates the schema if it is
missing, and upgrades to head inside that transaction, with the version table in the schema
itself. A service migrates as its own role, which owns its schema but may create none: the
bootstrap (:mod:`dispo.libs.db.roles`) has made the schema before.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command, context
from alembic.config import Config
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine


def _quoted(schema: str) -> str:
    if not schema.replace("_", "").isalnum():
        raise ValueError(f"bad schema name {schema!r}")
    return f'"{schema}"'


async def migrate(
    engine: AsyncEngine, schema: str, script_location: Path, revision: str = "head"
) -> None:
    """Bring ``schema`` up to the newest revision under ``script_location`` (or up to
    ``revision``: tests of a data migration write rows under the revision before it)."""
    async with engine.begin() as conn:
        await conn.execute(
            text("SELECT pg_advisory_xact_lock(hashtext(:key))"), {"key": f"dispo.migrate.{schema}"}
        )
        exists = await conn.scalar(
            text("SELECT 1 FROM pg_namespace WHERE nspname = :schema"), {"schema": schema}
        )
        if not exists:  # (CREATE SCHEMA IF NOT EXISTS asks for the right to create one first)
            await conn.execute(text(f"CREATE SCHEMA {_quoted(schema)}"))
        await conn.execute(text(f"SET LOCAL search_path TO {_quoted(schema)}"))
        await conn.run_sync(_upgrade, schema, script_location, revision)


def _upgrade(conn: Connection, schema: str, script_location: Path, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(script_location))
    config.attributes["connection"] = conn
    config.attributes["schema"] = schema
    command.upgrade(config, revision)


def run_env() -> None:
    """Body of every service's ``migrations/env.py`` (online mode, connection supplied)."""
    config = context.config
    conn = config.attributes["connection"]
    context.configure(
        connection=conn,
        version_table_schema=config.attributes["schema"],
        transactional_ddl=True,
    )
    with context.begin_transaction():
        context.run_migrations()
