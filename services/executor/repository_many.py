"""The executor's set-based SQL: the guarded writes of :mod:`dispo.executor.repository`
for many tasks at once, one statement per kind of write whatever the number of tasks (the
rows travel as arrays through ``unnest``). Group commit (:class:`dispo.libs.batcher.Batcher`)
hands a flush's tasks to these functions inside one transaction.

The rules are those of :mod:`~dispo.executor.repository`: every move is checked against
``NODE_TRANSITIONS`` / ``TASK_TRANSITIONS`` before anything is written, every ``UPDATE``
carries its expected state (and owner) in its ``WHERE`` clause, and ``RETURNING`` says which
rows moved: a row missing from it is a race another writer won, reported to the caller.
Rows are locked in ``task_id`` order, so two executors locking overlapping batches queue
behind each other instead of deadlocking.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from dispo.executor.domain import NodeRun
from dispo.executor.envelope import node_from_proto, overlay, overlay_row
from dispo.executor.plan import NodeChange, TaskWrite
from dispo.executor.repository import TaskRow, node_runs_from_rows, outbox, task_from_row
from dispo.executor.states import NODE_TRANSITIONS, TASK_TRANSITIONS, NodeState, TaskState
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.contracts import require_declared, tasks
from dispo.libs.db.driver import Statement, fetch
from dispo.libs.outbox import (
    OutboxRow,
    Staged,
    outbox_add_many,
    outbox_insert_from,
    outbox_mark_cte,
)
from dispo.libs.timestamps import to_timestamp
from sqlalchemy.ext.asyncio import AsyncConnection

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
}


async def tasks_lock_many(
    conn: AsyncConnection, task_ids: Iterable[str], *, lock: bool = True
) -> tuple[dict[str, TaskRow], set[str]]:
    """The recorded tasks among ``task_ids``, locked (``FOR UPDATE``, unless not ``lock``)
    in ``task_id`` order, without their envelopes (the caller has them), and the ids
    recorded without one (a cancel arrived first)."""
    ids = sorted(set(task_ids))
    if not ids:
        return {}, set()
    rows = await fetch(
        conn,
        (
            "SELECT task_id, status, generation, version, cancel_requested, lease_owner,"
            " lease_until, status_reason, envelope IS NULL AS bare FROM task_runs"
            " WHERE task_id = ANY(CAST(:ids AS text[])) ORDER BY task_id"
            + (" FOR UPDATE" if lock else "")
        ),
        {"ids": ids},
    )
    found: dict[str, TaskRow] = {}
    bare: set[str] = set()
    for row in rows:
        found[row.task_id] = TaskRow(
            row.task_id,
            TaskState(row.status),
            row.generation,
            row.version,
            row.cancel_requested,
            row.lease_owner,
            row.lease_until,
            None,
            row.status_reason,
        )
        if row.bare:
            bare.add(row.task_id)
    return found, bare


async def tasks_insert_many(
    conn: AsyncConnection,
    openings: Sequence[tuple[task_pb2.Task, str]],
    now: datetime,
    ttl: float,
    nodes: Mapping[str, Mapping[str, NodeRun]] | None = None,
) -> set[str]:
    """Record tasks first seen, with their nodes, each ``(envelope, owner)`` already opened:
    RUNNING under ``owner``'s lease for ``ttl`` from ``now`` (ACCEPTED → RUNNING, as
    :func:`tasks_open_many` would take it, in the same statement as the insert). One
    statement for the tasks and their nodes; returns the ids inserted here (a task another
    transaction recorded first is left as it is, with its nodes, and its id is not
    returned). ``nodes``: each task's nodes as its envelope states them
    (:func:`~dispo.executor.envelope.node_from_proto`, by task id), when the caller has
    made them already."""
    TASK_TRANSITIONS.check((TaskState.ACCEPTED,), TaskState.RUNNING)
    openings = sorted(openings, key=lambda o: o[0].task_id)  # insertion order is lock order
    if not openings:
        return set()
    envs = [env for env, _ in openings]
    inserted = await fetch(
        conn,
        (
            "WITH inserted AS (INSERT INTO task_runs (task_id, status, generation,"
            " cancel_requested, envelope, lease_owner, lease_until, created_at, updated_at)"
            " SELECT id, :running, gen, cancel, env, owner, :until, :now, :now FROM unnest("
            "CAST(:ids AS text[]), CAST(:gens AS bigint[]), CAST(:cancels AS boolean[]),"
            " CAST(:envs AS bytea[]), CAST(:owners AS text[]))"
            " WITH ORDINALITY AS u(id, gen, cancel, env, owner, n) ORDER BY n"
            " ON CONFLICT (task_id) DO NOTHING RETURNING task_id),"
            f" nodes AS ({_NODES_INSERT} JOIN inserted i ON i.task_id = r.task"
            " ON CONFLICT DO NOTHING)"
            " SELECT task_id FROM inserted"
        ),
        {
            "ids": [e.task_id for e in envs],
            "gens": [e.generation for e in envs],
            "cancels": [e.cancel_requested for e in envs],
            "envs": [e.SerializeToString() for e in envs],
            "owners": [owner for _, owner in openings],
            "running": TaskState.RUNNING.value,
            "until": now + timedelta(seconds=ttl),
            "now": now,
            **_node_columns(envs, nodes or {}),
        },
    )
    return {row.task_id for row in inserted}


# The nodes of tasks being recorded, from the columns of :func:`_node_columns` (``r``).
_NODES_INSERT = (
    "INSERT INTO node_runs (task_id, node_id, position, status, attempts, round_attempts,"
    " not_before, retryable, last_error, started_at, finished_at)"
    " SELECT r.task, r.node, r.pos, r.status, r.att, r.round, r.nb, r.retr, r.err, r.sa, r.fa"
    " FROM unnest(CAST(:task AS text[]), CAST(:node AS text[]), CAST(:pos AS integer[]),"
    " CAST(:status AS text[]), CAST(:att AS integer[]), CAST(:round AS integer[]),"
    " CAST(:nb AS timestamptz[]), CAST(:retr AS boolean[]), CAST(:err AS text[]),"
    " CAST(:sa AS timestamptz[]), CAST(:fa AS timestamptz[]))"
    " AS r(task, node, pos, status, att, round, nb, retr, err, sa, fa)"
)


def _node_columns(
    envs: Sequence[task_pb2.Task], made: Mapping[str, Mapping[str, NodeRun]]
) -> dict[str, list[Any]]:
    """The nodes of ``envs`` as the arrays :data:`_NODES_INSERT` reads, as each envelope
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


# A pass may start on a task in these states (and makes it RUNNING); a FAILED one only
# once a redrive was applied to it (a resume: ``passes.Passes.open_one``).
OPENABLE = (
    TaskState.ACCEPTED,
    TaskState.RUNNING,
    TaskState.RETRY_EXHAUSTED,
    TaskState.DEMOTED,
    TaskState.FAILED,
)


async def tasks_open_many(
    conn: AsyncConnection, leases: Sequence[tuple[str, str]], now: datetime, ttl: float
) -> set[str]:
    """Take the lease of each ``(task_id, owner)`` and make the task RUNNING, where the
    lease is free, expired or the owner's own and the task is in ``OPENABLE``; returns the
    ids opened."""
    TASK_TRANSITIONS.check(OPENABLE, TaskState.RUNNING)
    if not leases:
        return set()
    opened = await fetch(
        conn,
        (
            "UPDATE task_runs t SET lease_owner = u.owner, lease_until = :until,"
            " status = :running, status_reason = '', updated_at = :now"
            " FROM unnest(CAST(:ids AS text[]), CAST(:owners AS text[])) AS u(id, owner)"
            " WHERE t.task_id = u.id AND t.status = ANY(CAST(:expected AS text[]))"
            " AND (t.lease_owner IS NULL OR t.lease_owner = u.owner OR t.lease_until <= :now)"
            " RETURNING t.task_id"
        ),
        {
            "ids": [task_id for task_id, _ in leases],
            "owners": [owner for _, owner in leases],
            "until": now + timedelta(seconds=ttl),
            "now": now,
            "running": TaskState.RUNNING.value,
            "expected": [s.value for s in OPENABLE],
        },
    )
    return {row.task_id for row in opened}


async def nodes_get_many(
    conn: AsyncConnection,
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


async def node_rows_many(
    conn: AsyncConnection, task_ids: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Each task's ``node_runs`` rows by node id, by task id (one statement for all)."""
    if not task_ids:
        return {}
    by_task: dict[str, dict[str, Any]] = {t: {} for t in task_ids}
    rows = await fetch(
        conn,
        ("SELECT * FROM node_runs WHERE task_id = ANY(CAST(:ids AS text[]))"),
        {"ids": list(by_task)},
    )
    for row in rows:
        by_task[row.task_id][row.node_id] = row
    return by_task


async def leases_extend_many(
    conn: AsyncConnection, leases: Sequence[tuple[str, str]], now: datetime, ttl: float
) -> set[tuple[str, str]]:
    """Extend each ``(task_id, owner)`` lease still held by that owner to ``ttl`` from
    ``now`` (the rows locked in ``task_id`` order first); returns the ``(task_id, owner)``
    pairs extended (a missing one was lost: another owner holds the lease, or none does)."""
    if not leases:
        return set()
    await tasks_lock_many(conn, [task_id for task_id, _ in leases])
    rows = await fetch(
        conn,
        (
            "UPDATE task_runs t SET lease_until = :until"
            " FROM unnest(CAST(:ids AS text[]), CAST(:owners AS text[])) AS u(id, owner)"
            " WHERE t.task_id = u.id AND t.lease_owner = u.owner"
            " RETURNING t.task_id, t.lease_owner"
        ),
        {
            "ids": [task_id for task_id, _ in leases],
            "owners": [owner for _, owner in leases],
            "until": now + timedelta(seconds=ttl),
        },
    )
    return {(row.task_id, row.lease_owner) for row in rows}


async def nodes_set_status_if_many(
    conn: AsyncConnection, changes: Sequence[NodeChange]
) -> list[bool]:
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
        rows = await fetch(
            conn,
            (
                f"UPDATE node_runs r SET status = :new{sets}"
                f" FROM unnest({arrays}) AS u({', '.join(columns)})"
                " WHERE r.task_id = u.task AND r.node_id = u.node AND r.status = :expected"
                + (" AND r.run_owner = u.owner" if owned else "")
                + " RETURNING r.task_id, r.node_id, r.run_owner"
            ),
            params,
        )
        # An owned change is answered by the owner the row was written under, never by
        # the node alone: of two owners' changes of one node, only the runner's applied.
        applied.update((row.task_id, row.node_id, row.run_owner if owned else None) for row in rows)
    return [(change.task_id, change.node_id, change.owner) in applied for change in changes]


@dataclass(frozen=True)
class Claimed:
    attempts: int
    round_attempts: int


async def nodes_claim_if_pending_many(
    conn: AsyncConnection, claims: Sequence[ClaimKey], now: datetime
) -> dict[ClaimKey, Claimed]:
    """PENDING → RUNNING for each ``(task_id, node_id, owner)``, only for the lease holder
    and not once a cancel is requested (the claim exactly one contender wins); returns the
    claims won, by ``(task_id, node_id, owner)``, with the node's new attempt counts."""
    NODE_TRANSITIONS.check(NodeState.PENDING, NodeState.RUNNING)
    return await _claim_many(conn, claims, now, "status = 'running', finished_at = NULL")


async def nodes_run_noop_many(
    conn: AsyncConnection, claims: Sequence[ClaimKey], now: datetime
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
    conn: AsyncConnection, claims: Sequence[ClaimKey], now: datetime, outcome: str
) -> dict[ClaimKey, Claimed]:
    """The guarded claim of :func:`nodes_claim_if_pending_many`, setting ``outcome`` (the
    node's status and result columns) besides the claim's own."""
    if not claims:
        return {}
    rows = await fetch(
        conn,
        (
            f"UPDATE node_runs r SET {outcome}, run_owner = u.owner,"
            " attempts = r.attempts + 1, round_attempts = r.round_attempts + 1,"
            " started_at = :now, not_before = NULL"
            " FROM unnest(CAST(:tasks AS text[]), CAST(:nodes AS text[]), CAST(:owners AS text[]))"
            " AS u(task, node, owner)"
            " WHERE r.task_id = u.task AND r.node_id = u.node AND r.status = 'pending'"
            " AND EXISTS (SELECT 1 FROM task_runs t WHERE t.task_id = u.task"
            " AND t.lease_owner = u.owner AND NOT t.cancel_requested)"
            " RETURNING r.task_id, r.node_id, r.run_owner, r.attempts, r.round_attempts"
        ),
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
    conn: AsyncConnection,
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
    conn: AsyncConnection,
    task_ids: Sequence[str],
    now: datetime,
    nodes_known: Mapping[str, Mapping[str, NodeRun]] | None = None,
) -> dict[str, task_pb2.Task]:
    """Each task as recorded now, with a new version number (one per status change), as
    :func:`dispo.executor.repository.snapshot` for one. A task in ``nodes_known`` has its
    nodes as its node rows hold them (the caller wrote every one in this transaction): they
    are not read again."""
    nodes_known = nodes_known or {}
    if not task_ids:
        return {}
    rows = await fetch(
        conn,
        (
            "UPDATE task_runs SET version = version + 1, updated_at = :now"
            " WHERE task_id = ANY(CAST(:ids AS text[])) RETURNING *"
        ),
        {"ids": sorted(set(task_ids)), "now": now},
    )
    recorded = sorted((task_from_row(row) for row in rows), key=lambda t: t.task_id)
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
    conn: AsyncConnection,
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
