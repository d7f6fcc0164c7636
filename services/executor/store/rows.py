"""What the executor's rows read as: a task's row, and its nodes (specs from the envelope,
state from the ``node_runs`` rows)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dispo.executor.domain import NodeRun
from dispo.executor.envelope import node_from_proto
from dispo.executor.states import NodeState, TaskState
from dispo.libs.api.task.v1 import task_pb2


@dataclass
class TaskRow:
    task_id: str
    status: TaskState
    generation: int
    version: int
    cancel_requested: bool
    lease_owner: str | None
    lease_until: datetime | None
    envelope: task_pb2.Task | None
    status_reason: str

    def leased_by_other(self, owner: str, now: datetime) -> bool:
        return (
            self.lease_owner not in (None, owner)
            and self.lease_until is not None
            and self.lease_until > now
        )


def task_from_row(row: Any) -> TaskRow:
    """A ``task_runs`` row read whole (``envelope`` decoded when it has one)."""
    env = task_pb2.Task.FromString(row.envelope) if row.envelope is not None else None
    return TaskRow(
        row.task_id,
        TaskState(row.status),
        row.generation,
        row.version,
        row.cancel_requested,
        row.lease_owner,
        row.lease_until,
        env,
        row.status_reason,
    )


def node_runs_from_rows(
    env: task_pb2.Task, rows: Mapping[str, Any], reuse: Mapping[str, NodeRun] | None = None
) -> dict[str, NodeRun]:
    """The task's nodes: specs from the envelope, state from its ``node_runs`` rows. A node
    of ``reuse`` (made from the same envelope before) is kept, its state read again from
    its row, rather than made anew from the envelope."""
    nodes: dict[str, NodeRun] = {}
    for node in env.nodes:
        row = rows.get(node.node_id)
        run = reuse.get(node.node_id) if reuse is not None and row is not None else None
        if run is None:
            run = node_from_proto(node)
        if row is not None:
            run.status = NodeState(row.status)
            run.attempts, run.round_attempts = row.attempts, row.round_attempts
            run.not_before, run.retryable = row.not_before, row.retryable
            run.last_error = row.last_error
            run.started_at, run.finished_at = row.started_at, row.finished_at
            run.output_bytes = row.output_bytes or 0
        nodes[run.node_id] = run
    return nodes
