"""Migration 0002 renames the campaign tables to evaluation tables and keeps every row."""

from __future__ import annotations

from pathlib import Path

from dispo.libs.db import create_engine, migrate
from sqlalchemy import text

MIGRATIONS = Path(__file__).parents[2] / "services" / "intelligence" / "migrations"
SCHEMA = "intelligence_data_migration"


async def test_campaign_rows_are_evaluation_rows_after_0002(database_url):
    engine = create_engine(database_url, SCHEMA)
    try:
        await migrate(engine, SCHEMA, MIGRATIONS, revision="0001")
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO campaigns (campaign_id, series, line, status, period, configuration,"
                    " fingerprint, created_at, updated_at)"
                    " VALUES ('e1', 's', 'formal', 'completed', 'p1', '{}', 'f', now(), now())"
                )
            )
            await conn.execute(
                text(
                    "INSERT INTO campaign_runs (run_id, campaign_id, case_id, verdict, score,"
                    " latency_ms, recorded_at) VALUES ('r1', 'e1', 'c1', 'pass', 1, 5, now())"
                )
            )
            await conn.execute(
                text(
                    "INSERT INTO intelligence_jobs (kind, campaign_id, status, baseline_campaign_id,"
                    " created_at, updated_at) VALUES ('comparison', 'e1', 'queued', 'e0', now(), now())"
                )
            )
        await migrate(engine, SCHEMA, MIGRATIONS)
        async with engine.connect() as conn:
            evaluation = (
                await conn.execute(text("SELECT evaluation_id, line FROM evaluations"))
            ).one()
            run = (
                await conn.execute(text("SELECT run_id, evaluation_id FROM evaluation_runs"))
            ).one()
            job = (
                await conn.execute(
                    text("SELECT evaluation_id, baseline_evaluation_id FROM intelligence_jobs")
                )
            ).one()
        assert tuple(evaluation) == ("e1", "formal")
        assert tuple(run) == ("r1", "e1")
        assert tuple(job) == ("e1", "e0")
    finally:
        async with engine.begin() as conn:
            await conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        await engine.dispose()


async def test_0003_gives_unsettled_jobs_a_heartbeat_from_their_claim(database_url):
    schema = "intelligence_heartbeat_migration"
    engine = create_engine(database_url, schema)
    try:
        await migrate(engine, schema, MIGRATIONS, revision="0002")
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO evaluations (evaluation_id, series, line, status, period,"
                    " configuration, fingerprint, created_at, updated_at)"
                    " VALUES ('e1', 's', 'formal', 'completed', 'p1', '{}', 'f', now(), now())"
                )
            )
            await conn.execute(
                text(
                    "INSERT INTO intelligence_jobs (kind, evaluation_id, status, claim_token,"
                    " claimed_at, created_at, updated_at) VALUES"
                    " ('analysis', 'e1', 'generating', 't', '2026-01-01T10:00Z', now(), now()),"
                    " ('comparison', 'e1', 'queued', NULL, NULL, now(), '2026-01-01T11:00Z')"
                )
            )
        await migrate(engine, schema, MIGRATIONS)
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    text(
                        "SELECT kind, to_char(heartbeat_at AT TIME ZONE 'UTC', 'HH24:MI')"
                        " FROM intelligence_jobs ORDER BY kind"
                    )
                )
            ).all()
        assert [tuple(r) for r in rows] == [("analysis", "10:00"), ("comparison", "11:00")]
    finally:
        async with engine.begin() as conn:
            await conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        await engine.dispose()
