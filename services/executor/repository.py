"""All SQL of the executor. Every state change is first checked against the declared
table (``NODE_TRANSITIONS`` / ``TASK_TRANSITIONS``: an undeclared move raises
``IllegalTransition`` and writes nothing), then carries its expected state (and, for a
running node, its owner) in the WHERE clause; zero rows means a lost race, reported to the
caller as ``False``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dispo.executor.domain import NodeRun
from dispo.executor.envelope import node_from_proto, overlay
from dispo.executor.states import NODE_TRANSITIONS, TASK_TRANSITIONS, NodeState, TaskState
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.contracts import tasks
from dispo.libs.outbox import OutboxRow, Staged, outbox_add_many, outbox_table
from dispo.libs.timestamps import to_timestamp
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncConnection

metadata = MetaData()
outbox = outbox_table(metadata, traced=True)


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


async def task_get(
    conn: AsyncConnection, task_id: str, *, for_update: bool = False
) -> TaskRow | None:
    sql = "SELECT * FROM task_runs WHERE task_id = :id" + (" FOR UPDATE" if for_update else "")
    row = (await conn.execute(text(sql), {"id": task_id})).first()
    return task_from_row(row) if row else None


async def task_insert(
    conn: AsyncConnection,
    env: task_pb2.Task | None,
    task_id: str,
    now: datetime,
    *,
    cancel_requested: bool = False,
) -> bool:
    """Record a task first seen (``env`` None: a cancel arrived before the task). False if it exists."""
    inserted = await conn.execute(
        text(
            "INSERT INTO task_runs (task_id, status, generation, cancel_requested, envelope, created_at, updated_at)"
            " VALUES (:id, 'accepted', :gen, :cancel, :env, :now, :now) ON CONFLICT (task_id) DO NOTHING"
        ),
        {
            "id": task_id,
            "gen": env.generation if env else 0,
            "cancel": cancel_requested or bool(env and env.cancel_requested),
            "env": env.SerializeToString() if env else None,
            "now": now,
        },
    )
    if inserted.rowcount and env is not None:
        await nodes_insert(conn, env)
    return bool(inserted.rowcount)


async def task_attach_envelope(conn: AsyncConnection, env: task_pb2.Task) -> None:
    """The task.create for a task whose cancel arrived first."""
    await conn.execute(
        text(
            "UPDATE task_runs SET envelope = :env, generation = :gen WHERE task_id = :id AND envelope IS NULL"
        ),
        {"id": env.task_id, "env": env.SerializeToString(), "gen": env.generation},
    )
    await nodes_insert(conn, env)


async def nodes_insert(conn: AsyncConnection, env: task_pb2.Task) -> None:
    rows = []
    for position, node in enumerate(env.nodes):
        run = node_from_proto(node)
        rows.append(
            {
                "task": env.task_id,
                "node": run.node_id,
                "pos": position,
                "status": run.status.value,
                "attempts": run.attempts,
                "round": run.round_attempts,
                "nb": run.not_before,
                "retryable": run.retryable,
                "err": run.last_error,
                "sa": run.started_at,
                "fa": run.finished_at,
            }
        )
    if rows:
        await conn.execute(
            text(
                "INSERT INTO node_runs (task_id, node_id, position, status, attempts, round_attempts, not_before,"
                " retryable, last_error, started_at, finished_at) VALUES (:task, :node, :pos, :status, :attempts,"
                " :round, :nb, :retryable, :err, :sa, :fa) ON CONFLICT DO NOTHING"
            ),
            rows,
        )


async def nodes_get(conn: AsyncConnection, env: task_pb2.Task) -> dict[str, NodeRun]:
    """The task's nodes: specs from the envelope, state from the table."""
    rows = {
        r.node_id: r
        for r in await conn.execute(
            text("SELECT * FROM node_runs WHERE task_id = :id"), {"id": env.task_id}
        )
    }
    return node_runs_from_rows(env, rows)


def node_runs_from_rows(
    env: task_pb2.Task, rows: dict[str, Any], reuse: Mapping[str, NodeRun] | None = None
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
        nodes[run.node_id] = run
    return nodes


# Nodes a redrive leaves as they are even where the table has a way to PENDING: a RUNNING
# node's fate is settled by crash recovery (or its runner), not by a message.
REDRIVE_KEEPS = frozenset({NodeState.RUNNING})


async def nodes_redrive(conn: AsyncConnection, env: task_pb2.Task) -> list[str]:
    """A newer generation: apply its redrive (``env.redrive``) to the nodes recorded here,
    each change checked against ``NODE_TRANSITIONS`` from the recorded state and guarded by
    it in the WHERE clause. The node states written in the envelope are never adopted.

    - ``reset_nodes``: to PENDING with a fresh short-retry round, where the recorded state
      may move to PENDING (not from RUNNING, see ``REDRIVE_KEEPS``). SUCCEEDED and
      CANCELLED have no move at all: such a node is never run again.
    - ``settled_nodes``: UNKNOWN to SUCCEEDED (the reconciler's probe found the effect).
    - every PENDING node may run at once: its backoff is cleared.

    Returns the ids of the nodes reset. A change the table does not allow
    (``NODE_TRANSITIONS.allows``) is skipped, not refused: a redrive names what to run
    again, and a node already past it (SUCCEEDED, CANCELLED) simply stays."""
    here = {
        r.node_id: NodeState(r.status)
        for r in await conn.execute(
            text("SELECT node_id, status FROM node_runs WHERE task_id = :task FOR UPDATE"),
            {"task": env.task_id},
        )
    }
    reset: list[str] = []
    for node_id in env.redrive.reset_nodes:
        current = here.get(node_id)
        if (
            current is None
            or current in REDRIVE_KEEPS
            or not NODE_TRANSITIONS.allows(current, NodeState.PENDING)
        ):
            continue
        result = await conn.execute(
            text(
                "UPDATE node_runs SET status = :new, round_attempts = 0, retryable = false,"
                " not_before = NULL, finished_at = NULL"
                " WHERE task_id = :task AND node_id = :node AND status = :current"
            ),
            {
                "task": env.task_id,
                "node": node_id,
                "current": current.value,
                "new": NodeState.PENDING.value,
            },
        )
        if result.rowcount == 1:
            here[node_id] = NodeState.PENDING
            reset.append(node_id)
    for node_id in env.redrive.settled_nodes:
        current = here.get(node_id)
        if current is not NodeState.UNKNOWN or not NODE_TRANSITIONS.allows(
            current, NodeState.SUCCEEDED
        ):
            continue
        await conn.execute(
            text(
                "UPDATE node_runs SET status = :new, last_error = ''"
                " WHERE task_id = :task AND node_id = :node AND status = :current"
            ),
            {
                "task": env.task_id,
                "node": node_id,
                "current": NodeState.UNKNOWN.value,
                "new": NodeState.SUCCEEDED.value,
            },
        )
    await conn.execute(
        text("UPDATE node_runs SET not_before = NULL WHERE task_id = :task AND status = :pending"),
        {"task": env.task_id, "pending": NodeState.PENDING.value},
    )
    await conn.execute(
        text("UPDATE task_runs SET generation = :gen WHERE task_id = :id AND generation < :gen"),
        {"id": env.task_id, "gen": env.generation},
    )
    return reset


async def node_set_status_if(
    conn: AsyncConnection,
    task_id: str,
    node_id: str,
    expected: NodeState,
    new: NodeState,
    *,
    owner: str | None = None,
    **fields: Any,
) -> bool:
    """Move one node from ``expected`` to ``new`` (and set ``fields``); False if it was not in
    ``expected`` (or, with ``owner``, not run by that owner)."""
    NODE_TRANSITIONS.check(expected, new)
    sets = ", ".join(f"{name} = :{name}" for name in fields)
    sql = (
        f"UPDATE node_runs SET status = :new{', ' + sets if sets else ''}"
        " WHERE task_id = :task AND node_id = :node AND status = :expected"
        + (" AND run_owner = :owner" if owner is not None else "")
    )
    params = {
        "task": task_id,
        "node": node_id,
        "expected": expected.value,
        "new": new.value,
        "owner": owner,
        **fields,
    }
    return (await conn.execute(text(sql), params)).rowcount == 1


async def node_claim_if_pending(
    conn: AsyncConnection, task_id: str, node_id: str, owner: str, now: datetime
) -> bool:
    """PENDING → RUNNING, only for the lease holder and not once a cancel is requested: the
    one claim exactly one contender wins."""
    NODE_TRANSITIONS.check(NodeState.PENDING, NodeState.RUNNING)
    result = await conn.execute(
        text(
            "UPDATE node_runs SET status = 'running', run_owner = :owner, attempts = attempts + 1,"
            " round_attempts = round_attempts + 1, started_at = :now, finished_at = NULL, not_before = NULL"
            " WHERE task_id = :task AND node_id = :node AND status = 'pending'"
            " AND EXISTS (SELECT 1 FROM task_runs WHERE task_id = :task AND lease_owner = :owner"
            " AND NOT cancel_requested)"
        ),
        {"task": task_id, "node": node_id, "owner": owner, "now": now},
    )
    return result.rowcount == 1


async def task_set_status(
    conn: AsyncConnection,
    task_id: str,
    status: TaskState,
    reason: str,
    now: datetime,
    *,
    expected: tuple[TaskState, ...],
) -> bool:
    """Move the task from one of ``expected`` to ``status``; False if it was in none."""
    TASK_TRANSITIONS.check(expected, status)
    result = await conn.execute(
        text(
            "UPDATE task_runs SET status = :status, status_reason = :reason, updated_at = :now"
            " WHERE task_id = :id AND status = ANY(:expected)"
        ),
        {
            "id": task_id,
            "status": status.value,
            "reason": reason,
            "now": now,
            "expected": [s.value for s in expected],
        },
    )
    return result.rowcount == 1


async def task_version_at_least(conn: AsyncConnection, task_id: str, version: int) -> None:
    """Another publisher's snapshot of the task had ``version``: the next one from here is
    newer (a status consumer drops a snapshot that is not)."""
    await conn.execute(
        text("UPDATE task_runs SET version = :v WHERE task_id = :id AND version < :v"),
        {"id": task_id, "v": version},
    )


async def task_set_cancel_requested(conn: AsyncConnection, task_id: str) -> None:
    await conn.execute(
        text("UPDATE task_runs SET cancel_requested = true WHERE task_id = :id"), {"id": task_id}
    )


async def snapshot(conn: AsyncConnection, task_id: str, now: datetime) -> task_pb2.Task:
    """The task as recorded now, with a new version number (call once per status change)."""
    row = (
        await conn.execute(
            text(
                "UPDATE task_runs SET version = version + 1, updated_at = :now WHERE task_id = :id"
                " RETURNING *"
            ),
            {"id": task_id, "now": now},
        )
    ).one()
    task = task_from_row(row)
    env = task_pb2.Task()
    if task.envelope is not None:
        env.CopyFrom(task.envelope)
        nodes = await nodes_get(conn, env)
        for node in env.nodes:
            overlay(node, nodes[node.node_id])
    env.ClearField("redrive")  # an instruction to this executor, not part of its record
    env.task_id = task_id
    env.status = task.status.to_proto()
    env.generation = task.generation
    env.version = task.version
    env.cancel_requested = task.cancel_requested
    env.status_reason = task.status_reason
    env.updated_at.CopyFrom(to_timestamp(now))
    return env


async def emit_status(
    conn: AsyncConnection,
    task_id: str,
    now: datetime,
    trace: str | None,
    staged: Staged | None = None,
) -> task_pb2.Task:
    """Record a status event for the task's current state in the outbox (same transaction),
    with ``trace``, the trace context of the work that changed it
    (:func:`dispo.libs.tracing.current` where that work runs), staged in ``staged`` if given
    (for publication after commit). Returns the whole envelope (payloads included) for a
    republication; the status event itself carries node states only."""
    env = await snapshot(conn, task_id, now)
    row = OutboxRow(
        tasks.task_status(task_id, env.status),
        tasks.status_id(task_id, env.version),
        tasks.status_snapshot(env).SerializeToString(),
        now,
        trace,
    )
    await outbox_add_many(conn, outbox, [row], staged)
    return env
