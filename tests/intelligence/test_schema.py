"""The database mirrors the status machines declared in the domain, and the generated
contract is in sync with the proto."""

from __future__ import annotations

from dispo.intelligence.store import CHECKED_COLUMNS
from dispo.libs import protogen
from dispo.libs.db.checks import enum_check_drift
from dispo.libs.error_text import ERROR_TEXT_LIMIT
from sqlalchemy import text


async def test_check_constraints_agree_with_the_domain_enums(intel_engine):
    async with intel_engine.connect() as conn:
        assert await enum_check_drift(conn, "intelligence", CHECKED_COLUMNS) == {}


async def test_error_length_limit_is_enforced_by_the_database_too(intel_engine):
    async with intel_engine.connect() as conn:
        definition = (
            await conn.execute(
                text(
                    "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'ck_job_error_length'"
                )
            )
        ).scalar_one()
    assert f"<= {ERROR_TEXT_LIMIT}" in definition


def test_generated_intelligence_contract_is_up_to_date():
    stale = [path for path in protogen.check() if "/intelligence" in path or path == "libs/api"]
    assert stale == []
