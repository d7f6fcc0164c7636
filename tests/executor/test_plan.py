"""The pass's decisions without a database (:mod:`dispo.executor.plan`): how a message is
opened, what a round of a step does to a task's nodes, how a task settles."""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from dispo.executor import plan
from dispo.executor.breaker import Breaker
from dispo.executor.domain import ActionSpec, Next, NodeRun
from dispo.executor.states import NodeState, TaskState
from dispo.libs.bus import ACK, Nak
from dispo.libs.contracts import tasks

NOW = datetime(2026, 1, 1, tzinfo=UTC)
S = NodeState


@dataclass
class Row:
    generation: int
    status: TaskState
    lease_owner: str | None = None
    lease_until: datetime | None = None

    def leased_by_other(self, owner: str, now: datetime) -> bool:
        return (
            self.lease_owner not in (None, owner)
            and self.lease_until is not None
            and self.lease_until > now
        )


def node(node_id, *deps, kind="http", downstream="d", status=S.PENDING):
    return NodeRun(node_id, deps, ActionSpec(kind, downstream), f"t/{node_id}", status)


def test_an_opening_is_batched_answered_at_once_or_taken_on_its_own():
    running = Row(3, TaskState.RUNNING)
    assert plan.classify(3, "me", running, False, NOW, 5) is plan.OpenPath.FAST
    assert plan.classify(3, "me", None, False, NOW, 5) is plan.OpenPath.SLOW
    assert plan.classify(3, "me", running, True, NOW, 5) is plan.OpenPath.SLOW  # no envelope
    assert plan.classify(4, "me", running, False, NOW, 5) is plan.OpenPath.SLOW  # a redrive
    assert plan.classify(3, "me", Row(3, TaskState.CANCELLED), False, NOW, 5) is plan.OpenPath.SLOW
    stale = plan.classify(2, "me", running, False, NOW, 5)
    assert stale == plan.Answered(ACK, "stale task.create dropped")
    ended = plan.classify(3, "me", Row(3, TaskState.SUCCEEDED), False, NOW, 5)
    assert ended.disposition == ACK
    # Another pass's lease: back when it would expire, within the lease's length.
    held = Row(3, TaskState.RUNNING, "other", NOW + timedelta(seconds=2))
    assert plan.classify(3, "me", held, False, NOW, 5).disposition == Nak(delay=2.0)
    far = Row(3, TaskState.RUNNING, "other", NOW + timedelta(seconds=60))
    assert plan.classify(3, "me", far, False, NOW, 5).disposition == Nak(delay=5)
    expired = Row(3, TaskState.RUNNING, "other", NOW)
    assert plan.classify(3, "me", expired, False, NOW, 5) is plan.OpenPath.FAST


def test_a_round_dooms_cancels_demotes_and_launches_moving_the_nodes_it_writes():
    nodes = {
        "a": node("a", status=S.FAILED),
        "b": node("b", "a"),
        "c": node("c"),
        "n": node("n", kind="noop", downstream=""),
        "x": node("x", downstream="down"),
        "r": node("r"),
    }
    breakers = {"down": Breaker(threshold=1, window=60, cooldown=60)}
    breakers["down"].record_failure(NOW)
    round_ = plan.plan_round("t", nodes, False, (), ("r",), breakers, NOW)
    assert [n.node_id for n in round_.launch] == ["c"]  # r: attempted in this pass
    assert [n.node_id for n in round_.noops] == ["n"]
    assert [n.node_id for n in round_.demoted] == ["x"]
    assert [(c.node_id, c.expected, c.new, c.owner) for c, _ in round_.writes] == [
        ("b", S.PENDING, S.DEPENDENCY_FAILED, None),
        ("x", S.PENDING, S.DEMOTED, None),
    ]
    assert nodes["b"].status is S.DEPENDENCY_FAILED and nodes["b"].finished_at == NOW
    assert nodes["x"].last_error.startswith("not sent: downstream down degraded")

    cancelled = {"a": node("a"), "b": node("b"), "c": node("c")}
    round_ = plan.plan_round("t", cancelled, True, ("b",), (), {}, NOW)
    assert round_.launch == [] and round_.noops == []  # nothing starts once cancelled
    assert [c.node_id for c, _ in round_.writes] == ["a", "c"]  # b is under way
    assert cancelled["a"].status is S.CANCELLED and cancelled["b"].status is S.PENDING


def test_a_settling_task_finishes_retries_demotes_or_goes_to_the_reconciler():
    def settling(nodes, ran=1, changed=True):
        return plan.Settling("t", "me", nodes, False, 4, ran, changed)

    done = plan.settle(settling({"a": node("a", status=S.SUCCEEDED)}), NOW)
    assert (done.write.status, done.disposition, done.event) == (TaskState.SUCCEEDED, ACK, None)
    assert done.write.emit and not done.write.bump

    backoff = node("a")
    backoff.not_before = NOW + timedelta(seconds=2)
    retry = plan.settle(settling({"a": backoff}), NOW)
    assert (retry.next, retry.write.bump) == (Next.RETRY, True)
    assert retry.event == (tasks.TASK_CREATE, tasks.create_id("t", 5))  # the next generation
    early = plan.settle(settling({"a": backoff}, ran=0, changed=False), NOW)
    assert early.disposition == Nak(delay=2.0) and early.event is None
    assert early.write == plan.TaskWrite("t", "me")  # released, no status, no event

    parked = plan.settle(settling({"a": node("a", status=S.DEMOTED)}), NOW)
    assert parked.event == (tasks.TASK_DEMOTE, tasks.demote_id("t", 4))
    unknown = plan.settle(settling({"a": node("a", status=S.UNKNOWN)}), NOW)
    assert (unknown.write.status, unknown.event) == (
        TaskState.RETRY_EXHAUSTED,
        (tasks.TASK_FAIL, tasks.fail_id("t", 4)),
    )
    failed = node("a", status=S.FAILED)
    ended = plan.settle(settling({"a": failed}), NOW)
    assert ended.write.status is TaskState.FAILED and ended.event[0] == tasks.TASK_FAIL
