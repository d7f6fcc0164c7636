"""The database mirrors the status machines declared in the domain, and the generated
contract is in sync with the proto."""

from __future__ import annotations

import re

from dispo.intelligence.evaluations import EvaluationStatus, Line, Verdict
from dispo.intelligence.jobs import ERROR_TEXT_LIMIT, JobKind, JobStatus
from dispo.libs import protogen
from sqlalchemy import text


async def _check_values(engine, constraint: str) -> set[str]:
    async with engine.connect() as conn:
        definition = (
            await conn.execute(
                text("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = :name"),
                {"name": constraint},
            )
        ).scalar_one()
    return set(re.findall(r"'([a-z_]+)'::text", definition))


async def test_check_constraints_agree_with_the_domain_enums(intel_engine):
    assert await _check_values(intel_engine, "ck_job_status") == {s.value for s in JobStatus}
    assert await _check_values(intel_engine, "ck_job_kind") == {k.value for k in JobKind}
    assert await _check_values(intel_engine, "ck_evaluation_status") == {
        s.value for s in EvaluationStatus
    }
    assert await _check_values(intel_engine, "ck_evaluation_line") == {v.value for v in Line}
    assert await _check_values(intel_engine, "ck_run_verdict") == {v.value for v in Verdict}


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
