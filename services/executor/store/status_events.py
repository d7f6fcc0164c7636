"""A task's status snapshot and its events in the outbox (the relay publishes them after
commit), and the task rows a pass's end writes together with its events (ADR-0058)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from dispo.executor.domain import NodeRun
from dispo.executor.envelope import overlay, overlay_row
from dispo.executor.plan import TaskWrite
from dispo.executor.states import TASK_TRANSITIONS, TaskState
from dispo.executor.store.node_runs import node_rows_many
from dispo.executor.store.rows import TaskRow
from dispo.executor.store.task_runs import FINISHED_SQL, tasks_next_version_many
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.contracts import require_declared, tasks
from dispo.libs.db.driver import Conn, Statement
from dispo.libs.outbox import (
    OutboxRow,
    Staged,
    outbox_add_many,
    outbox_insert_from,
    outbox_mark_cte,
    outbox_table,
)
from dispo.libs.timestamps import to_timestamp
from sqlalchemy import MetaData

metadata = MetaData()
outbox = outbox_table(metadata, traced=True)


def written_row(row: TaskRow, w: TaskWrite) -> TaskRow:
    """``row`` (as locked) once ``w`` is applied."""
    return dataclasses.replace(
        row,
        status=w.status or row.status,
        status_reason=w.reason if w.status is not None else row.status_reason,
        generation=row.generation + (1 if w.bump else 0),
        version=row.version + (1 if w.emit else 0),
        lease_owner=None,
        lease_until=None,
    )


# The task rows' writes and their events with one statement: each row is written only if
# its lease owner, its version (as read under the lock) and, for a status, RUNNING still
# hold, and only the events of the rows written are inserted, in the order given; the
# outbox rows the relay published since are deleted (marked sent, ADR-0062).
_WRITE_MANY = Statement(
    "WITH u AS (SELECT * FROM unnest(CAST(:ids AS text[]), CAST(:owners AS text[]),"
    " CAST(:was AS bigint[]), CAST(:versions AS bigint[]),"
    " CAST(:statuses AS text[]), CAST(:reasons AS text[]), CAST(:bumps AS integer[]))"
    " AS u(id, owner, was, version, status, reason, bump)),"
    " written AS (UPDATE task_runs t SET lease_owner = NULL, lease_until = NULL,"
    " status = COALESCE(u.status, t.status),"
    f" finished_at = CASE WHEN u.status IN ({FINISHED_SQL}) THEN :now ELSE t.finished_at END,"
    " status_reason = CASE WHEN u.status IS NULL THEN t.status_reason ELSE u.reason END,"
    " updated_at = :now, generation = t.generation + u.bump, version = u.version"
    " FROM u WHERE t.task_id = u.id AND t.lease_owner = u.owner AND t.version = u.was"
    " AND (u.status IS NULL OR t.status = :running) RETURNING t.task_id),"
    f" {outbox_mark_cte(outbox)},"
    " events AS ("
    + outbox_insert_from(
        outbox,
        "SELECT e.subject, e.msg_id, e.payload, :now, e.trace FROM unnest("
        "CAST(:tasks AS text[]), CAST(:subjects AS text[]), CAST(:msg_ids AS text[]),"
        " CAST(:payloads AS bytea[]), CAST(:traces AS text[]))"
        " WITH ORDINALITY AS e(task, subject, msg_id, payload, trace, n)"
        " WHERE e.task IN (SELECT task_id FROM written) ORDER BY e.n",
    )
    + ") SELECT task_id, NULL AS msg_id, NULL AS id FROM written"
    " UNION ALL SELECT NULL, msg_id, id FROM events"
)


async def tasks_write_many(
    conn: Conn,
    writes: Sequence[TaskWrite],
    locked: Mapping[str, TaskRow],
    now: datetime,
    events: Sequence[tuple[str, str, str]] = (),
    traces: Mapping[str, str | None] | None = None,
    staged: Staged | None = None,
    nodes_known: Mapping[str, Mapping[str, NodeRun]] | None = None,
) -> dict[str, task_pb2.Task | None]:
    """Apply ``writes`` to rows locked in this transaction (``locked``: each as read under
    the lock, its envelope set) and write, with one statement, a status event for each
    write with ``emit`` and ``events`` — ``(task_id, subject, msg_id)``, each carrying its
    task's envelope (a task in ``events`` must ``emit``) — each with its task's trace
    context from ``traces``, staged in ``staged`` if given. Each event's snapshot is built
    here from the row as the write leaves it; a task in ``nodes_known`` has its nodes as
    its node rows hold them (else they are read). A write is guarded by its lease owner,
    the version read under the lock, and (with a status) the task being RUNNING; a write
    that does not hold writes nothing, its events neither. Returns the tasks written, each
    with its snapshot (None without ``emit``)."""
    for w in writes:
        if w.status is not None:
            TASK_TRANSITIONS.check((TaskState.RUNNING,), w.status)
    if not writes:
        return {}
    after = {w.task_id: written_row(locked[w.task_id], w) for w in writes}
    nodes_known = nodes_known or {}
    emitting = [after[w.task_id] for w in writes if w.emit]
    node_rows = await node_rows_many(
        conn, [t.task_id for t in emitting if t.task_id not in nodes_known]
    )
    snaps = build_snapshots(emitting, now, nodes_known, node_rows)
    rows = _event_rows(snaps, events, now, traces)
    for _, row in rows:
        require_declared(row.subject)
    result = await _WRITE_MANY.fetch(
        conn,
        {
            "ids": [w.task_id for w in writes],
            "owners": [w.owner for w in writes],
            "was": [locked[w.task_id].version for w in writes],
            "versions": [after[w.task_id].version for w in writes],
            "statuses": [w.status.value if w.status is not None else None for w in writes],
            "reasons": [w.reason for w in writes],
            "bumps": [1 if w.bump else 0 for w in writes],
            "now": now,
            "running": TaskState.RUNNING.value,
            "tasks": [task_id for task_id, _ in rows],
            "subjects": [r.subject for _, r in rows],
            "msg_ids": [r.msg_id for _, r in rows],
            "payloads": [r.payload for _, r in rows],
            "traces": [r.trace for _, r in rows],
            **(staged or Staged()).mark_params(),
        },
    )
    written = {r.task_id for r in result if r.task_id is not None}
    ids = {r.msg_id: r.id for r in result if r.task_id is None}
    kept = [r for task_id, r in rows if task_id in written]
    if staged is not None:
        staged.add([ids[r.msg_id] for r in kept], kept)
    return {task_id: snaps.get(task_id) for task_id in written}


async def snapshots_many(
    conn: Conn,
    task_ids: Sequence[str],
    now: datetime,
    nodes_known: Mapping[str, Mapping[str, NodeRun]] | None = None,
) -> dict[str, task_pb2.Task]:
    """Each task as recorded now, with a new version number (one per status change), as
    A task in ``nodes_known`` has its
    nodes as its node rows hold them (the caller wrote every one in this transaction): they
    are not read again."""
    nodes_known = nodes_known or {}
    recorded = await tasks_next_version_many(conn, task_ids, now)
    nodes = await node_rows_many(
        conn,
        [t.task_id for t in recorded if t.envelope is not None and t.task_id not in nodes_known],
    )
    return build_snapshots(recorded, now, nodes_known, nodes)


def build_snapshots(
    recorded: Sequence[TaskRow],
    now: datetime,
    nodes_known: Mapping[str, Mapping[str, NodeRun]],
    node_rows: Mapping[str, Mapping[str, Any]],
) -> dict[str, task_pb2.Task]:
    """The status snapshot of each task row as recorded, its nodes from ``nodes_known``
    (by task id) or else from its ``node_runs`` rows (``node_rows``)."""
    snaps: dict[str, task_pb2.Task] = {}
    for task in recorded:
        env = task_pb2.Task()
        if task.envelope is not None:
            env.CopyFrom(task.envelope)
            known = nodes_known.get(task.task_id)
            states, apply = (
                (known, overlay)
                if known is not None
                else (node_rows.get(task.task_id, {}), overlay_row)
            )
            for node in env.nodes:
                if node.node_id in states:  # else the envelope's own state stands
                    apply(node, states[node.node_id])
        env.ClearField("redrive")  # an instruction to this executor, not part of its record
        env.task_id = task.task_id
        env.status = task.status.to_proto()
        env.generation = task.generation
        env.version = task.version
        env.cancel_requested = task.cancel_requested
        env.status_reason = task.status_reason
        env.updated_at.CopyFrom(to_timestamp(now))
        snaps[task.task_id] = env
    return snaps


async def emit_status_many(
    conn: Conn,
    task_ids: Sequence[str],
    now: datetime,
    events: Sequence[tuple[str, str, str]] = (),
    traces: Mapping[str, str | None] | None = None,
    staged: Staged | None = None,
    nodes_known: Mapping[str, Mapping[str, NodeRun]] | None = None,
) -> dict[str, task_pb2.Task]:
    """A status event for each task's current state, then ``events`` — ``(task_id,
    subject, msg_id)``, each carrying its task's whole envelope (a task in ``events`` must
    be in ``task_ids``) — written to the outbox with one statement, each with its task's
    trace context from ``traces`` (by task id), and staged in ``staged``, if given, for
    publication after commit. ``nodes_known``: as for :func:`snapshots_many`. Returns
    the envelopes."""
    snaps = await snapshots_many(conn, task_ids, now, nodes_known)
    rows = [row for _, row in _event_rows(snaps, events, now, traces)]
    await outbox_add_many(conn, outbox, rows, staged)
    return snaps


def _event_rows(
    snaps: Mapping[str, task_pb2.Task],
    events: Sequence[tuple[str, str, str]],
    now: datetime,
    traces: Mapping[str, str | None] | None,
) -> list[tuple[str, OutboxRow]]:
    """The outbox rows, each with its task id: a status event for each snapshot, then
    ``events`` — ``(task_id, subject, msg_id)`` — each carrying its task's snapshot; each
    with its task's trace context from ``traces``."""
    trace = (traces or {}).get
    rows = [
        (
            task_id,
            OutboxRow(
                tasks.task_status(task_id, env.status),
                tasks.status_id(task_id, env.version),
                tasks.status_snapshot(env).SerializeToString(),
                now,
                trace(task_id),
            ),
        )
        for task_id, env in snaps.items()
    ]
    rows.extend(
        (
            task_id,
            OutboxRow(subject, msg_id, snaps[task_id].SerializeToString(), now, trace(task_id)),
        )
        for task_id, subject, msg_id in events
    )
    return rows
