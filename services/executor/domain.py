"""The executor's view of a task: plain dataclasses, the scheduling rules and the retry
policy. No I/O here; :mod:`dispo.executor.runner` applies these decisions to the database.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from dispo.executor.states import NodeState, TaskState
from dispo.libs.backoff import backoff


class ActionSpec(NamedTuple):
    """A node's action (a NamedTuple: made for every node a pass reads, and a frozen
    dataclass cost six times as much to build)."""

    kind: str
    downstream: str = ""
    method: str = "POST"
    path: str = ""
    probe_path: str = ""
    idempotent: bool = False
    timeout_ms: int = 0
    # The largest output it may record (bytes of canonical JSON; ADR-0093).
    max_output_bytes: int = 64 * 1024
    # The output fields the catalogue declares: (name, JSON type, required).
    output_fields: tuple[tuple[str, str, bool], ...] = ()
    # The nodes whose outputs its call reads (references in its path or payload).
    inputs: tuple[str, ...] = ()
    # A worker action's queue (ADR-0099).
    queue: str = ""
    # A wait action's signal, timeout, what the timeout does and its default output
    # (canonical JSON; ADR-0102).
    signal: str = ""
    timeout_seconds: int = 0
    on_timeout: str = ""
    default_output: bytes = b""


@dataclass
class NodeRun:
    node_id: str
    depends_on: tuple[str, ...]
    spec: ActionSpec
    idempotency_key: str
    status: NodeState = NodeState.PENDING
    attempts: int = 0
    round_attempts: int = 0
    not_before: datetime | None = None
    retryable: bool = False
    last_error: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    cell_ref: str = ""
    cell: str = ""
    action: str = ""
    # The size of its recorded output in bytes (0: none; the output itself stays in its
    # row until a reader asks for it).
    output_bytes: int = 0

    @property
    def permanently_failed(self) -> bool:
        return self.status is NodeState.FAILED and not self.retryable


@dataclass
class RetryPolicy:
    """Short retries: up to ``max_retries`` more attempts with jittered exponential backoff."""

    max_retries: int = 3
    base_delay: float = 0.5
    max_delay: float = 30.0
    jitter: float = 0.5

    def exhausted(self, round_attempts: int) -> bool:
        return round_attempts > self.max_retries

    def delay(self, round_attempts: int, rng: random.Random | None = None) -> float:
        return backoff(self.base_delay, self.max_delay, self.jitter, round_attempts, rng)


class Next(enum.Enum):
    FINISH = "finish"  # terminal task status
    RETRY = "retry"  # re-publish task.create for nodes waiting out their backoff
    DEMOTE = "demote"  # task.demote: nodes parked behind a degraded downstream
    FAIL = "fail"  # task.fail: short retries spent or a node's outcome is unknown
    WAIT = "wait"  # nodes WAITING for a signal: the pass ends, the task stays RUNNING


@dataclass(frozen=True)
class Decision:
    next: Next
    status: TaskState
    not_before: datetime | None = None
    reason: str = ""


def blocked_by_failure(nodes: dict[str, NodeRun]) -> list[str]:
    """PENDING nodes that can never run because a dependency ended badly (transitively)."""
    doomed: set[str] = set()
    bad = {NodeState.DEPENDENCY_FAILED, NodeState.CANCELLED}
    changed = True
    while changed:
        changed = False
        for node in nodes.values():
            if node.status is not NodeState.PENDING or node.node_id in doomed:
                continue
            for dep in node.depends_on:
                d = nodes[dep]
                if d.permanently_failed or d.status in bad or dep in doomed:
                    doomed.add(node.node_id)
                    changed = True
                    break
    return [n for n in nodes if n in doomed]


def ready(nodes: dict[str, NodeRun], now: datetime) -> list[NodeRun]:
    """PENDING nodes whose dependencies all SUCCEEDED and whose backoff has passed."""
    return [
        n
        for n in nodes.values()
        if n.status is NodeState.PENDING
        and all(nodes[d].status is NodeState.SUCCEEDED for d in n.depends_on)
        and (n.not_before is None or n.not_before <= now)
    ]


def runnable(nodes: dict[str, NodeRun]) -> list[NodeRun]:
    """PENDING nodes whose dependencies all SUCCEEDED: ready now or after their backoff."""
    return [
        n
        for n in nodes.values()
        if n.status is NodeState.PENDING
        and all(nodes[d].status is NodeState.SUCCEEDED for d in n.depends_on)
    ]


# The node states a task's end closes: nodes that have not started and still could (a
# retryable FAILED one too), and nodes waiting for a signal (ADR-0102). A cancel and a
# deadline close them (CANCELLED); a RUNNING one finishes and is recorded, an UNKNOWN one
# (its effect may have happened) waits to be settled. The one place that says which states
# are open (ADR-0103).
OPEN_NODE_STATES = frozenset({NodeState.PENDING, NodeState.DEMOTED, NodeState.WAITING})

# The reason of a task ended by its deadline, and the error of each node it closed.
DEADLINE_REACHED = "deadline reached"


def to_close(nodes: dict[str, NodeRun]) -> list[str]:
    """The open nodes (:data:`OPEN_NODE_STATES`, and a retryable FAILED one): what a cancel
    or a deadline closes."""
    return [
        n.node_id
        for n in nodes.values()
        if n.status in OPEN_NODE_STATES or (n.status is NodeState.FAILED and n.retryable)
    ]


def to_cancel(nodes: dict[str, NodeRun]) -> list[str]:
    """On cancel: everything not started and not final becomes CANCELLED; running ones
    finish, and an UNKNOWN one (its effect may have happened) waits to be settled."""
    return to_close(nodes)


def past_deadline(deadline: datetime | None, now: datetime) -> bool:
    """Whether a task with this deadline (None: none) has reached it at ``now``."""
    return deadline is not None and deadline <= now


def decide(
    nodes: dict[str, NodeRun], now: datetime, cancel_requested: bool, deadline_passed: bool = False
) -> Decision:
    """What happens to the task once nothing more can run now (no node RUNNING or ready).
    Past its deadline (``deadline_passed``) a task that has not succeeded ends FAILED,
    "deadline reached", whatever is left: its open nodes were closed, an UNKNOWN one stays
    UNKNOWN (ADR-0103)."""
    statuses = [n.status for n in nodes.values()]
    final = {NodeState.SUCCEEDED, NodeState.DEPENDENCY_FAILED, NodeState.CANCELLED}
    if all(
        s in final or (s is NodeState.FAILED and not nodes[i].retryable)
        for i, s in zip(nodes, statuses, strict=False)
    ):
        if all(s is NodeState.SUCCEEDED for s in statuses):
            return Decision(Next.FINISH, TaskState.SUCCEEDED)
        if cancel_requested and NodeState.CANCELLED in statuses:
            return Decision(Next.FINISH, TaskState.CANCELLED, reason="cancelled by request")
        if deadline_passed:
            return Decision(Next.FINISH, TaskState.FAILED, reason=DEADLINE_REACHED)
        failed = sorted(i for i, n in nodes.items() if n.permanently_failed)
        return Decision(Next.FINISH, TaskState.FAILED, reason=f"failed: {', '.join(failed)}")
    if deadline_passed:
        return Decision(Next.FINISH, TaskState.FAILED, reason=DEADLINE_REACHED)
    again = runnable(nodes)
    if again:
        moment = max(now, min(n.not_before or now for n in again))
        return Decision(Next.RETRY, TaskState.RUNNING, not_before=moment, reason="short retry")
    parked = [n.spec for n in nodes.values() if n.status is NodeState.DEMOTED]
    if parked:
        downstreams = sorted({s.downstream for s in parked if not s.queue})
        queues = sorted({s.queue for s in parked if s.queue})
        reasons = [f"downstream degraded: {', '.join(downstreams)}"] if downstreams else []
        if queues:
            reasons.append(f"no live worker: {', '.join(queues)}")
        return Decision(Next.DEMOTE, TaskState.DEMOTED, reason="; ".join(reasons))
    stuck = sorted(i for i, n in nodes.items() if n.status in (NodeState.UNKNOWN, NodeState.FAILED))
    waiting = sorted(i for i, n in nodes.items() if n.status is NodeState.WAITING)
    if waiting and not any(
        nodes[i].status is NodeState.UNKNOWN or nodes[i].retryable for i in stuck
    ):
        # Parked until a signal or a timeout resumes it (ADR-0102); a permanent failure
        # elsewhere does not stop what waits for the signal from running.
        return Decision(Next.WAIT, TaskState.RUNNING, reason=f"waiting: {', '.join(waiting)}")
    return Decision(
        Next.FAIL, TaskState.RETRY_EXHAUSTED, reason=f"needs recovery: {', '.join(stuck)}"
    )
