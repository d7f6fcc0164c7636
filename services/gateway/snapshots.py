"""What the gateway takes from the bus as a task's status snapshot. No I/O.

A snapshot on ``task.status.<task_id>.<status>`` comes from a process holding a service's
bus credentials, and is checked here as strictly as a Submit is before the view takes it:
its sizes by Submit's own :class:`~dispo.gateway.expand.Limits` (nodes, payloads,
idempotency key), its task id as Submit makes them, every enum number declared (as the
request hygiene of :mod:`dispo.libs.validation` requires of a request), no negative count,
times a datetime can hold, and its version and generation within :data:`MAX_COUNTER`. A
snapshot refused here is refused at once (the consumer terminates it into the quarantine),
never retried. The checks are written out for the fields a snapshot has rather than by the
descriptor walk a request gets: every status event passes here, and the walk costs some
twenty times the event's parse.

That a terminal view is never taken to another status is the view's own guard, in its
``UPDATE`` (:func:`dispo.gateway.store.tasks_apply_snapshots`).
"""

from __future__ import annotations

import re
from typing import Any

from dispo.gateway.expand import Limits
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.validation import MAX_TIMESTAMP_SECONDS, MIN_TIMESTAMP_SECONDS, NANOS_PER_SECOND

# The largest version and generation a snapshot may carry. A task's version grows by one
# per change and its generation by one per redrive: no task comes near this, and a larger
# one (2^62) would hold its view against every real snapshot after it.
MAX_COUNTER = 2**31 - 1
# What Submit makes a task id: one token of a status subject (no dots, no wildcards).
_TASK_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TASK_STATUSES = frozenset(common_pb2.TaskStatus.values()) - {common_pb2.TASK_STATUS_UNSPECIFIED}
_NODE_STATUSES = frozenset(common_pb2.NodeStatus.values())


def _time_problem(stamp: Any) -> bool:
    return not (
        MIN_TIMESTAMP_SECONDS <= stamp.seconds <= MAX_TIMESTAMP_SECONDS
        and 0 <= stamp.nanos < NANOS_PER_SECOND
    )


def snapshot_problem(env: task_pb2.Task, limits: Limits) -> str | None:
    """Why ``env`` is not a status snapshot the view may take (None when it is)."""
    if not _TASK_ID.fullmatch(env.task_id):
        return "task_id: must be 1 to 64 letters, digits, '_' or '-'"
    if not 1 <= env.version <= MAX_COUNTER:
        return f"version: must be in 1..{MAX_COUNTER}"
    if not 0 <= env.generation <= MAX_COUNTER:
        return f"generation: must be in 0..{MAX_COUNTER}"
    if env.status not in _TASK_STATUSES:
        return f"status: {env.status} is not a task status"
    if len(env.idempotency_key) > limits.max_key_length:
        return f"idempotency_key: longer than {limits.max_key_length} characters"
    if _time_problem(env.created_at) or _time_problem(env.updated_at):
        return "created_at, updated_at: must be times between 0001-01-01 and 9999-12-31"
    if not 1 <= len(env.nodes) <= limits.max_nodes:
        return f"nodes: {len(env.nodes)}, must be 1..{limits.max_nodes} (max_nodes)"
    if len(env.payloads) > limits.max_cells:
        return f"payloads: {len(env.payloads)}, more than {limits.max_cells} (max_cells)"
    for ref, payload in env.payloads.items():
        if len(payload.data) > limits.max_payload_bytes:
            return f"payloads[{ref!r}]: larger than {limits.max_payload_bytes} bytes"
    seen: set[str] = set()
    for i, node in enumerate(env.nodes):
        problem = _node_problem(node, seen)
        if problem is not None:
            return f"nodes[{i}].{problem}"
        seen.add(node.node_id)
    return None


def _node_problem(node: task_pb2.Node, seen: set[str]) -> str | None:
    if not node.node_id or node.node_id in seen:
        return "node_id: missing or repeated"
    if node.status not in _NODE_STATUSES:
        return f"status: {node.status} is not a node status"
    retry = node.retry
    if retry.attempts < 0 or retry.round_attempts < 0:
        return "retry: attempts must not be negative"
    if _time_problem(node.started_at) or _time_problem(node.finished_at):
        return "started_at, finished_at: must be times between 0001-01-01 and 9999-12-31"
    if _time_problem(retry.not_before):
        return "retry.not_before: must be a time between 0001-01-01 and 9999-12-31"
    return None


__all__ = ["MAX_COUNTER", "snapshot_problem"]
