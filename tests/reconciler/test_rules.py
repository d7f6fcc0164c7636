"""Pure rules: backoff with jitter, policy lookup, release bucket, arbitration ranking,
when a probe's answer is final, and the redrive envelope (resume from the breakpoint)."""

import random
from datetime import timedelta

from dispo.reconciler import envelope as E
from dispo.reconciler.arbitration.policy import ArbitrationPolicy, Contender, PriorityRule
from dispo.reconciler.recovery.policy import ProbeRule, ProbeVerdict, RedrivePolicy, ReleaseRate
from dispo.reconciler.recovery.release import held_by_breakers
from dispo.reconciler.settings import parse_config

from .conftest import CONFIG, NS, T0, after_redrive, envelope, node, status_of


def test_backoff_is_exponential_capped_and_jittered_within_bounds():
    policy = RedrivePolicy(base_delay=10, max_delay=100, jitter=0.5)
    rng = random.Random(1)
    for redrives, raw in [(0, 10), (1, 20), (2, 40), (3, 80), (4, 100), (9, 100)]:
        delays = [policy.delay(redrives, rng) for _ in range(200)]
        assert all(raw * 0.5 <= d <= raw * 1.5 for d in delays)
        assert max(delays) - min(delays) > raw * 0.5  # really spread, not constant
    assert RedrivePolicy(base_delay=10, jitter=0).delay(2) == 40


def test_policy_spent_by_count_or_age():
    policy = RedrivePolicy(max_redrives=2, max_age=3600)
    assert policy.spent(1, T0, T0 + timedelta(seconds=10)) is None
    assert "2 of 2" in policy.spent(2, T0, T0)
    assert "max age" in policy.spent(0, T0, T0 + timedelta(hours=2))


def test_most_specific_policy_wins():
    config = parse_config(
        {
            "redrive": {
                "default": {"max_redrives": 5},
                "rules": [
                    {"cell": "start_review", "max_redrives": 3},
                    {"business": "ecommerce", "max_redrives": 4},
                    {"business": "ecommerce", "cell": "start_review", "max_redrives": 1},
                ],
            }
        }
    )
    assert config.redrive_policy("ads", "notify_owner").max_redrives == 5
    assert config.redrive_policy("ads", "start_review").max_redrives == 3
    assert config.redrive_policy("ecommerce", "notify_owner").max_redrives == 4
    assert config.redrive_policy("ecommerce", "start_review").max_redrives == 1
    # Unset fields of a rule come from the default.
    assert (
        config.redrive_policy("ads", "start_review").base_delay == config.redrive_default.base_delay
    )


def test_release_bucket_never_exceeds_burst_and_refills_at_rate():
    rate = ReleaseRate(rate_per_second=2, burst=3)
    assert rate.refill(0, None, T0) == 1
    assert rate.refill(0, T0, T0 + timedelta(seconds=1)) == 2
    assert rate.refill(0, T0, T0 + timedelta(seconds=60)) == 3


def test_arbitration_priority_then_acceptance_time():
    policy = ArbitrationPolicy(
        priority=(PriorityRule(business="trust_safety"), PriorityRule(business="ecommerce"))
    )
    early = Contender("a", "ecommerce", "update_quality_level", T0)
    late_strong = Contender("b", "trust_safety", "update_quality_level", T0 + timedelta(seconds=5))
    ruling = policy.decide([early, late_strong])
    assert ruling.winner.task_id == "b" and [c.task_id for c in ruling.losers] == ["a"]
    assert "priority" in ruling.reason
    tie = policy.decide(
        [Contender("x", "ads", "c", T0 + timedelta(seconds=1)), Contender("y", "search", "c", T0)]
    )
    assert tie.winner.task_id == "y" and "earlier acceptance" in tie.reason
    assert (
        policy.decide([early, Contender("c", "ecommerce", "c", T0)]) is None
    )  # one business: no conflict


def test_redrive_resumes_from_the_breakpoint():
    env = envelope(
        "t",
        [
            node("a.ok", "SUCCEEDED", task_id="t"),
            node(
                "a.flaky",
                "FAILED",
                deps=("a.ok",),
                retryable=True,
                attempts=4,
                error="HTTP 503: busy",
                task_id="t",
            ),
            node("b.after", "PENDING", deps=("a.flaky",), task_id="t"),
            node("c.bad", "FAILED", retryable=False, error="HTTP 400: no", task_id="t"),
            node("c.next", "DEPENDENCY_FAILED", deps=("c.bad",), task_id="t"),
            node("d.parked", "DEMOTED", task_id="t"),
            node("e.gone", "CANCELLED", task_id="t"),
        ],
        generation=4,
    )
    out, reset = E.redrive(env, "why")
    assert out.generation == 5
    # "Reset these nodes": the executor's states are not rewritten in the copy.
    assert [status_of(out, n.node_id) for n in out.nodes] == [
        status_of(env, n.node_id) for n in env.nodes
    ]
    assert list(out.redrive.reset_nodes) == ["a.flaky", "d.parked"] == reset
    assert not out.redrive.settled_nodes
    assert after_redrive(out, "a.ok") == "SUCCEEDED" and after_redrive(out, "e.gone") == "CANCELLED"
    assert (
        after_redrive(out, "a.flaky") == "PENDING" and after_redrive(out, "d.parked") == "PENDING"
    )
    assert after_redrive(out, "c.bad") == "FAILED"
    assert after_redrive(out, "c.next") == "DEPENDENCY_FAILED"
    flaky = next(n for n in out.nodes if n.node_id == "a.flaky")
    assert flaky.retry.attempts == 4  # history kept; the executor starts a new round
    # With permanent failures included, dependents of the retried node become runnable again.
    out, reset = E.redrive(env, "why", include_permanent=True)
    assert list(out.redrive.reset_nodes) == ["a.flaky", "c.bad", "c.next", "d.parked"] == reset
    assert after_redrive(out, "c.bad") == "PENDING" and after_redrive(out, "c.next") == "PENDING"


def test_a_redrive_and_a_release_keep_the_task_s_priority():
    env = envelope("t", [("a.x", "FAILED"), ("b.y", "DEMOTED")])
    env.priority = 1
    for include_permanent in (False, True):  # a release is a redrive (ADR-0074)
        out, _ = E.redrive(env, "why", include_permanent=include_permanent)
        assert out.priority == 1


def test_error_classes():
    def cls(**kw):
        return E.error_class(envelope("t", [("a.x", kw.pop("status", "FAILED"))], **kw))

    assert cls(error="timeout after 2s") == "timeout"
    assert cls(error="connection error: refused") == "connection"
    assert cls(error="HTTP 503: busy") == "http_5xx"
    assert cls(error="HTTP 429: slow down") == "http_429"
    assert cls(status="UNKNOWN") == "unknown_outcome"
    assert cls(status="DEMOTED") == "degraded"


def test_shipped_config_parses():
    from pathlib import Path

    import yaml
    from dispo.libs.catalogue import load_catalogue
    from dispo.reconciler.settings import DEFAULT_CONFIG

    config = parse_config(yaml.safe_load(Path(DEFAULT_CONFIG).read_text()), load_catalogue())
    assert config.redrive_default.max_redrives == 5
    assert "update_quality_level" in config.arbitration.conflicts
    assert NS.NODE_STATUS_SUCCEEDED  # the enum is importable for other tests
    assert CONFIG["release"]["default"]["rate_per_second"] == 2


def test_a_probe_answer_is_final_when_done_fenced_or_past_the_effect_window():
    rule = ProbeRule(min_interval=1, max_interval=30, limit=3600)
    v = ProbeVerdict

    def at(seconds: float, done: bool | None, fenced: bool = False) -> ProbeVerdict:
        return rule.verdict(done, fenced, T0, 50, T0 + timedelta(seconds=seconds))

    assert at(0, True) is v.DONE and at(4000, True) is v.DONE  # done: final at any time
    assert at(0, False, fenced=True) is v.NOT_DONE
    assert at(49.9, False) is v.NOT_YET and at(50, False) is v.NOT_DONE
    assert at(10, None) is v.NO_ANSWER and at(10, None, fenced=True) is v.NO_ANSWER
    assert at(3599, None) is v.NO_ANSWER and at(3600, None) is v.GIVE_UP
    # A window longer than the limit: "not done" is never final, so an operator decides.
    assert rule.verdict(False, False, T0, 7200, T0 + timedelta(seconds=3600)) is v.GIVE_UP


def test_probes_come_back_sooner_for_a_node_recently_unknown_and_at_the_final_moment():
    rule = ProbeRule(min_interval=1, max_interval=30, limit=3600)

    def after(seconds: float) -> float:
        now = T0 + timedelta(seconds=seconds)
        return (rule.next_probe(T0, 50, now) - now).total_seconds()

    assert after(0) == 1  # at least min_interval
    assert after(10) == 5  # half the time UNKNOWN so far
    assert after(40) == 10  # not past the moment "not done" becomes final (50 s)
    assert after(49) == 1
    assert after(200) == 30  # at most max_interval once past it


def test_a_healthy_downstream_whose_executor_breaker_is_open_is_not_released():
    """ADR-0115: the health URL's answer, unless the executor's breaker holds it OPEN."""
    until = T0 + timedelta(seconds=30)
    held = held_by_breakers(
        ["a", "b", "c"],
        [(True, ""), (True, ""), (False, "503")],
        {"b": until, "c": None},
    )
    assert held == [
        (True, ""),
        (False, f"the executor's breaker is open until {until.isoformat()}"),
        (False, "503"),
    ]
