"""Pure functions over the task envelope (dispo.task.v1.Task): what a parked task is
stuck on, and the envelope a redrive publishes. No I/O here.

Redrive rule (the re-publication rule of task.proto): the copy gets ``generation + 1``
and is published on task.create with message id ``<task_id>:g<generation>``. It does not
rewrite the executor's node states: its ``redrive`` names the nodes to reset (and the
UNKNOWN nodes settled as done), and the executor applies that under its own state table,
so a node it recorded SUCCEEDED or CANCELLED is never run again.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.contracts import tasks
from dispo.libs.error_text import truncate_error
from dispo.libs.proto_enums import node_status_name
from dispo.libs.timestamps import to_timestamp
from google.protobuf.timestamp_pb2 import Timestamp

NS = common_pb2.NodeStatus
TS = common_pb2.TaskStatus
TERMINAL_TASK = frozenset(tasks.TERMINAL_TASK_STATUSES)
_HTTP = re.compile(r"HTTP (\d{3})")


def moment(value: Timestamp, fallback: datetime) -> datetime:
    return value.ToDatetime(tzinfo=UTC) if value.seconds or value.nanos else fallback


def stuck(env: task_pb2.Task) -> list[task_pb2.Node]:
    """Nodes that keep the task from finishing: FAILED, UNKNOWN or DEMOTED."""
    return [
        n
        for n in env.nodes
        if n.status in (NS.NODE_STATUS_FAILED, NS.NODE_STATUS_UNKNOWN, NS.NODE_STATUS_DEMOTED)
    ]


def unknown(env: task_pb2.Task) -> list[task_pb2.Node]:
    return [n for n in env.nodes if n.status == NS.NODE_STATUS_UNKNOWN]


def cells(env: task_pb2.Task) -> list[str]:
    return sorted({n.cell for n in env.nodes if n.cell})


def blocking_downstreams(env: task_pb2.Task) -> list[str]:
    """What the task's DEMOTED nodes wait for: downstreams, and ``queue:<name>`` for worker
    queues without a live worker (ADR-0101)."""
    return sorted(
        {
            tasks.blocker(n.spec.downstream, n.spec.queue)
            for n in env.nodes
            if n.status == NS.NODE_STATUS_DEMOTED and (n.spec.downstream or n.spec.queue)
        }
    )


def stuck_downstreams(env: task_pb2.Task) -> list[str]:
    return sorted({n.spec.downstream for n in stuck(env) if n.spec.downstream})


def first_stuck_cell(env: task_pb2.Task) -> str:
    nodes = stuck(env)
    return nodes[0].cell if nodes else (env.nodes[0].cell if env.nodes else "")


# Every class :func:`error_class` gives (what a filter may name).
ERROR_CLASSES = (
    "unknown_outcome",
    "degraded",
    "timeout",
    "connection",
    "http_408",
    "http_429",
    *(f"http_{n}xx" for n in range(1, 6)),
    "permanent",
    "other",
)


def error_class(env: task_pb2.Task) -> str:
    """A coarse class of why the task is parked, for filtering."""
    nodes = stuck(env)
    if any(n.status == NS.NODE_STATUS_UNKNOWN for n in nodes):
        return "unknown_outcome"
    if any(n.status == NS.NODE_STATUS_DEMOTED for n in nodes):
        return "degraded"
    for node in nodes:
        error = node.last_error.lower()
        if "timeout" in error:
            return "timeout"
        if "connection" in error:
            return "connection"
        match = _HTTP.search(node.last_error)
        if match:
            return (
                f"http_{match.group(1)}"
                if match.group(1) in ("408", "429")
                else f"http_{match.group(1)[0]}xx"
            )
        if node.status == NS.NODE_STATUS_FAILED and not node.retry.retryable:
            return "permanent"
    return "other"


def picture(env: task_pb2.Task) -> list[dict]:
    """The node picture kept in the failure history."""
    return [
        {
            "node_id": n.node_id,
            "status": node_status_name(n.status),
            "attempts": n.retry.attempts,
            "downstream": n.spec.downstream,
            "last_error": n.last_error,
        }
        for n in env.nodes
    ]


def _depends_on_reset(env: task_pb2.Task, reset: set[str]) -> set[str]:
    """DEPENDENCY_FAILED nodes downstream (transitively) of a node made runnable again."""
    by_id = {n.node_id: n for n in env.nodes}
    revived: set[str] = set()
    changed = True
    while changed:
        changed = False
        for node in env.nodes:
            if node.status != NS.NODE_STATUS_DEPENDENCY_FAILED or node.node_id in revived:
                continue
            if any(dep in reset or dep in revived for dep in node.depends_on if dep in by_id):
                revived.add(node.node_id)
                changed = True
    return revived


def redrive(
    env: task_pb2.Task, reason: str, *, include_permanent: bool = False
) -> tuple[task_pb2.Task, list[str]]:
    """The envelope to publish on task.create, and the node ids it asks to run again.

    The executor is asked (``redrive.reset_nodes``) to reset FAILED nodes whose short
    retries were spent (and, with ``include_permanent``, every FAILED node: a resume),
    DEMOTED nodes, and the DEPENDENCY_FAILED nodes behind them or behind a settled node:
    each becomes PENDING with a fresh short-retry round, under the executor's own table. UNKNOWN nodes are settled before a
    redrive (:func:`settle` adds them to the redrive). Node states in the copy stay as the
    executor reported them.
    """
    out = task_pb2.Task()
    out.CopyFrom(env)
    out.generation = env.generation + 1
    out.status_reason = truncate_error(reason)
    reset: set[str] = set()
    for node in out.nodes:
        if node.status == NS.NODE_STATUS_FAILED and (node.retry.retryable or include_permanent):
            reset.add(node.node_id)
        elif node.status == NS.NODE_STATUS_DEMOTED:
            reset.add(node.node_id)
    # Dependants of the nodes settled before (run again, or found done) revive too: a close
    # may have ended them DEPENDENCY_FAILED.
    revived = _depends_on_reset(
        out, reset | set(out.redrive.reset_nodes) | set(out.redrive.settled_nodes)
    )
    resumed = [n.node_id for n in out.nodes if n.node_id in reset or n.node_id in revived]
    asked = set(out.redrive.reset_nodes)
    out.redrive.reset_nodes.extend(n for n in resumed if n not in asked)
    return out, resumed


def closed(env: task_pb2.Task, reason: str, now: datetime) -> task_pb2.Task:
    """The parked task's envelope once it is closed FAILED: every node that can no longer
    run ended as ``tasks.CLOSED_NODE`` says (the rule the executor applies to its own table
    on task.close), so the final snapshot and a later resume see what the executor has."""
    out = task_pb2.Task()
    out.CopyFrom(env)
    reason = truncate_error(reason)
    for node in out.nodes:
        new = tasks.CLOSED_NODE.get(node.status)
        if new is None:
            continue
        node.retry.retryable = node.status == NS.NODE_STATUS_DEMOTED
        node.status = new
        node.last_error = tasks.closed_node_error(new, reason)
        node.finished_at.CopyFrom(to_timestamp(now))
    return out


def terminal(
    env: task_pb2.Task, status: common_pb2.TaskStatus.ValueType, reason: str, now: datetime
) -> task_pb2.Task:
    """A status snapshot that ends the task (a newer version than ``env``); like every
    status snapshot it carries node states, not payloads."""
    out = tasks.status_snapshot(env)
    out.status = status
    out.status_reason = truncate_error(reason)
    out.version = env.version + 1
    out.updated_at.CopyFrom(to_timestamp(now))
    return out


def settle(env: task_pb2.Task, node_id: str, status: NS.ValueType) -> None:
    """Record an UNKNOWN node's settlement in the reconciler's copy ``env``: SUCCEEDED, or
    PENDING to run again; the next redrive carries it to the executor (settled or reset)."""
    for node in env.nodes:
        if node.node_id == node_id and node.status == NS.NODE_STATUS_UNKNOWN:
            node.status = status
            if status == NS.NODE_STATUS_SUCCEEDED:
                env.redrive.settled_nodes.append(node_id)
                node.last_error = ""
            else:
                env.redrive.reset_nodes.append(node_id)
                node.retry.round_attempts = 0
                node.retry.retryable = False
                node.retry.ClearField("not_before")
                node.ClearField("finished_at")


def failed(env: task_pb2.Task) -> list[task_pb2.Node]:
    return [n for n in env.nodes if n.status == NS.NODE_STATUS_FAILED]
