"""Wait nodes, decided with no I/O (ADR-0102): a ready wait node is parked WAITING (or, when
a signal for it was recorded before, SUCCEEDED at once with the signal's payload); a signal
that arrives for a WAITING node makes it SUCCEEDED; a WAITING node whose time is up is
FAILED or SUCCEEDED with its default output, as its action's ``on_timeout`` says.

:mod:`dispo.executor.passes` parks the nodes in the step that finds them ready, and
:mod:`dispo.executor.control` applies signals and timeouts; the rows are
:mod:`dispo.executor.store.signals`' and :mod:`dispo.executor.store.node_runs`'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from dispo.executor.domain import NodeRun
from dispo.executor.failures import CallOutcome, failure_text
from dispo.executor.plan import NodeChange
from dispo.executor.states import NodeState
from dispo.libs.payload import PayloadError, canonical_json, fields_problem, parse_json_value


@dataclass(frozen=True)
class Signal:
    """A signal recorded for a task and not yet taken by a node: its name, its id and its
    payload (canonical JSON)."""

    task_id: str
    signal_id: str
    signal: str
    payload: bytes


def park(task_id: str, node: NodeRun, now: datetime) -> NodeChange:
    """A ready wait node starts waiting: WAITING until ``now`` + its timeout (kept as its
    ``not_before``, what the timeout sweep reads)."""
    until = now + timedelta(seconds=node.spec.timeout_seconds)
    fields = {"started_at": now, "not_before": until, "finished_at": None, "last_error": ""}
    return NodeChange(task_id, node.node_id, NodeState.PENDING, NodeState.WAITING, None, fields)


def signalled(task_id: str, node: NodeRun, payload: bytes, now: datetime) -> NodeChange:
    """A WAITING node takes a signal: SUCCEEDED with the payload as its output; a payload
    that is not as the action declares (the gateway checks it first: the catalogue changed
    since) fails it definitely, naming why."""
    problem = output_problem(payload, node)
    if problem is not None:
        fields = {
            "finished_at": now,
            "retryable": False,
            "last_error": failure_text(CallOutcome.DEFINITE, f"signal {problem}"),
        }
        return NodeChange(task_id, node.node_id, NodeState.WAITING, NodeState.FAILED, None, fields)
    fields = {"finished_at": now, "last_error": "", "output": payload, "retryable": False}
    return NodeChange(task_id, node.node_id, NodeState.WAITING, NodeState.SUCCEEDED, None, fields)


def timed_out(task_id: str, node: NodeRun, now: datetime) -> NodeChange:
    """A WAITING node whose time is up: FAILED, definitely (``on_timeout: fail``), or
    SUCCEEDED with its declared default output (``succeed``)."""
    if node.spec.on_timeout == "succeed":
        fields = {
            "finished_at": now,
            "last_error": "",
            "output": node.spec.default_output or b"{}",
            "retryable": False,
        }
        return NodeChange(
            task_id, node.node_id, NodeState.WAITING, NodeState.SUCCEEDED, None, fields
        )
    why = f"no signal {node.spec.signal!r} within {node.spec.timeout_seconds} s"
    fields = {"finished_at": now, "retryable": False, "last_error": why}
    return NodeChange(task_id, node.node_id, NodeState.WAITING, NodeState.FAILED, None, fields)


def output_problem(payload: bytes, node: NodeRun) -> str | None:
    """Why a signal's payload cannot be the node's output (None: it can): JSON Dispo
    records, within the action's ``max_output_bytes``, as its output fields declare."""
    try:
        value = parse_json_value(payload)
    except PayloadError as error:
        return f"payload is not JSON Dispo records: {error}"
    size = len(canonical_json(value))
    if size > node.spec.max_output_bytes:
        return f"payload of {size} bytes is over the limit of {node.spec.max_output_bytes} bytes"
    problem = fields_problem(value, node.spec.output_fields)
    return None if problem is None else f"payload not as declared: {problem}"


def match(waiting: Sequence[NodeRun], signals: Sequence[Signal]) -> list[tuple[NodeRun, Signal]]:
    """Which signal each node waiting takes: for each, in the task's node order, the oldest
    signal of its name not taken by a node before it (``signals`` oldest first)."""
    free = list(signals)
    pairs: list[tuple[NodeRun, Signal]] = []
    for node in waiting:
        found = next((s for s in free if s.signal == node.spec.signal), None)
        if found is not None:
            free.remove(found)
            pairs.append((node, found))
    return pairs


def waiting_nodes(nodes: Mapping[str, NodeRun]) -> list[NodeRun]:
    """The task's nodes WAITING, in its node order."""
    return [n for n in nodes.values() if n.status is NodeState.WAITING]


def due(nodes: Mapping[str, NodeRun], now: datetime) -> list[NodeRun]:
    """The task's WAITING nodes whose time is up."""
    return [n for n in waiting_nodes(nodes) if n.not_before is not None and n.not_before <= now]
