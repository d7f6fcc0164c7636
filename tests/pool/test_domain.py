"""Pure domain rules (no I/O) and the state machines mirrored in the database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from dispo.libs.db.checks import enum_check_drift
from dispo.pool.domain import (
    CHECKED_COLUMNS,
    CRON_TRANSITIONS,
    EVALUATION_TRANSITIONS,
    CronStatus,
    EvaluationStatus,
    PoolPolicy,
    Rule,
    Schedule,
    plan_resize,
)
from dispo.pool.scoring import Answer, json_path, score, validate_rule

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_schedule_debt_and_slot_due():
    s = Schedule(T0, 86400, 24, 2)  # one-hour slots
    assert s.runs_total == 48
    assert s.current_slot(T0 - timedelta(seconds=1)) == -1
    assert s.current_slot(T0) == 0 and s.runs_due(T0) == 2
    assert s.debt(T0, 0) == 2 and s.slot_due(T0, 0)
    at = T0 + timedelta(hours=3, minutes=30)
    assert s.runs_due(at) == 8
    assert s.debt(at, 6) == 2 and s.slot_due(at, 6)
    assert s.debt(at, 7) == 1 and not s.slot_due(at, 7)
    assert s.debt(at, 8) == 0 and not s.slot_due(at, 8)
    assert s.current_slot(T0 + timedelta(days=3)) == 23  # capped at the last slot


@pytest.mark.parametrize(
    ("live", "busy", "delta"),
    [
        (5, 4, 0),  # 4/5 = 0.8 exactly: no scale-up
        (10, 8, 0),  # 0.8 exactly
        (5, 5, 2),  # 1.0 > 0.8: grow until busy/total <= 0.8 -> ceil(5/0.8) = 7
        (10, 9, 2),  # 0.9 -> ceil(9/0.8) = 12
        (20, 20, 0),  # at max: never above
        (19, 19, 1),  # capped at 20
    ],
)
def test_scale_up_threshold_at_its_boundary(live, busy, delta):
    assert plan_resize(live, busy, live - busy, PoolPolicy()).delta == delta


@pytest.mark.parametrize(
    ("live", "busy", "delta"),
    [
        (10, 0, 0),  # idle 10 = 2 x min: no scale-down
        (11, 0, -1),  # idle 11 > 10: back to 10 idle
        (15, 3, -2),  # idle 12 -> 10
        (20, 0, -10),  # idle 20 -> 10
        (4, 0, 1),  # below min: grow to min
    ],
)
def test_scale_down_threshold_at_its_boundary(live, busy, delta):
    assert plan_resize(live, busy, live - busy, PoolPolicy()).delta == delta


def test_scale_respects_min_when_shrinking():
    policy = PoolPolicy(min_size=2, max_size=20, scale_down_idle_factor=0.5)
    # idle 3 > 1: shrink to 1 idle, but never below min 2 live crons
    assert plan_resize(3, 0, 3, policy).delta == -1


def test_scoring_rules():
    answer = Answer(200, '{"answer": "Paris, France", "items": [1, {"k": true}]}', 120)
    rules = (
        Rule("status", "200"),
        Rule("json_equals", "true", "$.items[1].k"),
        Rule("json_contains", "Paris", "$.answer"),
        Rule("regex", r"France"),
        Rule("latency_ms", "100"),
    )
    result = score(rules, answer)
    assert result.verdict.value == "fail"
    assert result.score == pytest.approx(0.8)
    assert "latency 120ms > 100ms" in result.failure_reason
    assert score(rules[:4], answer).verdict.value == "pass"
    assert json_path({"a": [{"b": 3}]}, "$.a[0].b") == 3
    assert validate_rule(Rule("regex", "(")) is not None
    assert validate_rule(Rule("json_equals", "{bad", "$.a")) == "value must be JSON"
    assert validate_rule(Rule("nope", "1")) is not None


async def test_state_machines_agree_with_database_checks(pool_engine):
    async with pool_engine.connect() as conn:
        assert await enum_check_drift(conn, "pool", CHECKED_COLUMNS) == {}
    assert set(EVALUATION_TRANSITIONS) == set(EvaluationStatus)
    assert set(CRON_TRANSITIONS) == set(CronStatus)
    # Terminal statuses have no way out.
    assert not EVALUATION_TRANSITIONS[EvaluationStatus.COMPLETED]
    assert not EVALUATION_TRANSITIONS[EvaluationStatus.CANCELLED]


@pytest.mark.parametrize(
    ("rule", "reason"),
    [
        (Rule("status", "²"), "value must be an HTTP status code, 100..599"),  # "²".isdigit()
        (Rule("status", "٢٠٠"), "value must be an HTTP status code, 100..599"),  # Arabic-Indic
        (Rule("status", "200\n"), "value must be an HTTP status code, 100..599"),
        (Rule("status", "99999999999999999999"), "value must be an HTTP status code, 100..599"),
        (Rule("latency_ms", "-1"), "value must be a number of milliseconds, 0..3600000"),
        (Rule("latency_ms", "²"), "value must be a number of milliseconds, 0..3600000"),
        (Rule("json_equals", "NaN", "$.a"), "value must be JSON"),
        (Rule("json_equals", '"\\u0000"', "$.a"), "value must be JSON"),
    ],
)
def test_malformed_rule_values_are_refused(rule, reason):
    assert validate_rule(rule) == reason


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=a)b", r"(?<!x)y", "a" * 1001])
def test_regexes_that_cannot_run_in_linear_time_are_refused(pattern):
    reason = validate_rule(Rule("regex", pattern))
    assert reason is not None and "regex" in reason


@pytest.mark.timeout(60)  # with a backtracking engine this would not end: the timeout fails it
def test_a_pathological_regex_is_scored_in_linear_time():
    rule = Rule("regex", r"(a+)+$")
    assert validate_rule(rule) is None  # RE2 runs it in linear time, so it is accepted
    result = score((rule,), Answer(200, "a" * 64 + "!", 1))
    assert result.verdict.value == "fail"
    assert "does not match" in result.failure_reason
    assert score((rule,), Answer(200, "a" * 64, 1)).verdict.value == "pass"


def test_a_stored_malformed_rule_is_scored_as_failed_not_raised():
    # Rules stored before validation was this strict must not crash the worker's scoring.
    result = score((Rule("status", "²"), Rule("regex", r"(a)\1")), Answer(200, "aa", 1))
    assert result.verdict.value == "fail" and result.score == 0.0
    assert result.failure_reason.count("invalid rule") == 2
