"""The node and task state machines, declared once. Every guarded write checks its move
against these tables first (``store``). The database mirrors the enums with the CHECK
constraints listed in ``CHECKED_COLUMNS``; ``tests/executor/test_store.py`` compares
the migrated schema with the enums, so a state added here without a migration fails it.
Stored values are the member names in lower case; the protos carry the same names
upper-case with their type prefix, converted by name (ADR 0017).

Which component moves a node *out* of each state:

- PENDING: the executor (claims it → RUNNING; or DEPENDENCY_FAILED / DEMOTED / CANCELLED).
- RUNNING: the executor that claimed it (→ SUCCEEDED / FAILED / PENDING for a short retry;
  → UNKNOWN when the call's outcome is ambiguous, see ``failures``; → DEMOTED when its worker
  run was never taken, its queue without a live worker); after a crash, the next executor
  taking the task's lease (→ UNKNOWN).
- UNKNOWN: the executor re-runs it (→ PENDING) only if its action is idempotent; otherwise
  the reconciler settles it by its probe (a redrive with SUCCEEDED or PENDING).
- FAILED: terminal when permanent; a retry-exhausted node (retry.retryable) goes back to
  PENDING only by a reconciler redrive.
- DEMOTED: the reconciler releases it (redrive → PENDING) when its downstream is healthy
  (a worker action's: when its queue has a live worker again);
  a task.close (the reconciler gave up on the parked task) ends it FAILED.
- DEPENDENCY_FAILED: terminal for the executor; an operator's redrive that also resets the
  failed dependency makes it PENDING again. A task.close ends a parked task's PENDING
  nodes here (they wait for a dependency that will not succeed now).
- WAITING: a wait node parked by the step that found it ready (ADR-0102): a signal
  (task.signal) makes it SUCCEEDED with the signal's payload as its output; the timeout
  sweep makes it FAILED (``on_timeout: fail``) or SUCCEEDED with its default output; a
  cancel, or a task.close of its parked task, CANCELLED. A redrive leaves it waiting.
- SUCCEEDED, CANCELLED: terminal; no message changes them.

A task is moved by the executor's passes; RETRY_EXHAUSTED and DEMOTED wait for the
reconciler (a redrive → RUNNING, a task.close → FAILED); FAILED has ended, and only a
redrive the reconciler sends when an operator resumes it (RedriveTask) makes it RUNNING
again (ADR 0033).
"""

from __future__ import annotations

import enum

from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.proto_enums import from_short_name
from dispo.libs.states import EnumCheck, Transitions


class NodeState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"
    DEPENDENCY_FAILED = "dependency_failed"
    DEMOTED = "demoted"
    CANCELLED = "cancelled"
    WAITING = "waiting"

    def to_proto(self) -> common_pb2.NodeStatus.ValueType:
        return _NODE_TO_PROTO[self]

    @classmethod
    def from_proto(cls, value: common_pb2.NodeStatus.ValueType) -> NodeState:
        """ValueError for a value the enum does not have; UNSPECIFIED is PENDING."""
        found = _NODE_FROM_PROTO.get(value)
        if found is None:
            raise ValueError(f"unknown NodeStatus {value}")
        return found


N = NodeState
NODE_TRANSITIONS = Transitions[NodeState](
    "node",
    {
        N.PENDING: frozenset({N.RUNNING, N.DEPENDENCY_FAILED, N.DEMOTED, N.CANCELLED, N.WAITING}),
        N.WAITING: frozenset({N.SUCCEEDED, N.FAILED, N.CANCELLED}),
        # → DEMOTED: a worker run never taken, its queue without a live worker (ADR-0101).
        N.RUNNING: frozenset({N.SUCCEEDED, N.FAILED, N.PENDING, N.UNKNOWN, N.DEMOTED}),
        N.UNKNOWN: frozenset({N.PENDING, N.SUCCEEDED, N.FAILED, N.CANCELLED}),
        N.FAILED: frozenset({N.PENDING, N.CANCELLED}),
        N.DEMOTED: frozenset({N.PENDING, N.CANCELLED, N.FAILED}),
        N.SUCCEEDED: frozenset(),
        N.DEPENDENCY_FAILED: frozenset({N.PENDING}),
        N.CANCELLED: frozenset(),
    },
)
# States nothing ever changes again (not even a redrive).
NODE_FINAL = NODE_TRANSITIONS.final


class TaskState(enum.StrEnum):
    ACCEPTED = "accepted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RETRY_EXHAUSTED = "retry_exhausted"
    DEMOTED = "demoted"

    def to_proto(self) -> common_pb2.TaskStatus.ValueType:
        return _TASK_TO_PROTO[self]

    @classmethod
    def from_proto(cls, value: common_pb2.TaskStatus.ValueType) -> TaskState:
        """ValueError for a value the enum does not have; UNSPECIFIED is ACCEPTED."""
        found = _TASK_FROM_PROTO.get(value)
        if found is None:
            raise ValueError(f"unknown TaskStatus {value}")
        return found


# The proto values of each state by name, looked up once: every snapshot converts each
# node's state, and a lookup through the enum's descriptor cost more than the rest of it.
_NODE_TO_PROTO = {s: from_short_name(common_pb2.NodeStatus, s.name) for s in NodeState}
_NODE_FROM_PROTO = {v: s for s, v in _NODE_TO_PROTO.items()} | {
    common_pb2.NODE_STATUS_UNSPECIFIED: NodeState.PENDING
}
_TASK_TO_PROTO = {s: from_short_name(common_pb2.TaskStatus, s.name) for s in TaskState}
_TASK_FROM_PROTO = {v: s for s, v in _TASK_TO_PROTO.items()} | {
    common_pb2.TASK_STATUS_UNSPECIFIED: TaskState.ACCEPTED
}


T = TaskState
TASK_TRANSITIONS = Transitions[TaskState](
    "task",
    {
        T.ACCEPTED: frozenset({T.RUNNING, T.CANCELLED}),
        # RUNNING → RUNNING: a short retry re-published the task.
        T.RUNNING: frozenset(
            {T.RUNNING, T.SUCCEEDED, T.FAILED, T.CANCELLED, T.RETRY_EXHAUSTED, T.DEMOTED}
        ),
        # Parked with the reconciler until a redrive (→ RUNNING), a cancel, or a task.close
        # when the reconciler gives up (→ FAILED).
        T.RETRY_EXHAUSTED: frozenset({T.RUNNING, T.CANCELLED, T.FAILED}),
        T.DEMOTED: frozenset({T.RUNNING, T.CANCELLED, T.FAILED}),
        T.SUCCEEDED: frozenset(),
        # Ended; an operator's resume through the reconciler (a redrive) reopens it.
        T.FAILED: frozenset({T.RUNNING}),
        T.CANCELLED: frozenset(),
    },
)
# States nothing changes again.
TASK_FINAL = TASK_TRANSITIONS.final
# States a task has ended in: no pass opens it, except a redrive of a FAILED one (a resume).
TASK_ENDED = TASK_FINAL | {T.FAILED}

CHECKED_COLUMNS = (
    EnumCheck("task_runs", "status", "ck_task_run_status", TaskState),
    EnumCheck("node_runs", "status", "ck_node_run_status", NodeState),
)
