"""The hygiene every request gets (dispo.libs.validation): each rule refuses what it names,
with the field, and lets ordinary values through."""

from __future__ import annotations

import re

import pytest
from dispo.libs.api.gateway.v1 import gateway_pb2
from dispo.libs.api.intelligence.v1 import intelligence_pb2
from dispo.libs.api.pool.v1 import pool_pb2
from dispo.libs.api.reconciler.v1 import reconciler_pb2
from dispo.libs.errors import InvalidArgument
from dispo.libs.validation import (
    MAX_TIMESTAMP_SECONDS,
    bounded,
    check_request,
    identifier,
    request_violations,
)
from google.protobuf import struct_pb2


def fields(message) -> list[tuple[str, str]]:
    return [(v.field, v.description) for v in request_violations(message)]


def test_ordinary_requests_pass():
    payload = struct_pb2.Struct()
    payload.update({"level": -3, "note": "two\nlines", "tags": ["a", 1.5]})
    request = gateway_pb2.SubmitRequest(
        business="ecommerce",
        idempotency_key="k-1",
        cells=[gateway_pb2.CellRequest(cell="c", payload=payload, depends_on=["x"])],
    )
    request.cells.add(cell="d", payload_json=b'{"a": "\\u0000"}')  # bytes: the payload's own check
    assert fields(request) == []
    check_request(request)
    assert fields(reconciler_pb2.AbandonTaskRequest(task_id="t", reason="why\nbecause")) == []


def test_nul_and_control_characters_are_refused_where_they_are():
    request = gateway_pb2.SubmitRequest(
        business="eco\x00merce",
        idempotency_key="key\n",
        cells=[gateway_pb2.CellRequest(cell="c", depends_on=["a", "b\t"])],
    )
    assert fields(request) == [
        ("business", "must not contain NUL characters"),
        ("cells[0].depends_on[1]", "must be one line without control characters"),
        ("idempotency_key", "must be one line without control characters"),
    ]
    # free text may hold line breaks, never a NUL
    assert fields(reconciler_pb2.AbandonTaskRequest(task_id="t", reason="a\x00b")) == [
        ("reason", "must not contain NUL characters")
    ]


def test_struct_members_are_named_like_payload_fields():
    payload = struct_pb2.Struct()
    payload.update({"level": float("nan"), "owner": {"name": "x\x00"}, "tags": [1, float("inf")]})
    payload.fields["bad\x00key"].string_value = "v"
    request = gateway_pb2.SubmitRequest(cells=[gateway_pb2.CellRequest(cell="c", payload=payload)])
    assert sorted(fields(request)) == [
        ("cells[0].payload.bad\x00key", "name must not contain NUL characters"),
        ("cells[0].payload.level", "must be a finite number"),
        ("cells[0].payload.owner.name", "must not contain NUL characters"),
        ("cells[0].payload.tags[1]", "must be a finite number"),
    ]


def test_numbers_are_finite_and_not_negative():
    assert fields(pool_pb2.RecordRunRequest(score=float("nan"), latency_ms=-1)) == [
        ("score", "must be a finite number"),
        ("latency_ms", "must not be negative"),
    ]
    assert fields(reconciler_pb2.RedriveByFilterRequest(rate_per_second=float("inf"))) == [
        ("rate_per_second", "must be a finite number")
    ]
    assert fields(gateway_pb2.ListTasksRequest(page={"page_size": -5})) == [
        ("page.page_size", "must not be negative")
    ]
    assert fields(pool_pb2.ListQueueRequest(limit=-1)) == [("limit", "must not be negative")]


def test_unknown_enum_numbers_are_refused():
    request = gateway_pb2.ListTasksRequest(statuses=[1, 99])
    assert fields(request) == [
        (
            "statuses[1]",
            "must be TASK_STATUS_ACCEPTED, TASK_STATUS_RUNNING, TASK_STATUS_SUCCEEDED,"
            " TASK_STATUS_FAILED, TASK_STATUS_CANCELLED, TASK_STATUS_RETRY_EXHAUSTED or"
            " TASK_STATUS_DEMOTED",
        )
    ]
    assert fields(intelligence_pb2.ListJobsRequest(kind=7)) == [
        ("kind", "must be JOB_KIND_ANALYSIS or JOB_KIND_COMPARISON")
    ]
    rule = pool_pb2.Rule(kind=42, value="200")
    request = pool_pb2.CreateEvaluationRequest(cases=[pool_pb2.TestCase(id="c", rules=[rule])])
    assert fields(request) == [
        (
            "cases[0].rules[0].kind",
            "must be RULE_KIND_STATUS, RULE_KIND_JSON_EQUALS, RULE_KIND_JSON_CONTAINS,"
            " RULE_KIND_REGEX or RULE_KIND_LATENCY_MS",
        )
    ]


@pytest.mark.parametrize(
    ("seconds", "nanos", "ok"),
    [
        (0, 0, True),
        (-62_135_596_800, 0, True),  # 0001-01-01, before the epoch is fine
        (MAX_TIMESTAMP_SECONDS, 999_999_999, True),
        (MAX_TIMESTAMP_SECONDS + 1, 0, False),
        (-62_135_596_801, 0, False),
        (0, 1_000_000_000, False),
        (0, -1, False),
    ],
)
def test_timestamps_hold_a_date(seconds, nanos, ok):
    request = gateway_pb2.ListTasksRequest()
    request.created_after.seconds, request.created_after.nanos = seconds, nanos
    expected = [] if ok else [("created_after", "must be a time between 0001-01-01 and 9999-12-31")]
    assert fields(request) == expected


def test_the_enum_rule_is_the_one_the_services_state():
    from dispo.libs.api.common.v1 import common_pb2
    from dispo.libs.evaluation import LINE_RULE, VERDICT_RULE

    request = pool_pb2.RecordRunRequest(verdict=9)
    assert fields(request) == [("verdict", VERDICT_RULE)]
    assert fields(intelligence_pb2.CreateEvaluationRequest(line=7)) == [("line", LINE_RULE)]
    assert set(common_pb2.Line.DESCRIPTOR.values_by_number) == {0, 1, 2}


def test_check_request_raises_every_violation_at_once():
    with pytest.raises(InvalidArgument) as refused:
        check_request(pool_pb2.SetPoolBoundsRequest(min_size=-1, max_size=-2))
    assert [v.field for v in refused.value.violations] == ["min_size", "max_size"]


def test_identifier_matches_the_whole_value():
    pattern = re.compile(r"[a-z]+$")  # even with a `$`, a trailing newline is refused
    assert identifier("abc", "id", pattern) == "abc"
    with pytest.raises(InvalidArgument) as refused:
        identifier("abc\n", "id", pattern)
    assert refused.value.violations[0].field == "id"


def test_bounded_names_the_range():
    assert bounded(5, "n", 0, 10) == 5
    with pytest.raises(InvalidArgument) as refused:
        bounded(2**62, "filter.min_age_seconds", 0, 100)
    assert refused.value.message == "filter.min_age_seconds: must be in 0..100"
