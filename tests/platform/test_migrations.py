"""Migrations land in the service's own schema, once, even when replicas start together."""

import asyncio
from pathlib import Path

import pytest
from dispo.libs.db import create_engine, migrate
from sqlalchemy import text

# Real migrations on a database that has none applied yet.
pytestmark = pytest.mark.blank_database

SAMPLE = Path(__file__).parent / "sample_migrations"


async def test_concurrent_starts_apply_each_revision_once(database_url):
    engines = [create_engine(database_url, "sample") for _ in range(5)]
    try:
        await asyncio.gather(*(migrate(e, "sample", SAMPLE) for e in engines))
        async with engines[0].connect() as conn:
            versions = (
                (await conn.execute(text("SELECT version_num FROM sample.alembic_version")))
                .scalars()
                .all()
            )
            columns = (
                (
                    await conn.execute(
                        text(
                            "SELECT column_name FROM information_schema.columns "
                            "WHERE table_schema = 'sample' AND table_name = 'widgets' ORDER BY ordinal_position"
                        )
                    )
                )
                .scalars()
                .all()
            )
            public = (
                await conn.execute(
                    text(
                        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
                    )
                )
            ).scalar()
        assert versions == ["0002"]
        assert columns == ["id", "name", "colour"]
        assert public == 0
    finally:
        for engine in engines:
            await engine.dispose()


async def test_engine_sees_its_own_schema_unqualified(database_url):
    engine = create_engine(database_url, "sample")
    other = create_engine(database_url, "other")
    try:
        await migrate(engine, "sample", SAMPLE)
        await migrate(other, "other", SAMPLE)
        async with engine.begin() as conn:
            await conn.execute(text("INSERT INTO widgets (name) VALUES ('mine')"))
        async with other.connect() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM widgets"))).scalar() == 0
        # running again is a no-op
        await migrate(engine, "sample", SAMPLE)
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT name, colour FROM widgets"))).all() == [
                ("mine", "blue")
            ]
    finally:
        await engine.dispose()
        await other.dispose()
