"""The ``node_runs`` rows: recorded with their task, read, claimed, moved under guard."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dispo.executor.domain import NodeRun
from dispo.executor.envelope import node_from_proto
from dispo.executor.plan import NodeChange
from dispo.executor.states import NODE_TRANSITIONS, NodeState
from dispo.executor.store.rows import node_runs_from_rows
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.db.driver import Conn

# A claim's (task id, node id, owner): what a claim's result is known by. Two passes (of
# two owners) may ask for one node in one statement; only the lease holder's is answered
# won, so a result is never looked up by the node alone.
ClaimKey = tuple[str, str, str]

# The node columns a guarded write may set besides its status, with their SQL types.
NODE_FIELDS = {
    "finished_at": "timestamptz",
    "not_before": "timestamptz",
    "started_at": "timestamptz",
    "last_error": "text",
    "retryable": "boolean",
    "round_attempts": "integer",
    "output": "bytea",
}

# A node's row as a step reads it: its state, and its output's size (not the output).
_NODE_STATE = (
    "task_id, node_id, status, attempts, round_attempts, not_before, retryable, last_error,"
    " started_at, finished_at, run_owner, octet_length(output) AS output_bytes"
)

# The nodes of tasks being recorded, from the arrays of :func:`node_columns` (``r``): the
# tail of a statement that inserts them with their tasks.
NODES_INSERT = (
    "INSERT INTO node_runs (task_id, node_id, position, status, attempts, round_attempts,"
    " not_before, retryable, last_error, started_at, finished_at)"
    " SELECT r.task, r.node, r.pos, r.status, r.att, r.round, r.nb, r.retr, r.err, r.sa, r.fa"
    " FROM unnest(CAST(:task AS text[]), CAST(:node AS text[]), CAST(:pos AS integer[]),"
    " CAST(:status AS text[]), CAST(:att AS integer[]), CAST(:round AS integer[]),"
    " CAST(:nb AS timestamptz[]), CAST(:retr AS boolean[]), CAST(:err AS text[]),"
    " CAST(:sa AS timestamptz[]), CAST(:fa AS timestamptz[]))"
    " AS r(task, node, pos, status, att, round, nb, retr, err, sa, fa)"
)


def node_columns(
    envs: Sequence[task_pb2.Task], made: Mapping[str, Mapping[str, NodeRun]]
) -> dict[str, list[Any]]:
    """The nodes of ``envs`` as the arrays :data:`NODES_INSERT` reads, as each envelope
    states them (those of a task in ``made`` taken from there)."""
    cols: dict[str, list[Any]] = {
        k: [] for k in ("task", "node", "pos", "status", "att", "round", "nb", "retr", "err")
    }
    cols.update(sa=[], fa=[])
    for env in envs:
        runs = made.get(env.task_id)
        for position, node in enumerate(env.nodes):
            run = runs[node.node_id] if runs is not None else node_from_proto(node)
            for key, value in (
                ("task", env.task_id),
                ("node", run.node_id),
                ("pos", position),
                ("status", run.status.value),
                ("att", run.attempts),
                ("round", run.round_attempts),
                ("nb", run.not_before),
                ("retr", run.retryable),
                ("err", run.last_error),
                ("sa", run.started_at),
                ("fa", run.finished_at),
            ):
                cols[key].append(value)
    return cols


async def node_rows_many(conn: Conn, task_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each task's ``node_runs`` rows by node id, by task id (one statement for all)."""
    if not task_ids:
        return {}
    by_task: dict[str, dict[str, Any]] = {t: {} for t in task_ids}
    rows = await conn.fetch(
        f"SELECT {_NODE_STATE} FROM node_runs WHERE task_id = ANY(CAST(:ids AS text[]))",
        {"ids": list(by_task)},
    )
    for row in rows:
        by_task[row.task_id][row.node_id] = row
    return by_task


async def node_outputs_many(
    conn: Conn, wanted: Sequence[tuple[str, Sequence[str] | None]]
) -> dict[str, dict[str, bytes]]:
    """The recorded outputs of each ``(task_id, node_ids)`` (None: every node of the task),
    by node id, by task id (one statement for all); a node without one is absent. A task
    named twice: ValueError (which nodes were wanted could not be told)."""
    if not wanted:
        return {}
    tasks = sorted({task_id for task_id, _ in wanted})
    if len(tasks) != len(wanted):
        raise ValueError("a task named twice in one read of outputs")
    rows = await conn.fetch(
        "SELECT task_id, node_id, output FROM node_runs"
        " WHERE task_id = ANY(CAST(:ids AS text[])) AND output IS NOT NULL ORDER BY position",
        {"ids": tasks},
    )
    picked = {task_id: None if nodes is None else set(nodes) for task_id, nodes in wanted}
    found: dict[str, dict[str, bytes]] = {task_id: {} for task_id in tasks}
    for row in rows:
        nodes = picked[row.task_id]
        if nodes is None or row.node_id in nodes:
            found[row.task_id][row.node_id] = row.output
    return found


async def nodes_get_many(
    conn: Conn,
    envs: Sequence[task_pb2.Task],
    reuse: Mapping[str, Mapping[str, NodeRun]] | None = None,
) -> dict[str, dict[str, NodeRun]]:
    """Each task's nodes, by task id (one statement for all); a task in ``reuse`` keeps the
    nodes made for it before, their states read again (:func:`node_runs_from_rows`)."""
    by_task = await node_rows_many(conn, [e.task_id for e in envs])
    known = reuse or {}
    return {
        e.task_id: node_runs_from_rows(e, by_task[e.task_id], known.get(e.task_id)) for e in envs
    }


async def node_states_lock_many(
    conn: Conn, task_ids: Sequence[str]
) -> dict[str, dict[str, NodeState]]:
    """Each task's node states by node id, by task id, the rows locked (``FOR UPDATE``) in
    ``task_id`` order."""
    by_task: dict[str, dict[str, NodeState]] = {t: {} for t in sorted(set(task_ids))}
    if not by_task:
        return {}
    rows = await conn.fetch(
        "SELECT task_id, node_id, status FROM node_runs WHERE task_id = ANY(CAST(:ids AS text[]))"
        " ORDER BY task_id, node_id FOR UPDATE",
        {"ids": list(by_task)},
    )
    for row in rows:
        by_task[row.task_id][row.node_id] = NodeState(row.status)
    return by_task


async def nodes_set_status_if_many(conn: Conn, changes: Sequence[NodeChange]) -> list[bool]:
    """Apply ``changes``: every move checked first (an undeclared one raises and nothing is
    written), then one guarded statement per kind of change. Returns, per change, whether
    it was applied (False: the node was not in ``expected``, or not run by ``owner``).
    Two changes of one node without an owner in one call are a bug (which one applied
    could not be told): ValueError, nothing written."""
    unowned = [c.key for c in changes if c.owner is None]
    if len(unowned) != len(set(unowned)):
        raise ValueError("two changes of one node without an owner in one call")
    for change in changes:
        NODE_TRANSITIONS.check(change.expected, change.new)
        unknown = set(change.fields) - set(NODE_FIELDS)
        if unknown:
            raise ValueError(f"node_runs has no settable column {sorted(unknown)}")
    groups: dict[tuple[Any, ...], list[NodeChange]] = {}
    for change in changes:
        shape = (
            change.expected,
            change.new,
            change.owner is not None,
            tuple(sorted(change.fields)),
        )
        groups.setdefault(shape, []).append(change)
    applied: set[tuple[str, str, str | None]] = set()
    for (expected, new, owned, names), group in groups.items():
        columns = ["task", "node", *(["owner"] if owned else []), *names]
        types = ["text", "text", *(["text"] if owned else []), *(NODE_FIELDS[n] for n in names)]
        params: dict[str, Any] = {
            "task": [c.task_id for c in group],
            "node": [c.node_id for c in group],
            "expected": expected.value,
            "new": new.value,
        }
        if owned:
            params["owner"] = [c.owner for c in group]
        for name in names:
            params[name] = [c.fields[name] for c in group]
        arrays = ", ".join(f"CAST(:{c} AS {t}[])" for c, t in zip(columns, types, strict=True))
        sets = "".join(f", {name} = u.{name}" for name in names)
        rows = await conn.fetch(
            f"UPDATE node_runs r SET status = :new{sets}"
            f" FROM unnest({arrays}) AS u({', '.join(columns)})"
            " WHERE r.task_id = u.task AND r.node_id = u.node AND r.status = :expected"
            + (" AND r.run_owner = u.owner" if owned else "")
            + " RETURNING r.task_id, r.node_id, r.run_owner",
            params,
        )
        # An owned change is answered by the owner the row was written under, never by
        # the node alone: of two owners' changes of one node, only the runner's applied.
        applied.update((row.task_id, row.node_id, row.run_owner if owned else None) for row in rows)
    return [(change.task_id, change.node_id, change.owner) in applied for change in changes]


async def nodes_clear_backoff_many(conn: Conn, task_ids: Sequence[str]) -> None:
    """Every PENDING node of these tasks may run at once (a redrive): its backoff cleared."""
    if task_ids:
        await conn.fetch(
            "UPDATE node_runs SET not_before = NULL"
            " WHERE task_id = ANY(CAST(:ids AS text[])) AND status = :pending",
            {"ids": sorted(set(task_ids)), "pending": NodeState.PENDING.value},
        )


@dataclass(frozen=True)
class Claimed:
    attempts: int
    round_attempts: int


async def nodes_claim_if_pending_many(
    conn: Conn, claims: Sequence[ClaimKey], now: datetime
) -> dict[ClaimKey, Claimed]:
    """PENDING → RUNNING for each ``(task_id, node_id, owner)``, only for the lease holder
    and not once a cancel is requested or the task's deadline passed at ``now`` (the claim
    exactly one contender wins); returns the
    claims won, by ``(task_id, node_id, owner)``, with the node's new attempt counts."""
    NODE_TRANSITIONS.check(NodeState.PENDING, NodeState.RUNNING)
    return await _claim_many(conn, claims, now, "status = 'running', finished_at = NULL")


async def nodes_run_noop_many(
    conn: Conn, claims: Sequence[ClaimKey], now: datetime
) -> dict[ClaimKey, Claimed]:
    """Claim and record each ``(task_id, node_id, owner)`` of a ``noop`` node at once:
    PENDING → RUNNING → SUCCEEDED in one statement, guarded as
    :func:`nodes_claim_if_pending_many`. A noop makes no call between the two, and both
    moves commit together in the caller's transaction, so no one can see the node RUNNING
    in between: one write is the same record as two."""
    NODE_TRANSITIONS.check(NodeState.PENDING, NodeState.RUNNING)
    NODE_TRANSITIONS.check(NodeState.RUNNING, NodeState.SUCCEEDED)
    return await _claim_many(
        conn,
        claims,
        now,
        "status = 'succeeded', finished_at = :now, last_error = '', retryable = false",
    )


async def _claim_many(
    conn: Conn, claims: Sequence[ClaimKey], now: datetime, outcome: str
) -> dict[ClaimKey, Claimed]:
    """The guarded claim of :func:`nodes_claim_if_pending_many`, setting ``outcome`` (the
    node's status and result columns) besides the claim's own."""
    if not claims:
        return {}
    rows = await conn.fetch(
        f"UPDATE node_runs r SET {outcome}, run_owner = u.owner,"
        " attempts = r.attempts + 1, round_attempts = r.round_attempts + 1,"
        " started_at = :now, not_before = NULL"
        " FROM unnest(CAST(:tasks AS text[]), CAST(:nodes AS text[]), CAST(:owners AS text[]))"
        " AS u(task, node, owner)"
        " WHERE r.task_id = u.task AND r.node_id = u.node AND r.status = 'pending'"
        " AND EXISTS (SELECT 1 FROM task_runs t WHERE t.task_id = u.task"
        " AND t.lease_owner = u.owner AND NOT t.cancel_requested)"
        " AND NOT EXISTS (SELECT 1 FROM task_deadlines d WHERE d.task_id = u.task"
        " AND d.deadline <= :now)"
        " RETURNING r.task_id, r.node_id, r.run_owner, r.attempts, r.round_attempts",
        {
            "tasks": [c[0] for c in claims],
            "nodes": [c[1] for c in claims],
            "owners": [c[2] for c in claims],
            "now": now,
        },
    )
    # By the owner that won: of two owners' claims of one node, the loser is not answered.
    return {
        (r.task_id, r.node_id, r.run_owner): Claimed(r.attempts, r.round_attempts) for r in rows
    }
