"""A task's history from its status snapshots: what changed from one to the next. No I/O.

The executor and the reconciler publish the whole task (every node's state) at each change
of it; an event of ListTaskEvents is one such snapshot, with the task's status and the
nodes that differ from the snapshot before it (status, attempts or last error).
"""

from __future__ import annotations

from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.gateway.v1 import gateway_pb2
from dispo.libs.api.task.v1 import task_pb2


def node_changes(
    previous: task_pb2.Task | None, current: task_pb2.Task
) -> list[gateway_pb2.NodeChange]:
    """The nodes of ``current`` whose status, attempts or last error differ from
    ``previous`` (every node when there is no snapshot before), in ``current``'s order; each
    with its last error when that is new in ``current`` (a failure), else none."""
    before = {n.node_id: n for n in previous.nodes} if previous is not None else {}
    changes = []
    for node in current.nodes:
        old = before.get(node.node_id)
        old_status = old.status if old is not None else common_pb2.NODE_STATUS_UNSPECIFIED
        old_attempts = old.retry.attempts if old is not None else 0
        if (
            old is not None
            and old_status == node.status
            and old_attempts == node.retry.attempts
            and old.last_error == node.last_error
        ):
            continue
        changes.append(
            gateway_pb2.NodeChange(
                node_id=node.node_id,
                old_status=old_status,
                new_status=node.status,
                old_attempts=old_attempts,
                new_attempts=node.retry.attempts,
                last_error=node.last_error
                if old is None or old.last_error != node.last_error
                else "",
            )
        )
    return changes


def task_event(
    previous: task_pb2.Task | None, current: task_pb2.Task, *, sequence: int, publisher: str
) -> gateway_pb2.TaskEvent:
    """The event of snapshot ``current`` (stored at ``sequence``), after ``previous``; its
    time is the caller's to set (when the stream stored it)."""
    return gateway_pb2.TaskEvent(
        sequence=sequence,
        version=current.version,
        publisher=publisher,
        status=current.status,
        status_reason=current.status_reason,
        previous_status=previous.status
        if previous is not None
        else common_pb2.TASK_STATUS_UNSPECIFIED,
        changes=node_changes(previous, current),
    )
