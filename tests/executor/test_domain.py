"""Scheduling rules, retry policy and breaker (pure domain); the classification of failed
calls is tested in test_failures.py."""

import random
from datetime import UTC, datetime, timedelta

import pytest
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
from dispo.libs.api.common.v1 import common_pb2

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
    breaker = Breaker(threshold=2, window=10, cooldown=30, trial_calls=1)
    breaker.record_failure(NOW)
    assert breaker.allow(NOW)
    breaker.record_failure(NOW + timedelta(seconds=1))
    assert breaker.state is BreakerState.OPEN and not breaker.allow(NOW + timedelta(seconds=2))
    later = NOW + timedelta(seconds=32)
    assert breaker.allow(later) and breaker.state is BreakerState.HALF_OPEN
    assert not breaker.allow(later)  # one trial call configured
    breaker.record_success(later)
    assert breaker.state is BreakerState.CLOSED


def test_a_breaker_past_its_cooldown_is_reported_half_open_before_the_next_call():
    """What ListDownstreams (and the reconciler's release, ADR-0115) reads: the state a call
    would find, not the one the last call left."""
    breaker = Breaker(threshold=1, window=10, cooldown=30, trial_calls=1)
    breaker.trip(NOW)
    assert breaker.state_at(NOW + timedelta(seconds=29)) is BreakerState.OPEN
    assert breaker.state_at(NOW + timedelta(seconds=30)) is BreakerState.HALF_OPEN
    assert breaker.state is BreakerState.OPEN  # reading it changes nothing


def test_breaker_half_opens_when_health_returns():
    breaker = Breaker(threshold=2, window=10, cooldown=300, trial_calls=1)
    breaker.trip(NOW)
    assert not breaker.allow(NOW)
    breaker.health_ok()
    assert breaker.allow(NOW) and not breaker.allow(NOW)  # one trial call
    breaker.record_failure(NOW)
    assert breaker.state is BreakerState.OPEN


def test_breaker_forgets_failures_outside_its_window():
    breaker = Breaker(threshold=2, window=10, cooldown=30)
    breaker.record_failure(NOW)
    breaker.record_failure(NOW + timedelta(seconds=11))
    assert breaker.state is BreakerState.CLOSED


def _run(breaker: Breaker, pattern: list[bool], calls: int, step: float) -> list[BreakerState]:
    """``calls`` calls ``step`` seconds apart, failing where ``pattern`` (cycled) says;
    returns the state after each call."""
    states = []
    for i in range(calls):
        at = NOW + timedelta(seconds=i * step)
        if breaker.allow(at):
            if pattern[i % len(pattern)]:
                breaker.record_failure(at)
            else:
                breaker.record_success(at)
        states.append(breaker.state)
    return states


def test_breaker_never_opens_at_a_ten_percent_failure_rate():
    # Defaults; 3000 calls at 100 per second: every window holds 3000 calls, 300 failures.
    breaker = Breaker()
    states = _run(breaker, [True] + [False] * 9, calls=3000, step=0.01)
    assert set(states) == {BreakerState.CLOSED}
    assert breaker.recent_failures(NOW + timedelta(seconds=29.99)) == 300
    # Bursty too: the same tenth, but failing two and three in a row.
    bursty = Breaker()
    pattern = [True, True, True] + [False] * 27
    assert set(_run(bursty, pattern, calls=3000, step=0.01)) == {BreakerState.CLOSED}


def test_breaker_opens_at_a_sixty_percent_failure_rate():
    breaker = Breaker()  # 10 calls, half failed
    states = _run(breaker, [True, False, True, False, True], calls=100, step=0.01)
    assert BreakerState.OPEN in states
    opened = states.index(BreakerState.OPEN)
    assert opened == breaker.threshold - 1  # as soon as the window holds enough calls
    assert not breaker.allow(NOW + timedelta(seconds=1))


def test_breaker_keeps_five_failures_among_five_hundred_calls_closed():
    breaker = Breaker(threshold=5, window=30)  # the old "five in 30 s" would open here
    states = _run(breaker, [True] + [False] * 99, calls=500, step=0.05)
    assert set(states) == {BreakerState.CLOSED}
    assert breaker.recent_failures(NOW + timedelta(seconds=24.95)) == 5


def test_breaker_ratio_and_minimum_calls_edges():
    # Below the minimum number of calls nothing opens it, even all failures.
    breaker = Breaker(threshold=4, window=10, failure_ratio=0.5)
    for i in range(3):
        breaker.record_failure(NOW + timedelta(seconds=i))
    assert breaker.state is BreakerState.CLOSED
    breaker.record_failure(NOW + timedelta(seconds=3))  # the fourth call: 4/4
    assert breaker.state is BreakerState.OPEN

    # Exactly the ratio opens it; just under does not.
    at_ratio = Breaker(threshold=4, window=10, failure_ratio=0.5)
    for failed in [False, False, True]:
        (at_ratio.record_failure if failed else at_ratio.record_success)(NOW)
    assert at_ratio.state is BreakerState.CLOSED  # 3 calls: not enough yet
    at_ratio.record_failure(NOW)  # 2 of 4 = 0.5
    assert at_ratio.state is BreakerState.OPEN
    under = Breaker(threshold=4, window=10, failure_ratio=0.5)
    for failed in [False, False, False, True, False, True]:  # 2 of 6
        (under.record_failure if failed else under.record_success)(NOW)
    assert under.state is BreakerState.CLOSED

    # Successes leaving the window raise the ratio of what is left.
    sliding = Breaker(threshold=4, window=10, failure_ratio=0.5)
    for _ in range(4):
        sliding.record_success(NOW)
    sliding.record_failure(NOW + timedelta(seconds=5))
    sliding.record_failure(NOW + timedelta(seconds=6))  # 2 of 6
    assert sliding.state is BreakerState.CLOSED
    sliding.record_success(NOW + timedelta(seconds=11))  # the four are gone: 2 of 3
    assert sliding.state is BreakerState.CLOSED  # but 3 calls are below the minimum
    sliding.record_failure(NOW + timedelta(seconds=12))  # 3 of 4
    assert sliding.state is BreakerState.OPEN


def test_half_open_breaker_admits_at_most_its_trials_and_closes_after_they_succeed():
    breaker = Breaker(threshold=2, window=10, cooldown=30, trial_calls=3)
    breaker.trip(NOW)
    later = NOW + timedelta(seconds=30)
    admitted = [breaker.allow(later) for _ in range(10)]
    assert admitted == [True] * 3 + [False] * 7
    assert breaker.state is BreakerState.HALF_OPEN
    breaker.record_success(later)
    breaker.record_success(later)
    assert breaker.state is BreakerState.HALF_OPEN and not breaker.allow(later)
    breaker.record_success(later)
    assert breaker.state is BreakerState.CLOSED and breaker.open_until is None
    assert all(breaker.allow(later) for _ in range(10))
    # Closed with an empty window: one old-news failure does not re-open it.
    breaker.record_failure(later)
    assert breaker.state is BreakerState.CLOSED and breaker.recent_failures(later) == 1


def test_half_open_breaker_reopens_on_a_failed_trial():
    breaker = Breaker(threshold=2, window=10, cooldown=30, trial_calls=3)
    breaker.trip(NOW)
    breaker.health_ok()
    assert breaker.allow(NOW) and breaker.allow(NOW)
    breaker.record_success(NOW)
    breaker.record_failure(NOW + timedelta(seconds=1))
    assert breaker.state is BreakerState.OPEN
    assert breaker.open_until == NOW + timedelta(seconds=31)
    assert not breaker.allow(NOW + timedelta(seconds=30))
    # The next half-open period starts its trials afresh.
    again = NOW + timedelta(seconds=31)
    assert [breaker.allow(again) for _ in range(4)] == [True, True, True, False]


def test_half_open_trial_without_an_outcome_gives_its_place_back():
    breaker = Breaker(threshold=2, window=10, cooldown=30, trial_calls=1)
    breaker.trip(NOW)
    half = NOW + timedelta(seconds=30)
    assert breaker.allow(half)  # its node is never run (a lost claim, a 4xx): no report
    assert not breaker.allow(half + timedelta(seconds=29))
    assert breaker.allow(half + timedelta(seconds=30))
    breaker.record_success(half + timedelta(seconds=31))
    assert breaker.state is BreakerState.CLOSED


def test_half_open_breaker_ignores_a_success_it_did_not_let_through():
    breaker = Breaker(threshold=2, window=10, cooldown=30, trial_calls=1)
    breaker.trip(NOW)
    breaker.health_ok()
    breaker.record_success(NOW)  # a call that went out before the breaker opened
    assert breaker.state is BreakerState.HALF_OPEN


def test_failed_health_check_opens_a_closed_or_half_open_breaker():
    breaker = Breaker()
    breaker.trip(NOW)
    assert breaker.state is BreakerState.OPEN and not breaker.allow(NOW)
    breaker.health_ok()
    assert breaker.allow(NOW)
    breaker.trip(NOW + timedelta(seconds=1))  # health fails again mid-trial
    assert breaker.state is BreakerState.OPEN and not breaker.allow(NOW + timedelta(seconds=1))
    breaker.record_success(NOW + timedelta(seconds=1))  # the trial's late success
    assert breaker.state is BreakerState.OPEN


def test_state_machines_are_closed_and_match_the_protos():
    for table in (NODE_TRANSITIONS, TASK_TRANSITIONS):
        for targets in table.values():
            assert targets <= set(table)
    assert {s.to_proto() for s in NodeState} == set(range(1, 10))
    assert {s.to_proto() for s in TaskState} == set(range(1, 8))
    assert all(NodeState.from_proto(s.to_proto()) is s for s in NodeState)
    assert all(TaskState.from_proto(s.to_proto()) is s for s in TaskState)
    for state, enum in ((NodeState, common_pb2.NodeStatus), (TaskState, common_pb2.TaskStatus)):
        assert all(enum.Name(s.to_proto()).endswith(f"_STATUS_{s.name}") for s in state)
    assert NodeState.from_proto(common_pb2.NODE_STATUS_UNSPECIFIED) is NodeState.PENDING
    assert TaskState.from_proto(common_pb2.TASK_STATUS_UNSPECIFIED) is TaskState.ACCEPTED
    with pytest.raises(ValueError):
        NodeState.from_proto(99)
    with pytest.raises(ValueError):
        TaskState.from_proto(99)
