"""The ``task_runs`` rows: recorded (with their nodes), leased, moved under guard."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from dispo.executor.domain import NodeRun
from dispo.executor.plan import TaskStatusChange
from dispo.executor.states import TASK_TRANSITIONS, TaskState
from dispo.executor.store.node_runs import NODES_INSERT, node_columns
from dispo.executor.store.rows import TaskRow, task_from_row
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.db.driver import Conn
from dispo.libs.timestamps import from_timestamp

# The ends of a task: reaching one records when (``finished_at``, which retention reads,
# ADR-0105); a resume opening a FAILED task clears it.
FINISHED = (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED)
FINISHED_SQL = ", ".join(repr(s.value) for s in FINISHED)

# A pass may start on a task in these states (and makes it RUNNING); a FAILED one only
# once a redrive was applied to it (a resume).
OPENABLE = (
    TaskState.ACCEPTED,
    TaskState.RUNNING,
    TaskState.RETRY_EXHAUSTED,
    TaskState.DEMOTED,
    TaskState.FAILED,
)


async def tasks_lock_many(
    conn: Conn, task_ids: Iterable[str], *, lock: bool = True, envelopes: bool = False
) -> tuple[dict[str, TaskRow], set[str]]:
    """The recorded tasks among ``task_ids``, locked (``FOR UPDATE``, unless not ``lock``)
    in ``task_id`` order, without their envelopes unless ``envelopes`` (the caller may have
    them), and the ids recorded without one (a cancel arrived first)."""
    ids = sorted(set(task_ids))
    if not ids:
        return {}, set()
    rows = await conn.fetch(
        "SELECT task_id, status, generation, version, cancel_requested, lease_owner,"
        " lease_until, status_reason, envelope IS NULL AS bare,"
        + (" envelope" if envelopes else " NULL::bytea AS envelope")
        + " FROM task_runs WHERE task_id = ANY(CAST(:ids AS text[])) ORDER BY task_id"
        + (" FOR UPDATE" if lock else ""),
        {"ids": ids},
    )
    found = {row.task_id: task_from_row(row) for row in rows}
    bare = {row.task_id for row in rows if row.bare}
    return found, bare


async def tasks_insert_many(
    conn: Conn,
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
    inserted = await conn.fetch(
        "WITH inserted AS (INSERT INTO task_runs (task_id, business, status, generation,"
        " cancel_requested, envelope, lease_owner, lease_until, created_at, updated_at)"
        " SELECT id, business, :running, gen, cancel, env, owner, :until, :now, :now FROM"
        " unnest(CAST(:ids AS text[]), CAST(:businesses AS text[]), CAST(:gens AS bigint[]),"
        " CAST(:cancels AS boolean[]), CAST(:envs AS bytea[]), CAST(:owners AS text[]))"
        " WITH ORDINALITY AS u(id, business, gen, cancel, env, owner, n) ORDER BY n"
        " ON CONFLICT (task_id) DO NOTHING RETURNING task_id),"
        f" nodes AS ({NODES_INSERT} JOIN inserted i ON i.task_id = r.task"
        " ON CONFLICT DO NOTHING),"
        " deadlines AS (INSERT INTO task_deadlines (task_id, deadline)"
        " SELECT d.id, d.deadline FROM unnest(CAST(:ids AS text[]),"
        " CAST(:deadlines AS timestamptz[])) AS d(id, deadline)"
        " JOIN inserted i ON i.task_id = d.id WHERE d.deadline IS NOT NULL"
        " ON CONFLICT DO NOTHING)"
        " SELECT task_id FROM inserted",
        {
            "ids": [e.task_id for e in envs],
            "businesses": [e.business for e in envs],
            "gens": [e.generation for e in envs],
            "cancels": [e.cancel_requested for e in envs],
            "envs": [e.SerializeToString() for e in envs],
            "owners": [owner for _, owner in openings],
            "deadlines": [from_timestamp(e.deadline, e.HasField("deadline")) for e in envs],
            "running": TaskState.RUNNING.value,
            "until": now + timedelta(seconds=ttl),
            "now": now,
            **node_columns(envs, nodes or {}),
        },
    )
    return {row.task_id for row in inserted}


# A task past its deadline that no pass holds: between passes (a short retry waiting for its
# message) or parked with the reconciler. A task a pass holds is closed by that pass's
# next step; one whose pass died, by the next pass its message brings (ADR-0103).
DEADLINE_SWEPT = (TaskState.RUNNING, TaskState.RETRY_EXHAUSTED, TaskState.DEMOTED)


async def tasks_past_deadline_lock_many(
    conn: Conn, now: datetime, limit: int
) -> tuple[list[TaskRow], list[str]]:
    """Up to ``limit`` tasks whose deadline is at or before ``now`` and that no pass holds
    (no lease owner), earliest deadline first, their ``task_deadlines`` rows locked (``SKIP
    LOCKED``: another sweep's are left): those in :data:`DEADLINE_SWEPT`, locked, with their
    envelopes, to close; and the ids of the others, which have ended (their deadline rows
    are done with)."""
    due = await conn.fetch(
        "SELECT d.task_id, t.status FROM task_deadlines d JOIN task_runs t USING (task_id)"
        " WHERE d.deadline <= :now AND t.lease_owner IS NULL"
        " ORDER BY d.deadline LIMIT :limit FOR UPDATE OF d SKIP LOCKED",
        {"now": now, "limit": limit},
    )
    swept = {s.value for s in DEADLINE_SWEPT}
    rows, _ = await tasks_lock_many(
        conn, [r.task_id for r in due if r.status in swept], envelopes=True
    )
    # Under the lock: a pass may have taken one since (it closes it itself).
    closing = [r for r in rows.values() if r.lease_owner is None and r.envelope is not None]
    ended = [r.task_id for r in due if r.status not in swept]
    return closing, ended


async def task_deadlines_delete_many(conn: Conn, task_ids: Sequence[str]) -> None:
    """The deadlines of these tasks done with: each has ended, or was closed."""
    if task_ids:
        await conn.fetch(
            "DELETE FROM task_deadlines WHERE task_id = ANY(CAST(:ids AS text[]))",
            {"ids": sorted(task_ids)},
        )


async def tasks_insert_cancelled_many(
    conn: Conn, task_ids: Sequence[str], reason: str, now: datetime
) -> set[str]:
    """Record tasks cancelled before their task.create arrived: CANCELLED (ACCEPTED →
    CANCELLED, in the insert), the cancel flag set, no envelope and no nodes yet (the
    task.create, if it comes, records them). Returns the ids inserted here (a task recorded
    meanwhile is left as it is)."""
    TASK_TRANSITIONS.check((TaskState.ACCEPTED,), TaskState.CANCELLED)
    if not task_ids:
        return set()
    rows = await conn.fetch(
        "INSERT INTO task_runs (task_id, status, status_reason, generation, cancel_requested,"
        " envelope, created_at, updated_at, finished_at)"
        " SELECT id, :cancelled, :reason, 0, true, NULL, :now, :now, :now"
        " FROM unnest(CAST(:ids AS text[])) AS u(id) ORDER BY id"
        " ON CONFLICT (task_id) DO NOTHING RETURNING task_id",
        {
            "ids": sorted(set(task_ids)),
            "cancelled": TaskState.CANCELLED.value,
            "reason": reason,
            "now": now,
        },
    )
    return {row.task_id for row in rows}


async def tasks_attach_envelopes_many(conn: Conn, envs: Sequence[task_pb2.Task]) -> set[str]:
    """The task.create of tasks recorded without their envelope (a cancel arrived first):
    the envelope and its generation recorded, and the nodes as it states them, where the
    row still has none. Returns the ids attached."""
    if not envs:
        return set()
    envs = sorted(envs, key=lambda e: e.task_id)
    rows = await conn.fetch(
        "WITH attached AS (UPDATE task_runs t SET envelope = u.env, generation = u.gen,"
        " business = u.business"
        " FROM unnest(CAST(:ids AS text[]), CAST(:envs AS bytea[]), CAST(:gens AS bigint[]),"
        " CAST(:businesses AS text[])) AS u(id, env, gen, business)"
        " WHERE t.task_id = u.id AND t.envelope IS NULL"
        " RETURNING t.task_id),"
        f" nodes AS ({NODES_INSERT} JOIN attached a ON a.task_id = r.task"
        " ON CONFLICT DO NOTHING)"
        " SELECT task_id FROM attached",
        {
            "ids": [e.task_id for e in envs],
            "envs": [e.SerializeToString() for e in envs],
            "gens": [e.generation for e in envs],
            "businesses": [e.business for e in envs],
            **node_columns(envs, {}),
        },
    )
    return {row.task_id for row in rows}


async def tasks_open_many(
    conn: Conn, leases: Sequence[tuple[str, str]], now: datetime, ttl: float
) -> set[str]:
    """Take the lease of each ``(task_id, owner)`` and make the task RUNNING, where the
    lease is free, expired or the owner's own and the task is in ``OPENABLE``; returns the
    ids opened."""
    TASK_TRANSITIONS.check(OPENABLE, TaskState.RUNNING)
    if not leases:
        return set()
    opened = await conn.fetch(
        "UPDATE task_runs t SET lease_owner = u.owner, lease_until = :until,"
        " status = :running, status_reason = '', updated_at = :now, finished_at = NULL"
        " FROM unnest(CAST(:ids AS text[]), CAST(:owners AS text[])) AS u(id, owner)"
        " WHERE t.task_id = u.id AND t.status = ANY(CAST(:expected AS text[]))"
        " AND (t.lease_owner IS NULL OR t.lease_owner = u.owner OR t.lease_until <= :now)"
        " RETURNING t.task_id",
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


async def tasks_set_generation_if_newer_many(conn: Conn, envs: Sequence[task_pb2.Task]) -> None:
    """A redrive's generation recorded for each task, where it is newer than the row's."""
    if envs:
        await conn.fetch(
            "UPDATE task_runs t SET generation = u.gen"
            " FROM unnest(CAST(:ids AS text[]), CAST(:gens AS bigint[])) AS u(id, gen)"
            " WHERE t.task_id = u.id AND t.generation < u.gen",
            {"ids": [e.task_id for e in envs], "gens": [e.generation for e in envs]},
        )


async def tasks_resume_if_idle_many(
    conn: Conn, task_ids: Sequence[str], now: datetime
) -> dict[str, int]:
    """A new generation for each task RUNNING with no live lease (parked WAITING, ADR-0102),
    so the task.create that resumes it is a message of its own; returns the tasks bumped,
    each with its new generation (one with a live pass is not: that pass reads its nodes
    again at its next step)."""
    if not task_ids:
        return {}
    TASK_TRANSITIONS.check(TaskState.RUNNING, TaskState.RUNNING)
    rows = await conn.fetch(
        "UPDATE task_runs SET generation = generation + 1, updated_at = :now"
        " WHERE task_id = ANY(CAST(:ids AS text[])) AND status = :running"
        " AND envelope IS NOT NULL AND (lease_owner IS NULL OR lease_until <= :now)"
        " RETURNING task_id, generation",
        {"ids": sorted(set(task_ids)), "now": now, "running": TaskState.RUNNING.value},
    )
    return {row.task_id: row.generation for row in rows}


async def leases_extend_many(
    conn: Conn, leases: Sequence[tuple[str, str]], now: datetime, ttl: float
) -> set[tuple[str, str]]:
    """Extend each ``(task_id, owner)`` lease still held by that owner to ``ttl`` from
    ``now`` (the rows locked in ``task_id`` order first); returns the ``(task_id, owner)``
    pairs extended (a missing one was lost: another owner holds the lease, or none does)."""
    if not leases:
        return set()
    await tasks_lock_many(conn, [task_id for task_id, _ in leases])
    rows = await conn.fetch(
        "UPDATE task_runs t SET lease_until = :until"
        " FROM unnest(CAST(:ids AS text[]), CAST(:owners AS text[])) AS u(id, owner)"
        " WHERE t.task_id = u.id AND t.lease_owner = u.owner"
        " RETURNING t.task_id, t.lease_owner",
        {
            "ids": [task_id for task_id, _ in leases],
            "owners": [owner for _, owner in leases],
            "until": now + timedelta(seconds=ttl),
        },
    )
    return {(row.task_id, row.lease_owner) for row in rows}


async def tasks_set_status_if_many(
    conn: Conn, changes: Sequence[TaskStatusChange], now: datetime
) -> set[str]:
    """Move each task from one of its ``expected`` states to ``new`` (with its reason):
    every move checked first (an undeclared one raises and nothing is written), then one
    guarded statement per kind of change. Returns the ids moved (a missing one was in none
    of its expected states)."""
    for change in changes:
        TASK_TRANSITIONS.check(change.expected, change.new)
    groups: dict[tuple[Any, ...], list[TaskStatusChange]] = {}
    for change in changes:
        groups.setdefault((change.expected, change.new), []).append(change)
    moved: set[str] = set()
    for (expected, new), group in groups.items():
        rows = await conn.fetch(
            "UPDATE task_runs t SET status = :new, status_reason = u.reason, updated_at = :now,"
            f" finished_at = CASE WHEN CAST(:new AS text) IN ({FINISHED_SQL})"
            " THEN COALESCE(t.finished_at, :now) END"
            " FROM unnest(CAST(:ids AS text[]), CAST(:reasons AS text[])) AS u(id, reason)"
            " WHERE t.task_id = u.id AND t.status = ANY(CAST(:expected AS text[]))"
            " RETURNING t.task_id",
            {
                "ids": [c.task_id for c in group],
                "reasons": [c.reason for c in group],
                "new": new.value,
                "expected": [s.value for s in expected],
                "now": now,
            },
        )
        moved.update(row.task_id for row in rows)
    return moved


async def tasks_request_cancel_many(conn: Conn, task_ids: Sequence[str]) -> None:
    """The cancel flag set: a running pass sees it between rounds, and no claim succeeds
    after it."""
    if task_ids:
        await conn.fetch(
            "UPDATE task_runs SET cancel_requested = true WHERE task_id = ANY(CAST(:ids AS text[]))",
            {"ids": sorted(set(task_ids))},
        )


async def tasks_version_at_least_many(conn: Conn, versions: Sequence[tuple[str, int]]) -> None:
    """Another publisher's snapshot of each task had this version: the next one from here
    is newer (a status consumer drops a snapshot that is not)."""
    if versions:
        await conn.fetch(
            "UPDATE task_runs t SET version = u.v"
            " FROM unnest(CAST(:ids AS text[]), CAST(:versions AS bigint[])) AS u(id, v)"
            " WHERE t.task_id = u.id AND t.version < u.v",
            {"ids": [t for t, _ in versions], "versions": [v for _, v in versions]},
        )


async def tasks_next_version_many(
    conn: Conn, task_ids: Sequence[str], now: datetime
) -> list[TaskRow]:
    """A new version for each task (one per status event), its rows read whole, in
    ``task_id`` order."""
    if not task_ids:
        return []
    rows = await conn.fetch(
        "UPDATE task_runs SET version = version + 1, updated_at = :now"
        " WHERE task_id = ANY(CAST(:ids AS text[])) RETURNING *",
        {"ids": sorted(set(task_ids)), "now": now},
    )
    return sorted((task_from_row(row) for row in rows), key=lambda t: t.task_id)
