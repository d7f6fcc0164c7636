"""Scheduling rules, retry policy, breaker and classification (pure domain)."""

import random
from datetime import UTC, datetime, timedelta

import pytest
from dispo.executor.actions import CallOutcome, classify_status
from dispo.executor.breaker import Breaker, BreakerState
from dispo.executor.domain import (
    ActionSpec,
    Next,
    NodeRun,
    RetryPolicy,
    blocked_by_failure,
    decide,
    ready,
    to_cancel,
)
from dispo.executor.states import NODE_TRANSITIONS, TASK_TRANSITIONS, NodeState, TaskState

NOW = datetime(2026, 1, 1, tzinfo=UTC)
S = NodeState


def dag(**edges):
    """dag(a=(), b=("a",)) → nodes, all PENDING."""
    return {
        n: NodeRun(n, tuple(deps), ActionSpec("http", "d"), f"t/{n}") for n, deps in edges.items()
    }


def test_failure_dooms_dependants_transitively_but_not_independent_nodes():
    nodes = dag(a=(), b=("a",), c=("b",), d=())
    nodes["a"].status = S.FAILED
    assert blocked_by_failure(nodes) == ["b", "c"]
    assert [n.node_id for n in ready(nodes, NOW)] == ["d"]


def test_retry_exhausted_node_blocks_dependants_without_dooming_them():
    nodes = dag(a=(), b=("a",))
    nodes["a"].status, nodes["a"].retryable = S.FAILED, True
    assert blocked_by_failure(nodes) == []
    assert decide(nodes, NOW, False).next is Next.FAIL


def test_backoff_delays_readiness():
    nodes = dag(a=())
    nodes["a"].not_before = NOW + timedelta(seconds=1)
    assert ready(nodes, NOW) == []
    decision = decide(nodes, NOW, False)
    assert (decision.next, decision.not_before) == (Next.RETRY, NOW + timedelta(seconds=1))
    assert [n.node_id for n in ready(nodes, NOW + timedelta(seconds=1))] == ["a"]


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        ({"a": S.SUCCEEDED, "b": S.SUCCEEDED}, (Next.FINISH, TaskState.SUCCEEDED)),
        ({"a": S.FAILED, "b": S.DEPENDENCY_FAILED}, (Next.FINISH, TaskState.FAILED)),
        ({"a": S.SUCCEEDED, "b": S.DEMOTED}, (Next.DEMOTE, TaskState.DEMOTED)),
        ({"a": S.UNKNOWN, "b": S.PENDING}, (Next.FAIL, TaskState.RETRY_EXHAUSTED)),
        ({"a": S.SUCCEEDED, "b": S.PENDING}, (Next.RETRY, TaskState.RUNNING)),
    ],
)
def test_decide(statuses, expected):
    nodes = dag(a=(), b=("a",))
    for name, status in statuses.items():
        nodes[name].status = status
    decision = decide(nodes, NOW, False)
    assert (decision.next, decision.status) == expected


def test_cancel_takes_everything_not_started():
    nodes = dag(a=(), b=("a",), c=(), d=(), e=())
    nodes["a"].status, nodes["c"].status, nodes["d"].status = S.RUNNING, S.SUCCEEDED, S.DEMOTED
    nodes["e"].status = S.UNKNOWN  # may have happened: settled by its probe, not cancelled
    assert to_cancel(nodes) == ["b", "d"]
    nodes["e"].status = S.SUCCEEDED
    nodes["a"].status = S.SUCCEEDED
    nodes["b"].status = nodes["d"].status = S.CANCELLED
    assert decide(nodes, NOW, True).status is TaskState.CANCELLED


def test_retry_policy_is_bounded_jittered_and_capped():
    policy = RetryPolicy(max_retries=3, base_delay=1.0, max_delay=4.0, jitter=0.5)
    assert not policy.exhausted(3) and policy.exhausted(4)
    rng = random.Random(7)
    delays = [policy.delay(n, rng) for n in range(1, 6)]
    assert 0.5 <= delays[0] <= 1.5 and 1.0 <= delays[1] <= 3.0
    assert all(d <= 6.0 for d in delays)


def test_breaker_opens_after_threshold_and_half_opens_after_cooldown():
    breaker = Breaker(threshold=2, window=10, cooldown=30)
    breaker.record_failure(NOW)
    assert breaker.allow(NOW)
    breaker.record_failure(NOW + timedelta(seconds=1))
    assert breaker.state is BreakerState.OPEN and not breaker.allow(NOW + timedelta(seconds=2))
    later = NOW + timedelta(seconds=32)
    assert breaker.allow(later) and breaker.state is BreakerState.HALF_OPEN
    assert not breaker.allow(later)  # one probe at a time
    breaker.record_success(later)
    assert breaker.state is BreakerState.CLOSED


def test_breaker_half_opens_when_health_returns():
    breaker = Breaker(threshold=2, window=10, cooldown=300)
    breaker.trip(NOW)
    assert not breaker.allow(NOW)
    breaker.health_ok()
    assert breaker.allow(NOW) and not breaker.allow(NOW)  # one probe call
    breaker.record_failure(NOW)
    assert breaker.state is BreakerState.OPEN


def test_breaker_forgets_failures_outside_its_window():
    breaker = Breaker(threshold=2, window=10, cooldown=30)
    breaker.record_failure(NOW)
    breaker.record_failure(NOW + timedelta(seconds=11))
    assert breaker.state is BreakerState.CLOSED


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        (200, CallOutcome.SUCCESS),
        (204, CallOutcome.SUCCESS),
        (400, CallOutcome.PERMANENT),
        (404, CallOutcome.PERMANENT),
        (408, CallOutcome.RETRYABLE),
        (429, CallOutcome.RETRYABLE),
        (500, CallOutcome.RETRYABLE),
        (503, CallOutcome.RETRYABLE),
    ],
)
def test_http_classification(code, outcome):
    assert classify_status(code) is outcome


def test_state_machines_are_closed_and_match_the_protos():
    for table in (NODE_TRANSITIONS, TASK_TRANSITIONS):
        for targets in table.values():
            assert targets <= set(table)
    assert {s.to_proto() for s in NodeState} == set(range(1, 9))
    assert {s.to_proto() for s in TaskState} == set(range(1, 8))
    assert all(NodeState.from_proto(s.to_proto()) is s for s in NodeState)
