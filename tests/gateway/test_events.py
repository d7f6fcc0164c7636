"""What one status snapshot changed since the one before (dispo.gateway.events)."""

from dispo.gateway.events import node_changes, task_event
from dispo.libs.api.common.v1 import common_pb2 as c
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.contracts import tasks


def snapshot(version: int, status: int, *nodes: tuple[str, int, int, str]) -> task_pb2.Task:
    task = task_pb2.Task(task_id="t1", version=version, status=status)
    for node_id, node_status, attempts, error in nodes:
        node = task.nodes.add(node_id=node_id, status=node_status, last_error=error)
        node.retry.attempts = attempts
    return task


def changes(previous: task_pb2.Task | None, current: task_pb2.Task) -> list[tuple]:
    return [
        (n.node_id, n.old_status, n.new_status, n.old_attempts, n.new_attempts, n.last_error)
        for n in node_changes(previous, current)
    ]


FIRST = snapshot(1, c.TASK_STATUS_RUNNING, ("a", c.NODE_STATUS_RUNNING, 1, ""), ("b", 1, 0, ""))


def test_the_first_snapshot_shows_every_node_from_nothing():
    assert changes(None, FIRST) == [
        ("a", c.NODE_STATUS_UNSPECIFIED, c.NODE_STATUS_RUNNING, 0, 1, ""),
        ("b", c.NODE_STATUS_UNSPECIFIED, c.NODE_STATUS_PENDING, 0, 0, ""),
    ]


def test_only_the_nodes_whose_status_attempts_or_error_moved_are_changes():
    retried = snapshot(
        2,
        c.TASK_STATUS_RUNNING,
        ("a", c.NODE_STATUS_PENDING, 1, "refused: HTTP 503"),
        ("b", c.NODE_STATUS_PENDING, 0, ""),
    )
    assert changes(FIRST, retried) == [
        ("a", c.NODE_STATUS_RUNNING, c.NODE_STATUS_PENDING, 1, 1, "refused: HTTP 503")
    ]
    again = snapshot(
        3,
        c.TASK_STATUS_RUNNING,
        ("a", c.NODE_STATUS_PENDING, 2, "refused: HTTP 503"),
        ("b", c.NODE_STATUS_PENDING, 0, ""),
    )
    assert changes(retried, again) == [  # an attempt more, the same error not said again
        ("a", c.NODE_STATUS_PENDING, c.NODE_STATUS_PENDING, 1, 2, "")
    ]
    other_error = snapshot(
        4,
        c.TASK_STATUS_RUNNING,
        ("a", c.NODE_STATUS_PENDING, 2, "timed out"),
        ("b", c.NODE_STATUS_PENDING, 0, ""),
    )
    assert changes(again, other_error) == [
        ("a", c.NODE_STATUS_PENDING, c.NODE_STATUS_PENDING, 2, 2, "timed out")
    ]
    assert changes(other_error, other_error) == []


def test_a_node_missing_before_is_new():
    grown = snapshot(2, c.TASK_STATUS_RUNNING, *[(n.node_id, n.status, 1, "") for n in FIRST.nodes])
    grown.nodes.add(node_id="c", status=c.NODE_STATUS_PENDING)
    assert changes(FIRST, grown)[-1] == (
        "c",
        c.NODE_STATUS_UNSPECIFIED,
        c.NODE_STATUS_PENDING,
        0,
        0,
        "",
    )


def test_an_event_carries_the_snapshot_and_the_status_before():
    done = snapshot(2, c.TASK_STATUS_FAILED, ("a", c.NODE_STATUS_FAILED, 1, "400"), ("b", 1, 0, ""))
    done.status_reason = "a failed"
    event = task_event(FIRST, done, sequence=9, publisher="reconciler")
    assert (event.sequence, event.version, event.publisher, event.status_reason) == (
        9,
        2,
        "reconciler",
        "a failed",
    )
    assert (event.previous_status, event.status) == (c.TASK_STATUS_RUNNING, c.TASK_STATUS_FAILED)
    assert [n.node_id for n in event.changes] == ["a"]
    first = task_event(None, FIRST, sequence=1, publisher="executor")
    assert first.previous_status == c.TASK_STATUS_UNSPECIFIED


def test_the_publisher_is_read_from_the_message_id():
    assert tasks.status_publisher("t1", tasks.status_id("t1", 3)) == "executor"
    assert tasks.status_publisher("t1", tasks.status_id("t1", 3, "reconciler")) == "reconciler"
    assert tasks.status_publisher("t1", tasks.status_id("t2", 3)) == ""
    assert tasks.status_publisher("t1", "t1:cancel") == ""
    assert tasks.status_publisher("t1", "") == ""
