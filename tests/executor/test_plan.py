"""The pass's decisions without a database (:mod:`dispo.executor.plan`): how a message is
opened, what a round of a step does to a task's nodes, how a task settles."""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from dispo.executor import plan, waits
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


def test_an_opening_is_opened_redriven_cancelled_or_answered_at_once():
    running = Row(3, TaskState.RUNNING)
    assert plan.classify(3, "me", running, False, NOW, 5) is plan.OpenPath.OPEN
    assert plan.classify(3, "me", None, False, NOW, 5) == plan.Answered(
        Nak(delay=1.0), "task not recorded; later"
    )
    # Recorded without its envelope: a cancel arrived first.
    assert plan.classify(3, "me", running, True, NOW, 5) is plan.OpenPath.CANCELLED
    assert plan.classify(4, "me", running, False, NOW, 5) is plan.OpenPath.REDRIVE
    cancelled = Row(3, TaskState.CANCELLED)
    assert plan.classify(3, "me", cancelled, False, NOW, 5) is plan.OpenPath.CANCELLED
    assert plan.classify(4, "me", cancelled, False, NOW, 5) is plan.OpenPath.CANCELLED  # final
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
    assert plan.classify(3, "me", expired, False, NOW, 5) is plan.OpenPath.OPEN


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


def test_past_its_deadline_a_round_closes_the_open_nodes_and_the_task_ends_failed():
    """ADR-0103: the open nodes (pending, demoted, a retryable failure) are closed with the
    error "deadline reached" and nothing more is launched; a node under way is left to
    finish, an UNKNOWN one stays UNKNOWN; the task settles FAILED, "deadline reached"."""
    retryable = node("f", status=S.FAILED)
    retryable.retryable = True
    nodes = {
        "a": node("a"),
        "b": node("b", "a"),
        "d": node("d", status=S.DEMOTED),
        "f": retryable,
        "u": node("u", status=S.UNKNOWN),
        "w": node("w"),
        "s": node("s", status=S.SUCCEEDED),
    }
    round_ = plan.plan_round("t", nodes, False, ("w",), (), {}, NOW, deadline_passed=True)
    assert round_.launch == [] and round_.noops == []
    assert [(c.node_id, c.expected, c.new) for c, _ in round_.writes] == [
        ("a", S.PENDING, S.CANCELLED),
        ("b", S.PENDING, S.CANCELLED),
        ("d", S.DEMOTED, S.CANCELLED),
        ("f", S.FAILED, S.CANCELLED),
    ]
    assert all(c.fields["last_error"] == "deadline reached" for c, _ in round_.writes)
    assert nodes["u"].status is S.UNKNOWN and nodes["w"].status is S.PENDING

    del nodes["w"]  # its call ended: recorded, it would be SUCCEEDED
    closed = plan.settle(plan.Settling("t", "me", nodes, False, 4, 1, True, True), NOW)
    assert (closed.write.status, closed.write.reason) == (TaskState.FAILED, "deadline reached")
    assert closed.event == (tasks.TASK_FAIL, tasks.fail_id("t", 4))
    succeeded = {"s": node("s", status=S.SUCCEEDED)}
    late = plan.settle(plan.Settling("t", "me", succeeded, False, 4, 1, True, True), NOW)
    assert late.write.status is TaskState.SUCCEEDED  # done is done, deadline or not


def test_a_redrive_resets_what_may_run_again_and_settles_only_unknown_nodes():
    here = {
        "failed": S.FAILED,
        "demoted": S.DEMOTED,
        "done": S.SUCCEEDED,
        "cancelled": S.CANCELLED,
        "running": S.RUNNING,
        "unknown": S.UNKNOWN,
        "probed": S.UNKNOWN,
        "pending": S.PENDING,
    }
    resets = ["failed", "demoted", "done", "cancelled", "running", "unknown", "absent"]
    changes = plan.redrive_changes("t", resets, ["probed", "failed", "unknown"], here)
    fresh = {"round_attempts": 0, "retryable": False, "not_before": None, "finished_at": None}
    assert changes == [
        plan.NodeChange("t", "failed", S.FAILED, S.PENDING, None, fresh),
        plan.NodeChange("t", "demoted", S.DEMOTED, S.PENDING, None, fresh),
        # SUCCEEDED and CANCELLED are final; a RUNNING node is crash recovery's.
        plan.NodeChange("t", "unknown", S.UNKNOWN, S.PENDING, None, fresh),
        # Settled only from UNKNOWN, and a node reset above is no longer UNKNOWN.
        plan.NodeChange("t", "probed", S.UNKNOWN, S.SUCCEEDED, None, {"last_error": ""}),
    ]
    assert here["unknown"] is S.UNKNOWN  # the recorded states are read, not changed


def test_an_interrupted_call_is_unknown_or_run_again_under_its_key_if_idempotent():
    once = NodeRun("a.once", (), ActionSpec("http", "d", idempotent=False), "t/a.once", S.RUNNING)
    again = NodeRun("a.again", (), ActionSpec("http", "d", idempotent=True), "t/a.again", S.RUNNING)
    later = NOW + timedelta(seconds=3)

    unknown = plan.unknown_change("t", once, NOW, "timeout", owner="me", not_before=later)
    assert (unknown.expected, unknown.new, unknown.owner) == (S.RUNNING, S.UNKNOWN, "me")
    assert unknown.fields == {
        "last_error": "outcome unknown until settled (status probe or operator): timeout",
        "finished_at": NOW,
    }
    rerun = plan.unknown_change("t", again, NOW, "timeout", owner="me", not_before=later)
    assert (rerun.expected, rerun.new, rerun.owner) == (S.RUNNING, S.PENDING, "me")
    assert rerun.fields == {
        "last_error": "re-run under the same idempotency key (idempotent): timeout",
        "not_before": later,
        "retryable": True,
    }
    # Found RUNNING by the next pass: no owner to guard by, and an idempotent one at once.
    nodes = {n.node_id: n for n in (once, again, node("a.idle"))}
    recovered = plan.recover_changes("t", nodes, NOW)
    assert [(c.node_id, c.new, c.owner) for c in recovered] == [
        ("a.once", S.UNKNOWN, None),
        ("a.again", S.PENDING, None),
    ]
    assert "not_before" not in recovered[1].fields


def wait_node(node_id, *deps, status=S.PENDING, on_timeout="fail", default=b""):
    spec = ActionSpec(
        "wait",
        signal="verdict",
        timeout_seconds=60,
        on_timeout=on_timeout,
        default_output=default,
        output_fields=(("verdict", "string", True),),
    )
    return NodeRun(node_id, deps, spec, f"t/{node_id}", status)


def test_a_ready_wait_node_is_parked_and_a_task_with_only_waits_left_ends_its_pass():
    nodes = {"w": wait_node("w"), "after": node("after", "w")}
    round_ = plan.plan_round("t", nodes, False, (), (), {}, NOW)
    assert (round_.waits, round_.launch, round_.noops) == ([nodes["w"]], [], [])
    change = waits.park("t", nodes["w"], NOW)
    assert (change.expected, change.new) == (S.PENDING, S.WAITING)
    assert change.fields["not_before"] == NOW + timedelta(seconds=60)

    nodes["w"].status = S.WAITING
    parked = plan.settle(plan.Settling("t", "me", nodes, False, 4, 1, True), NOW)
    # Still RUNNING, its lease released, its message answered; no event but its status.
    assert (parked.next, parked.write.status, parked.write.bump) == (
        Next.WAIT,
        TaskState.RUNNING,
        False,
    )
    assert (parked.disposition, parked.event) == (ACK, None)
    # An outcome left unknown elsewhere goes to the reconciler first, waits or not.
    nodes["other"] = node("other", status=S.UNKNOWN)
    assert plan.settle(plan.Settling("t", "me", nodes, False, 4, 1, True), NOW).next is Next.FAIL


def test_a_signal_or_a_timeout_ends_a_wait_and_a_redrive_never_makes_one_wait_again():
    waiting = wait_node("w", status=S.WAITING)
    taken = waits.signalled("t", waiting, b'{"verdict":"approved"}', NOW)
    assert (taken.new, taken.fields["output"]) == (S.SUCCEEDED, b'{"verdict":"approved"}')
    mistyped = waits.signalled("t", waiting, b'{"verdict":1}', NOW)
    assert mistyped.new is S.FAILED and "verdict: must be string" in mistyped.fields["last_error"]

    failed = waits.timed_out("t", waiting, NOW)
    assert (failed.new, failed.fields["last_error"]) == (
        S.FAILED,
        "no signal 'verdict' within 60 s",
    )
    lenient = wait_node("w", status=S.WAITING, on_timeout="succeed", default=b'{"verdict":"ok"}')
    succeeded = waits.timed_out("t", lenient, NOW)
    assert (succeeded.new, succeeded.fields["output"]) == (S.SUCCEEDED, b'{"verdict":"ok"}')

    # A redrive (or a resume) leaves a waiting node waiting and a signalled one SUCCEEDED.
    here = {"waiting": S.WAITING, "signalled": S.SUCCEEDED}
    assert plan.redrive_changes("t", ["waiting", "signalled"], [], here) == []


def test_each_waiting_node_takes_the_oldest_signal_of_its_name_one_each():
    first, second = wait_node("a", status=S.WAITING), wait_node("b", status=S.WAITING)
    signals = [
        waits.Signal("t", "s1", "other", b"{}"),
        waits.Signal("t", "s2", "verdict", b'{"verdict":"x"}'),
        waits.Signal("t", "s3", "verdict", b'{"verdict":"y"}'),
    ]
    pairs = waits.match([first, second], signals)
    assert [(n.node_id, s.signal_id) for n, s in pairs] == [("a", "s2"), ("b", "s3")]
