"""The executor's decisions for a pass, with no I/O: how to open a task message
(:func:`classify`), what one round of a step does to a task's nodes (:func:`plan_round`)
and what happens to a task once nothing more can run (:func:`settle`).

:mod:`dispo.executor.passes` reads the rows (:mod:`dispo.executor.store`), calls these and writes what they say; the
rules they apply are :mod:`dispo.executor.domain`'s. Time is a parameter (``now``); the
downstreams' breakers are read (and a half-open one's trial calls taken) as they stand.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from dispo.executor.breaker import Breaker
from dispo.executor.domain import (
    DEADLINE_REACHED,
    Next,
    NodeRun,
    blocked_by_failure,
    decide,
    ready,
    to_close,
)
from dispo.executor.failures import CallOutcome, failure_text
from dispo.executor.states import NODE_TRANSITIONS, TASK_ENDED, TASK_FINAL, NodeState, TaskState
from dispo.libs.bus import ACK, Disposition, Nak
from dispo.libs.contracts import tasks
from dispo.libs.error_text import truncate_error

# A task's (id, node id): the key of a node run.
NodeKey = tuple[str, str]


@dataclass(frozen=True)
class NodeChange:
    """One guarded node write: ``expected`` → ``new`` (and ``fields``), by ``owner`` when the
    node is RUNNING under a claim."""

    task_id: str
    node_id: str
    expected: NodeState
    new: NodeState
    owner: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> NodeKey:
        return (self.task_id, self.node_id)


@dataclass(frozen=True)
class TaskStatusChange:
    """One guarded task move from one of ``expected`` to ``new``, with its reason."""

    task_id: str
    expected: tuple[TaskState, ...]
    new: TaskState
    reason: str = ""


@dataclass(frozen=True)
class TaskWrite:
    """A step's write of one task row as its pass ends, under ``owner``'s lease: release the
    lease and, unless ``status`` is None, move the task from RUNNING to ``status`` (with a
    new generation if ``bump``); with ``emit``, take a new version for the status event
    written with it. (A task that goes on running is not written: its progress is published
    on its own, ADR-0059.)"""

    task_id: str
    owner: str
    status: TaskState | None = None
    reason: str = ""
    bump: bool = False
    emit: bool = False


# ---- opening ----------------------------------------------------------------------------
class OpenPath(enum.Enum):
    """How a task recorded before is opened (each with the others of its batch)."""

    OPEN = "open"  # leased, its interrupted nodes recovered, stepped
    REDRIVE = "redrive"  # a newer generation: its redrive applied first, then opened
    CANCELLED = "cancelled"  # its pending nodes cancelled (and its envelope recorded
    # first when the cancel arrived before it), nothing run


class Recorded(Protocol):
    """What an opening reads of a task's row (:class:`~dispo.executor.store.rows.TaskRow`)."""

    @property
    def generation(self) -> int: ...
    @property
    def status(self) -> TaskState: ...
    @property
    def lease_until(self) -> datetime | None: ...
    def leased_by_other(self, owner: str, now: datetime) -> bool: ...


@dataclass(frozen=True)
class Answered:
    """An opening answered at once, with why (for the log)."""

    disposition: Disposition
    why: str


def classify(
    generation: int, owner: str, row: Recorded | None, bare: bool, now: datetime, lease_ttl: float
) -> OpenPath | Answered:
    """How to open a task message of ``generation`` for ``owner``, its task recorded before
    as ``row`` (``bare``: without its envelope, a cancel arrived first)."""
    if row is None:  # cannot be: not inserted here, so recorded before
        return Answered(Nak(delay=1.0), "task not recorded; later")
    if bare:  # recorded by a cancel that arrived first: CANCELLED
        return OpenPath.CANCELLED
    if generation < row.generation:
        return Answered(ACK, "stale task.create dropped")
    if generation > row.generation and row.status not in TASK_FINAL:
        return OpenPath.REDRIVE  # (of a FAILED task: a resume)
    if row.status is TaskState.CANCELLED:
        return OpenPath.CANCELLED  # its pending nodes may still need cancelling
    if row.status in TASK_ENDED:
        return Answered(ACK, "task already ended")
    if row.leased_by_other(owner, now):
        return Answered(leased(row, now, lease_ttl), "task leased by another executor; later")
    return OpenPath.OPEN


def leased(row: Recorded, now: datetime, lease_ttl: float) -> Nak:
    """Another pass holds the task: come back when its lease would expire."""
    remaining = (row.lease_until - now).total_seconds() if row.lease_until else lease_ttl
    return Nak(delay=min(max(remaining, 0.1), lease_ttl))


# ---- redrives and interrupted nodes ------------------------------------------------------
# Nodes a redrive leaves as they are even where the table has a way to PENDING: a RUNNING
# node's fate is settled by crash recovery (or its runner), not by a message.
REDRIVE_KEEPS = frozenset({NodeState.RUNNING})


def redrive_changes(
    task_id: str, reset_nodes: Collection[str], settled_nodes: Collection[str],
    here: Mapping[str, NodeState], outputs: Mapping[str, bytes] | None = None,
) -> list[NodeChange]:  # fmt: skip
    """A newer generation's redrive applied to the nodes recorded ``here``, each change
    from the recorded state (never the one the envelope states):

    - ``reset_nodes``: to PENDING with a fresh short-retry round, where the recorded state
      may move to PENDING (not from RUNNING, see ``REDRIVE_KEEPS``). SUCCEEDED and
      CANCELLED have no move at all: such a node is never run again.
    - ``settled_nodes``: UNKNOWN to SUCCEEDED (the reconciler's probe found the effect),
      with the output a worker's probe answered (``outputs``, by node id), if any.

    A change the table does not allow is skipped, not refused: a redrive names what to run
    again, and a node already past it simply stays."""
    states = dict(here)
    changes: list[NodeChange] = []
    for node_id in reset_nodes:
        current = states.get(node_id)
        if (
            current is None
            or current in REDRIVE_KEEPS
            or not NODE_TRANSITIONS.allows(current, NodeState.PENDING)
        ):
            continue
        fields = {"round_attempts": 0, "retryable": False, "not_before": None, "finished_at": None}
        changes.append(NodeChange(task_id, node_id, current, NodeState.PENDING, None, fields))
        states[node_id] = NodeState.PENDING
    found = outputs or {}
    for node_id in settled_nodes:
        if states.get(node_id) is NodeState.UNKNOWN:
            settled: dict[str, Any] = {"last_error": ""}
            if node_id in found:
                settled["output"] = found[node_id]
            changes.append(
                NodeChange(
                    task_id,
                    node_id,
                    NodeState.UNKNOWN,
                    NodeState.SUCCEEDED,
                    None,
                    settled,
                )  # fmt: skip
            )
            states[node_id] = NodeState.SUCCEEDED
    return changes


def unknown_change(
    task_id: str,
    node: NodeRun,
    now: datetime,
    why: str,
    *,
    owner: str | None = None,
    not_before: datetime | None = None,
) -> NodeChange:
    """A RUNNING node whose call may have had its effect without its result being recorded
    (the executor stopped mid-call, or the call's outcome was ambiguous) becomes UNKNOWN.
    An idempotent action is then run again under the same idempotency key: it goes on to
    PENDING in the same write (a short retry not before ``not_before`` when given, else at
    once); any other stays UNKNOWN, never sent again by the executor, until the reconciler
    settles it by its status probe or an operator decides. ``owner`` guards the move by
    the node's runner."""
    if node.spec.idempotent:
        fields: dict[str, Any] = {
            "last_error": truncate_error(
                f"re-run under the same idempotency key (idempotent): {why}"
            )
        }
        if not_before is not None:  # a short retry, as after any retryable failure
            fields.update(not_before=not_before, retryable=True)
        return NodeChange(
            task_id, node.node_id, NodeState.RUNNING, NodeState.PENDING, owner, fields
        )
    fields = {
        "last_error": truncate_error(
            f"outcome unknown until settled (status probe or operator): {why}"
        ),
        "finished_at": now,
    }
    return NodeChange(task_id, node.node_id, NodeState.RUNNING, NodeState.UNKNOWN, owner, fields)


def recover_changes(task_id: str, nodes: Mapping[str, NodeRun], now: datetime) -> list[NodeChange]:
    """The nodes a pass finds RUNNING as it opens its task were left by an executor whose
    lease expired: their call may have happened (:func:`unknown_change`)."""
    return [
        unknown_change(task_id, node, now, "executor stopped mid-call")
        for node in nodes.values()
        if node.status is NodeState.RUNNING
    ]


# ---- a round of a step ------------------------------------------------------------------
@dataclass
class Round:
    """One round of a task's step: the ready nodes to launch, the node writes (cancelled,
    dependency failed, demoted; applied to the nodes already, as the rows will hold them),
    the ready noop nodes to run in the step, the ready wait nodes to park in it, and the
    nodes demoted by an open breaker."""

    launch: list[NodeRun] = field(default_factory=list)
    writes: list[tuple[NodeChange, NodeRun]] = field(default_factory=list)
    noops: list[NodeRun] = field(default_factory=list)
    waits: list[NodeRun] = field(default_factory=list)
    demoted: list[NodeRun] = field(default_factory=list)


def plan_round(
    task_id: str,
    nodes: dict[str, NodeRun],
    cancel_requested: bool,
    in_flight: Collection[str],
    attempted: Collection[str],
    breakers: Mapping[str, Breaker],
    now: datetime,
    deadline_passed: bool = False,
) -> Round:
    """One round of a task's step over ``nodes`` (moved in place as the writes say): a
    requested cancel cancels what has not started, and so does a deadline passed (each node
    closed with the error "deadline reached"; nothing more is launched), a failure dooms
    what waits on it, a ready
    node of a downstream whose breaker refuses is demoted (never sent), the other ready
    nodes are launched (a noop run in the step). ``in_flight``: the pass's calls under way;
    ``attempted``: the nodes it launched already (a retry waits for the next pass)."""
    plan = Round()

    def move(node: NodeRun, new: NodeState, **fields: object) -> None:
        plan.writes.append(
            (NodeChange(task_id, node.node_id, node.status, new, None, fields), node)
        )
        node.status = new
        for name, value in fields.items():  # as the row will hold it
            setattr(node, name, value)

    closing = cancel_requested or deadline_passed
    if closing:
        closed: dict[str, object] = {"finished_at": now}
        if deadline_passed and not cancel_requested:
            closed["last_error"] = DEADLINE_REACHED
        for node_id in to_close(nodes):
            if node_id in in_flight:
                # launched: its claim fails on the cancel flag or the deadline, then it is
                # closed
                continue
            move(nodes[node_id], NodeState.CANCELLED, **closed)
    for node_id in blocked_by_failure(nodes):
        move(
            nodes[node_id],
            NodeState.DEPENDENCY_FAILED,
            finished_at=now,
            last_error=tasks.DEPENDENCY_FAILED_ERROR,
        )
    if closing:
        return plan
    for node in ready(nodes, now):
        if node.node_id in in_flight or node.node_id in attempted:
            continue
        if node.spec.kind == "noop":
            plan.noops.append(node)
            continue
        if node.spec.kind == "wait":
            plan.waits.append(node)
            continue
        breaker = breakers.get(node.spec.downstream)
        if node.spec.kind == "http" and breaker is not None and not breaker.allow(now):
            # Refused by the breaker, so not sent: it may go out once released.
            detail = f"downstream {node.spec.downstream} degraded (circuit open)"
            move(node, NodeState.DEMOTED, last_error=failure_text(CallOutcome.NOT_SENT, detail))
            plan.demoted.append(node)
            continue
        plan.launch.append(node)
    return plan


# ---- settling ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Settling:
    """A task whose pass can run nothing more now."""

    task_id: str
    owner: str
    nodes: dict[str, NodeRun]
    cancel_requested: bool
    generation: int  # as recorded (the write bumps it for a retry)
    ran: int  # calls this pass made
    changed: bool  # nodes changed since its last status event
    deadline_passed: bool = False  # its deadline has passed (ADR-0103)


@dataclass(frozen=True)
class Settled:
    """What happens to a settling task: its row's write, the message's answer, the event
    to publish with it ``(subject, msg_id)`` if any, and what was decided (for the log)."""

    write: TaskWrite
    disposition: Disposition
    event: tuple[str, str] | None
    next: Next | None = None
    status: TaskState | None = None
    reason: str = ""


def settle(task: Settling, now: datetime) -> Settled:
    """Finish, re-publish for a short retry, demote, fail or park a task (``decide``): a
    task parked WAITING stays RUNNING without a lease, its message answered, until a signal
    or the timeout sweep publishes the task.create that resumes it (ADR-0102). A task
    none of whose nodes could run yet (the message came back before the backoff passed) is
    only released, its message answered later."""
    decision = decide(task.nodes, now, task.cancel_requested, task.deadline_passed)
    if decision.next is Next.RETRY and task.ran == 0:
        wait = (decision.not_before - now).total_seconds() if decision.not_before else 0.1
        return Settled(
            TaskWrite(task.task_id, task.owner, emit=task.changed),
            Nak(delay=max(0.05, wait)),
            None,
        )
    retry = decision.next is Next.RETRY
    write = TaskWrite(task.task_id, task.owner, decision.status, decision.reason, retry, emit=True)
    generation = task.generation + (1 if retry else 0)  # as the write leaves it
    event: tuple[str, str] | None = None
    if retry:
        event = (tasks.TASK_CREATE, tasks.create_id(task.task_id, generation))
    elif decision.next is Next.DEMOTE:
        event = (tasks.TASK_DEMOTE, tasks.demote_id(task.task_id, generation))
    elif decision.next is Next.FAIL or decision.status is TaskState.FAILED:
        # Failed work is the reconciler's: a task that ended FAILED (a permanent failure)
        # goes there too, held FAILED for an operator to resume.
        event = (tasks.TASK_FAIL, tasks.fail_id(task.task_id, generation))
    return Settled(write, ACK, event, decision.next, decision.status, decision.reason)
