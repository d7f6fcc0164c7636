"""Pure domain rules: statuses, fingerprints, statistics, diffs, truncation, model resolution."""

from __future__ import annotations

import pytest
from dispo.intelligence.analysis_models import ModelRegistry, StatsModel
from dispo.intelligence.comparison import diff_stats, metric_delta
from dispo.intelligence.eligibility import auto_intelligence_eligible
from dispo.intelligence.evaluations import (
    EvaluationRecordStatus,
    configuration_fingerprint,
    new_evaluation,
    new_run_result,
)
from dispo.intelligence.job_rules import (
    MAX_QUEUED_RECOVERY_ATTEMPTS,
    TRANSITIONS,
    JobStatus,
    can_transition,
)
from dispo.intelligence.stats import compute_stats, failure_signature, percentile
from dispo.libs.error_text import ERROR_TEXT_LIMIT, truncate_error
from dispo.libs.errors import InvalidArgument


def test_the_seed_constants():
    assert ERROR_TEXT_LIMIT == 500
    assert MAX_QUEUED_RECOVERY_ATTEMPTS == 3


def test_job_status_machine():
    assert can_transition(JobStatus.QUEUED, JobStatus.GENERATING)
    assert can_transition(JobStatus.GENERATING, JobStatus.COMPLETED)
    assert can_transition(JobStatus.GENERATING, JobStatus.FAILED)
    assert not can_transition(JobStatus.QUEUED, JobStatus.COMPLETED)
    assert not TRANSITIONS[JobStatus.COMPLETED]
    assert set(TRANSITIONS) == set(JobStatus)


def test_truncate_error_cuts_to_exactly_500():
    assert len(truncate_error("x" * 2000)) == 500
    assert truncate_error("short") == "short"


def test_fingerprint_ignores_key_order_and_sees_values():
    a = configuration_fingerprint({"b": 1, "a": [1, 2]})
    assert a == configuration_fingerprint({"a": [1, 2], "b": 1})
    assert a != configuration_fingerprint({"a": [2, 1], "b": 1})
    assert len(a) == 16


def test_new_evaluation_names_every_bad_field():
    with pytest.raises(InvalidArgument) as caught:
        new_evaluation("", "s", "beta", "", "[1]")
    fields = {v.field for v in caught.value.violations}
    assert fields == {"evaluation_id", "line", "period", "configuration_json"}


def test_new_run_result_rejects_bad_values():
    with pytest.raises(InvalidArgument) as caught:
        new_run_result("r", "c", "maybe", float("nan"), -1, field_prefix="runs[3].")
    assert {v.field for v in caught.value.violations} == {
        "runs[3].verdict",
        "runs[3].score",
        "runs[3].latency_ms",
    }


def _runs():
    rows = [
        ("c1", "pass", 1.0, 100, ""),
        ("c2", "fail", 0.2, 300, "expected 200, got 500 from 'a'"),
        ("c2", "fail", 0.4, 320, "expected 200, got 503 from 'b'"),
        ("c3", "error", 0.0, 1000, "timeout"),
        ("c1", "pass", 0.9, 120, ""),
    ]
    return [new_run_result(f"r{i}", *row) for i, row in enumerate(rows)]


def test_stats_are_deterministic_and_complete():
    stats = compute_stats(_runs())
    assert stats == compute_stats(list(reversed(_runs())))
    assert stats["run_count"] == 5 and stats["case_count"] == 3
    assert stats["pass_rate"] == 0.4 and stats["fail_rate"] == 0.4 and stats["error_rate"] == 0.2
    assert (
        stats["score"]["min"] == 0.0
        and stats["score"]["max"] == 1.0
        and stats["score"]["p50"] == 0.4
    )
    assert stats["latency"]["p50_ms"] == 300 and stats["latency"]["max_ms"] == 1000
    top = stats["failure_clusters"][0]
    assert top["count"] == 2 and top["signature"] == "expected <n>, got <n> from <text>"
    assert [c["case_id"] for c in stats["worst_cases"]] == ["c2", "c3"] or [
        c["case_id"] for c in stats["worst_cases"]
    ] == ["c3", "c2"]
    assert stats["worst_cases"][0]["pass_rate"] == 0.0


def test_stats_of_no_runs():
    stats = compute_stats([])
    assert stats["run_count"] == 0 and stats["pass_rate"] == 0.0 and stats["failure_clusters"] == []


def test_percentile_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert (
        percentile(values, 50) == 50
        and percentile(values, 99) == 99
        and percentile(values, 100) == 100
    )


def test_failure_signature_masks_ids_and_numbers():
    assert (
        failure_signature("Job 123e4567-e89b-12d3-a456-426614174000 took 42.5s")
        == "job <id> took <n>s"
    )


def test_metric_delta_direction_follows_polarity():
    assert metric_delta("pass_rate", 0.5, 0.6, True)["direction"] == "improved"
    assert metric_delta("latency.p50_ms", 100, 150, False)["direction"] == "regressed"
    unchanged = metric_delta("pass_rate", 0.0, 0.0, True)
    assert unchanged["direction"] == "unchanged" and unchanged["relative_delta"] is None
    assert metric_delta("score.mean", 0.5, 0.25, True)["relative_delta"] == -0.5


def test_a_change_within_a_metrics_tolerance_is_unchanged_not_regressed():
    """Noise is no regression: a 1 ms change of a 200 ms p50 is unchanged; a latency must
    move by more than 5 ms and 5 % of its baseline, a rate or a score by more than a point."""
    one_ms = metric_delta("latency.p50_ms", 200, 201, False)
    assert one_ms["direction"] == "unchanged" and one_ms["absolute_delta"] == 1  # still shown
    assert metric_delta("latency.p50_ms", 20, 24.5, False)["direction"] == "unchanged"  # < 5 ms
    assert metric_delta("latency.p50_ms", 200, 209, False)["direction"] == "unchanged"  # < 5 %
    assert metric_delta("latency.p50_ms", 200, 211, False)["direction"] == "regressed"
    assert metric_delta("latency.p90_ms", 20, 26, False)["direction"] == "regressed"
    assert metric_delta("latency.mean_ms", 200, 150, False)["direction"] == "improved"
    assert metric_delta("pass_rate", 0.90, 0.905, True)["direction"] == "unchanged"
    assert metric_delta("error_rate", 0.10, 0.095, False)["direction"] == "unchanged"
    assert metric_delta("pass_rate", 0.90, 0.92, True)["direction"] == "improved"
    assert metric_delta("score.p50", 0.80, 0.78, True)["direction"] == "regressed"


def test_diff_covers_every_compared_metric():
    stats = compute_stats(_runs())
    diff = diff_stats(stats, stats)
    assert {d["direction"] for d in diff} == {"unchanged"}
    assert "pass_rate" in {d["metric"] for d in diff}


def test_model_resolution_and_auto_eligibility():
    models = ModelRegistry([StatsModel()], default="stats")
    formal = new_evaluation("a", "s", "formal", "p", "{}")
    trial = new_evaluation("b", "s", "trial", "p", "{}")
    ghost = new_evaluation("c", "s", "formal", "p", "{}", analysis_model="ghost")
    assert models.resolve(None).model is not None
    assert "not registered" in (models.resolve("ghost").problem or "")
    assert auto_intelligence_eligible(formal, models)
    assert not auto_intelligence_eligible(trial, models)
    assert not auto_intelligence_eligible(ghost, models)
    assert not auto_intelligence_eligible(formal, ModelRegistry([StatsModel()], default=None))


def test_evaluation_status_terminal():
    evaluation = new_evaluation("a", "s", "formal", "p", "{}")
    assert evaluation.status == EvaluationRecordStatus.RUNNING and not evaluation.is_terminal


def test_settings_refuse_a_heartbeat_as_slow_as_the_takeover_age():
    import pytest
    from dispo.intelligence.retries import RetryPolicy
    from dispo.intelligence.settings import IntelligenceSettings
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="heartbeat_seconds .900. must be below"):
        IntelligenceSettings(heartbeat_seconds=900, generating_stale_seconds=900)
    settings = IntelligenceSettings(heartbeat_seconds=30, model_max_attempts=2)
    assert settings.recovery_policy().heartbeat.total_seconds() == 30
    assert settings.retry_policy() == RetryPolicy(max_attempts=2)
    assert IntelligenceSettings().retry_policy() == RetryPolicy()
    with pytest.raises(ValidationError):
        IntelligenceSettings(model_max_attempts=0)
