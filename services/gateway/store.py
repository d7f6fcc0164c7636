"""All SQL of the gateway: tasks as accepted, their status view, and the outbox. Every
statement runs on the driver port (:mod:`dispo.libs.db.driver`); a cancel's runs in a
SQLAlchemy transaction still (:func:`task_get`, :func:`task_set_view` and
:func:`tasks_request_cancel_if_unrequested_many` take either), as :func:`outbox_withdraw_create`
and :func:`emit` need one until the outbox's withdrawal and single insert are on the
port."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.contracts import require_declared, tasks
from dispo.libs.db.driver import Conn, Statement
from dispo.libs.outbox import (
    OutboxRow,
    Staged,
    outbox_add,
    outbox_insert_from,
    outbox_mark_cte,
    outbox_table,
    outbox_withdraw,
)
from dispo.libs.retention import (
    Purged,
    businesses_statement,
    cutoff_params,
    due_statement,
    past_cutoff,
)
from sqlalchemy import MetaData

metadata = MetaData()
outbox = outbox_table(metadata, traced=True, withdrawable=True, delayable=True)


@dataclass
class TaskRecord:
    task_id: str
    business: str
    idempotency_key: str | None
    request_hash: str
    status: str
    cancel_requested: bool
    node_count: int
    version: int
    view: task_pb2.Task
    created_at: datetime
    updated_at: datetime
    callback_url: str = ""
    finished_at: datetime | None = None
    not_before: datetime | None = None
    deadline: datetime | None = None
    labels: dict[str, str] = field(default_factory=dict)
    # Set once the task's user data was erased (ADR-0113).
    erased_at: datetime | None = None
    erased_by: str = ""


def _labels(value: Any) -> dict[str, str]:
    """The labels column as read (jsonb arrives as its JSON text; NULL: none)."""
    if value is None:
        return {}
    return dict(json.loads(value) if isinstance(value, str | bytes) else value)


def _record(row: Any) -> TaskRecord:
    view = task_pb2.Task.FromString(row.view)
    if row.accepted is not None:  # the view is an executor snapshot: payloads come from here
        for ref, payload in task_pb2.Task.FromString(row.accepted).payloads.items():
            view.payloads[ref].CopyFrom(payload)
    return TaskRecord(
        row.task_id,
        row.business,
        row.idempotency_key,
        row.request_hash,
        row.status,
        row.cancel_requested,
        row.node_count,
        row.version,
        view,
        row.created_at,
        row.updated_at,
        row.callback_url,
        row.finished_at,
        row.not_before,
        row.deadline,
        _labels(row.labels),
        row.erased_at,
        row.erased_by or "",
    )


@dataclass(frozen=True)
class TaskSummary:
    """A task as a list shows it: no view, no payloads (neither is read or parsed)."""

    task_id: str
    business: str
    status: str
    cancel_requested: bool
    node_count: int
    created_at: datetime
    updated_at: datetime
    not_before: datetime | None = None
    deadline: datetime | None = None
    priority: int = tasks.DEFAULT_PRIORITY
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, row: Any) -> TaskSummary:
        """A row of :data:`_SUMMARY_COLUMNS`, its labels (the last column) parsed."""
        values = list(row)
        values[-1] = _labels(values[-1])
        return cls(*values)


_SUMMARY_COLUMNS = ", ".join(TaskSummary.__dataclass_fields__)


# Statuses a task never leaves.
TERMINAL = ("succeeded", "failed", "cancelled")
# A task reaching a terminal status records when it finished (the first time only).


def _finish(status: str, finished_at: str) -> str:
    """``finished_at`` set to ``:now`` the first time ``status`` is terminal, else kept."""
    return (
        f"CASE WHEN {status} IN ({', '.join(repr(s) for s in TERMINAL)})"
        f" THEN COALESCE({finished_at}, :now) ELSE {finished_at} END"
    )


_FINISH = f"finished_at = {_finish('CAST(:status AS text)', 'finished_at')}"


@dataclass(frozen=True)
class NewTask:
    """A task to insert: its envelope serialised once (the stored view and the task.create
    payload are the same bytes)."""

    task_id: str
    business: str
    idempotency_key: str  # "" for none
    request_hash: str
    node_count: int
    view: bytes
    callback_url: str
    created_at: datetime
    # The Submit's trace context (None: none to carry), for its task.create row.
    trace: str | None = None
    # Its delayed start (its task.create row waits for it) and its deadline (ADR-0103).
    not_before: datetime | None = None
    deadline: datetime | None = None
    # Its labels as JSON text (None: none; ADR-0110).
    labels: str | None = None
    priority: int = tasks.DEFAULT_PRIORITY  # ADR-0109


@dataclass(frozen=True)
class KeyHolder:
    """The task holding an idempotency key: what a duplicate Submit is answered from."""

    task_id: str
    request_hash: str
    status: str


# The accepted tasks and their task.create rows, with one statement: the tasks whose key is
# free are inserted, and each inserted task's envelope (its stored view, not sent twice) goes
# to the outbox, in the order given (withdrawable only if no direct publisher takes them,
# ADR-0090); the rows the relay published since are deleted (marked sent, ADR-0062). A
# delayed task's row waits for its not_before (``available_at``), withdrawable: no direct
# publisher takes it (ADR-0103).
_ACCEPT_MANY = Statement(
    "WITH inserted AS (INSERT INTO tasks (task_id, business, idempotency_key, request_hash,"
    " status, node_count, view, callback_url, created_at, updated_at, not_before, deadline,"
    " priority, labels)"
    " SELECT id, business, NULLIF(key, ''), hash, 'accepted', nodes, view, callback, created,"
    " created, not_before, deadline, priority, CAST(labels AS jsonb)"
    " FROM unnest(CAST(:ids AS text[]),"
    " CAST(:businesses AS text[]), CAST(:keys AS text[]), CAST(:hashes AS text[]),"
    " CAST(:nodes AS integer[]), CAST(:views AS bytea[]), CAST(:callbacks AS text[]),"
    " CAST(:created AS timestamptz[]), CAST(:not_befores AS timestamptz[]),"
    " CAST(:deadlines AS timestamptz[]), CAST(:priorities AS smallint[]),"
    " CAST(:labels AS text[]))"
    " WITH ORDINALITY AS r(id, business, key, hash, nodes, view, callback, created,"
    " not_before, deadline, priority, labels, n) ORDER BY n"
    " ON CONFLICT (business, idempotency_key) DO NOTHING"
    " RETURNING task_id, view, created_at, not_before),"
    f" {outbox_mark_cte(outbox)} "
    + outbox_insert_from(
        outbox,
        "SELECT :subject, e.msg_id, i.view, i.created_at, e.trace,"
        " CAST(:withdrawable AS boolean) OR i.not_before IS NOT NULL, i.not_before"
        " FROM unnest(CAST(:ids AS text[]), CAST(:msg_ids AS text[]),"
        " CAST(:traces AS text[])) WITH ORDINALITY AS e(id, msg_id, trace, n)"
        " JOIN inserted i ON i.task_id = e.id ORDER BY e.n",
    )
)


async def tasks_accept_many(conn: Conn, rows: list[NewTask], staged: Staged) -> set[str]:
    """Insert the accepted tasks and their task.create events with one statement (atomic by
    itself: run it outside a transaction, it commits alone), in the order given; returns the
    ids inserted, their events staged in ``staged`` (a delayed task's is left to a pass,
    once its not_before is due). A row whose (business, idempotency_key)
    is taken already, by a committed task or an earlier row of the same call, is skipped
    with its event (a concurrent transaction holding the key is waited for). Rows without a
    key never conflict."""
    if not rows:
        return set()
    require_declared(tasks.TASK_CREATE)
    msg_ids = [tasks.create_id(r.task_id, 0) for r in rows]
    result = await _ACCEPT_MANY.fetch(
        conn,
        {
            "ids": [r.task_id for r in rows],
            "businesses": [r.business for r in rows],
            "keys": [r.idempotency_key for r in rows],
            "hashes": [r.request_hash for r in rows],
            "nodes": [r.node_count for r in rows],
            "views": [r.view for r in rows],
            "callbacks": [r.callback_url for r in rows],
            "created": [r.created_at for r in rows],
            "not_befores": [r.not_before for r in rows],
            "deadlines": [r.deadline for r in rows],
            "labels": [r.labels for r in rows],
            "priorities": [r.priority for r in rows],
            "subject": tasks.TASK_CREATE,
            "msg_ids": msg_ids,
            "traces": [r.trace for r in rows],
            "withdrawable": staged.withdrawable,
            **staged.mark_params(),
        },
    )
    written = {msg_id: row_id for row_id, msg_id in result}
    inserted: set[str] = set()
    ids: list[int] = []
    events: list[OutboxRow] = []
    for r, msg_id in zip(rows, msg_ids, strict=True):
        row_id = written.get(msg_id)
        if row_id is not None:
            inserted.add(r.task_id)
            if r.not_before is not None:  # a pass publishes it once due
                continue
            ids.append(row_id)
            events.append(OutboxRow(tasks.TASK_CREATE, msg_id, r.view, r.created_at, r.trace))
    staged.add(ids, events)
    return inserted


_BY_KEYS = Statement(
    "SELECT t.business, t.idempotency_key, t.task_id, t.request_hash, t.status FROM tasks t"
    " JOIN unnest(CAST(:businesses AS text[]), CAST(:keys AS text[])) AS k(business, key)"
    " ON t.business = k.business AND t.idempotency_key = k.key"
)


async def tasks_by_keys(
    conn: Conn, keys: list[tuple[str, str]]
) -> dict[tuple[str, str], KeyHolder]:
    """The tasks holding these (business, idempotency_key) pairs, with one statement."""
    if not keys:
        return {}
    rows = await _BY_KEYS.fetch(
        conn, {"businesses": [b for b, _ in keys], "keys": [k for _, k in keys]}
    )
    return {
        (r.business, r.idempotency_key): KeyHolder(r.task_id, r.request_hash, r.status)
        for r in rows
    }


_GET = Statement("SELECT * FROM tasks WHERE task_id = :id")


async def task_get(conn: Conn, task_id: str) -> TaskRecord | None:
    rows = await conn.fetch(_GET, {"id": task_id})
    return _record(rows[0]) if rows else None


@dataclass(frozen=True)
class Snapshot:
    """An executor's status snapshot of one task: node states, no payloads."""

    task_id: str
    version: int
    status: str
    view: bytes  # the event's own bytes: stored as they came
    generation: int = 0


# The terminal status a resume leaves (the others are never left).
RESUMABLE = "failed"

_APPLY_SNAPSHOTS = Statement(
    "UPDATE tasks t SET accepted = COALESCE(t.accepted, t.view), view = n.view,"
    " status = n.status, version = n.version, generation = n.generation, updated_at = :now,"
    f" finished_at = {_finish('n.status', 't.finished_at')}"
    " FROM unnest(CAST(:ids AS text[]), CAST(:versions AS bigint[]),"
    " CAST(:statuses AS text[]), CAST(:views AS bytea[]), CAST(:generations AS bigint[]))"
    " AS n(task_id, version, status, view, generation)"
    " WHERE t.task_id = n.task_id AND t.version < n.version"
    # A terminal view never regresses: SUCCEEDED and CANCELLED take only their own status
    # again, FAILED another one only from a newer generation (a resume, ADR-0033). A task
    # cancelled before publication was provably never sent (ADR-0090): its view is kept too.
    " AND (t.status = n.status"
    f" OR t.status NOT IN ({', '.join(repr(s) for s in TERMINAL)})"
    f" OR (t.status = '{RESUMABLE}' AND n.generation > t.generation))"
    " RETURNING t.task_id"
)


async def tasks_apply_snapshots(conn: Conn, snapshots: list[Snapshot], now: datetime) -> set[str]:
    """Take executor snapshots into the view with one statement, each unless a newer one was
    applied already or it would take a terminal view an executor recorded to another status
    (a FAILED one only under a newer generation); returns the ids of the tasks changed. At most one snapshot per
    task. The first snapshot of a task keeps the view as accepted (its payloads) in
    ``accepted``."""
    if not snapshots:
        return set()
    result = await _APPLY_SNAPSHOTS.scalars(
        conn,
        {
            "ids": [s.task_id for s in snapshots],
            "versions": [s.version for s in snapshots],
            "statuses": [s.status for s in snapshots],
            "views": [s.view for s in snapshots],
            "generations": [s.generation for s in snapshots],
            "now": now,
        },
    )
    return set(result)


_REQUEST_CANCEL = Statement(
    "UPDATE tasks SET cancel_requested = true, updated_at = :now"
    " WHERE task_id = ANY(CAST(:ids AS text[])) AND NOT cancel_requested RETURNING task_id"
)


async def tasks_request_cancel_if_unrequested_many(
    conn: Conn, task_ids: list[str], now: datetime
) -> set[str]:
    """Set the cancel flag of every task of ``task_ids`` whose flag is not set yet, in one
    statement; the ids it set (not those set already, nor unknown ones)."""
    if not task_ids:
        return set()
    rows = await conn.fetch(_REQUEST_CANCEL, {"ids": task_ids, "now": now})
    return {r[0] for r in rows}


async def outbox_withdraw_create(conn: Conn, msg_id: str) -> bool:
    """Take back a task.create that was never published and never will be; False if it
    may have been (a publisher took it, :func:`~dispo.libs.outbox.outbox_withdraw`) or is
    gone."""
    return await outbox_withdraw(conn, outbox, tasks.TASK_CREATE, msg_id)


_SET_VIEW = Statement(
    "UPDATE tasks SET view = :view, status = :status, updated_at = :now, "
    + _FINISH
    + " WHERE task_id = :id"
)


async def task_set_view(
    conn: Conn, task_id: str, view: task_pb2.Task, status: str, now: datetime
) -> None:
    await conn.fetch(
        _SET_VIEW,
        {"id": task_id, "view": view.SerializeToString(), "status": status, "now": now},
    )


@dataclass(frozen=True)
class TaskFilter:
    """Which tasks a list or a count takes: each field set narrows it ("" and None: any)."""

    business: str = ""
    created_after: datetime | None = None
    created_before: datetime | None = None
    idempotency_key: str = ""
    # Only tasks ACCEPTED with a not_before after this instant: scheduled (ADR-0103).
    scheduled_at: datetime | None = None
    # Only tasks carrying every one of these labels (ADR-0110).
    labels: tuple[tuple[str, str], ...] = ()
    # Only tasks of any of these priorities (1 highest … 5).
    priorities: tuple[int, ...] = ()

    def where(self, params: dict[str, Any]) -> list[str]:
        """The SQL conditions, their values added to ``params``. A business and a key use the
        unique (business, idempotency_key) index, a key alone ix_tasks_idempotency_key, a
        business and a window ix_tasks_business_created, a window alone ix_tasks_created,
        priorities other than the default ix_tasks_priority."""
        clauses: list[str] = []
        if self.business:
            clauses.append("business = :business")
            params["business"] = self.business
        if self.idempotency_key:
            clauses.append("idempotency_key = :key")
            params["key"] = self.idempotency_key
        if self.created_after is not None:
            clauses.append("created_at >= CAST(:after_t AS timestamptz)")
            params["after_t"] = self.created_after
        if self.created_before is not None:
            clauses.append("created_at < CAST(:before_t AS timestamptz)")
            params["before_t"] = self.created_before
        if self.scheduled_at is not None:  # ix_tasks_scheduled
            clauses.append(
                "status = 'accepted' AND not_before IS NOT NULL"
                " AND not_before > CAST(:scheduled_t AS timestamptz)"
            )
            params["scheduled_t"] = self.scheduled_at
        if self.labels:  # containment: ix_tasks_labels (GIN, jsonb_path_ops)
            clauses.append("labels @> CAST(:labels AS jsonb)")
            params["labels"] = json.dumps(dict(self.labels), sort_keys=True)
        if self.priorities:
            # Written into the statement (whole numbers 1 to 5, checked at the edge), not a
            # parameter: the planner then sees which priorities, and uses ix_tasks_priority
            # (over the tasks not at the default 3) for the rarer ones, under a generic plan
            # too.
            listed = ", ".join(str(int(p)) for p in self.priorities)
            clauses.append(f"priority IN ({listed})")
        return clauses


def _where(clauses: list[str]) -> str:
    return f"WHERE {' AND '.join(clauses)}" if clauses else ""


async def task_list(
    conn: Conn,
    matching: TaskFilter,
    *,
    statuses: list[str],
    after: tuple[datetime, str] | None,
    limit: int,
    newest_first: bool = True,
) -> list[TaskSummary]:
    """Matching tasks by (created_at, task_id), newest first unless ``newest_first`` is
    False; ``after`` is the key of the last row of the previous page."""
    params: dict[str, Any] = {"limit": limit}
    clauses = matching.where(params)
    if statuses:
        clauses.append("status = ANY(CAST(:statuses AS text[]))")
        params["statuses"] = statuses
    if after is not None:
        clauses.append(
            f"(created_at, task_id) {'<' if newest_first else '>'}"
            " (CAST(:cur_t AS timestamptz), CAST(:cur_id AS text))"
        )
        params["cur_t"], params["cur_id"] = after
    direction = "DESC" if newest_first else "ASC"
    rows = await conn.fetch(
        f"SELECT {_SUMMARY_COLUMNS} FROM tasks {_where(clauses)}"
        f" ORDER BY created_at {direction}, task_id {direction} LIMIT CAST(:limit AS integer)",
        params,
    )
    return [TaskSummary.of(r) for r in rows]


async def task_counts(conn: Conn, matching: TaskFilter) -> dict[str, int]:
    """How many matching tasks each stored status holds (statuses holding none are absent),
    with one statement."""
    params: dict[str, Any] = {}
    rows = await conn.fetch(
        f"SELECT status, count(*) FROM tasks {_where(matching.where(params))} GROUP BY status",
        params,
    )
    return {status: count for status, count in rows}


async def emit(conn: Conn, subject: str, msg_id: str, payload: bytes, now: datetime) -> None:
    await outbox_add(conn, outbox, subject, msg_id, payload, now)


async def signals_insert_if_new(
    conn: Conn, task_id: str, signal_id: str, signal: str, payload: bytes, now: datetime
) -> bool:
    """Record a task's signal under its id; False when the id was recorded before (then
    nothing is written)."""
    rows = await conn.fetch(
        "INSERT INTO signals (task_id, signal_id, signal, payload, created_at)"
        " VALUES (:task, :id, :signal, :payload, :now)"
        " ON CONFLICT (task_id, signal_id) DO NOTHING RETURNING signal_id",
        {"task": task_id, "id": signal_id, "signal": signal, "payload": payload, "now": now},
    )
    return bool(rows)


async def signal_recorded(conn: Conn, task_id: str, signal_id: str) -> bool:
    """Whether the task's signal of that id was recorded."""
    rows = await conn.fetch(
        "SELECT 1 AS one FROM signals WHERE task_id = :task AND signal_id = :id",
        {"task": task_id, "id": signal_id},
    )
    return bool(rows)


# ---- erasure (ADR-0113) ------------------------------------------------------------------
_GET_FOR_ERASE = Statement("SELECT * FROM tasks WHERE task_id = :id FOR UPDATE")


@dataclass(frozen=True)
class Erasure:
    """A finished task's tombstoned view and envelope as accepted, and who erased it."""

    task_id: str
    view: bytes
    accepted: bytes | None
    erased_by: str


# The tasks still finished and not erased take their tombstones, with their signals'
# payloads; the quarantined messages that name them are discarded (their bodies carry the
# payloads a replay would send again).
_ERASE_IF_FINISHED = Statement(
    "WITH e AS (SELECT * FROM unnest(CAST(:ids AS text[]), CAST(:views AS bytea[]),"
    " CAST(:accepted AS bytea[]), CAST(:bys AS text[])) AS e(task_id, view, accepted, by)),"
    " done AS (UPDATE tasks t SET view = e.view, accepted = e.accepted, erased_at = :now,"
    " erased_by = e.by FROM e WHERE t.task_id = e.task_id AND t.erased_at IS NULL"
    f" AND t.status IN ({', '.join(repr(s) for s in TERMINAL)}) RETURNING t.task_id),"
    " sig AS (UPDATE signals s SET payload = :tombstone FROM done d"
    " WHERE s.task_id = d.task_id RETURNING 1),"
    " q AS (DELETE FROM quarantine q USING done d"
    " WHERE position(convert_to(d.task_id, 'UTF8') IN q.payload) > 0 RETURNING 1)"
    " SELECT task_id FROM done"
)


async def task_get_for_erase(conn: Conn, task_id: str) -> TaskRecord | None:
    """The task, its row locked until the transaction ends."""
    rows = await _GET_FOR_ERASE.fetch(conn, {"id": task_id})
    return _record(rows[0]) if rows else None


_ROW_BYTES = Statement("SELECT view, accepted FROM tasks WHERE task_id = :id")


async def task_row_bytes(conn: Conn, task_id: str) -> tuple[bytes, bytes | None]:
    """The task's stored view and envelope as accepted, as stored."""
    (row,) = await _ROW_BYTES.fetch(conn, {"id": task_id})
    return bytes(row.view), None if row.accepted is None else bytes(row.accepted)


async def tasks_erase_if_finished_many(
    conn: Conn, erasures: list[Erasure], tombstone: bytes, now: datetime
) -> set[str]:
    """Write the erasures of the tasks that are finished and not erased yet, their signals'
    payloads replaced by ``tombstone`` and their quarantined messages discarded, with one
    statement; answers the tasks erased."""
    rows = await _ERASE_IF_FINISHED.fetch(
        conn,
        {
            "ids": [e.task_id for e in erasures],
            "views": [e.view for e in erasures],
            "accepted": [e.accepted for e in erasures],
            "bys": [e.erased_by for e in erasures],
            "tombstone": tombstone,
            "now": now,
        },
    )
    return {r.task_id for r in rows}


# ---- retention (ADR-0105) ---------------------------------------------------------------
# A finished task: terminal, finished before the cutoff and not changed since (a resumed
# one ran again). Read by ix_tasks_business_created.
_FINISHED = (
    f"t.status IN ({', '.join(repr(s) for s in TERMINAL)}) AND t.finished_at < p.cutoff"
    " AND t.updated_at < p.cutoff"
)
_BUSINESSES_FINISHED = Statement(businesses_statement("tasks"))
_DELETE_IF_FINISHED = Statement(
    f"WITH {past_cutoff('tasks', 'created_at', _FINISHED)},"
    " gone AS (DELETE FROM tasks t USING doomed d WHERE t.task_id = d.task_id"
    f" AND t.status IN ({', '.join(repr(s) for s in TERMINAL)}) RETURNING t.task_id),"
    " signals AS (DELETE FROM signals s USING gone g WHERE s.task_id = g.task_id RETURNING 1)"
    " SELECT (SELECT count(*) FROM gone) AS tasks, (SELECT count(*) FROM signals) AS signals"
)
_DUE = Statement(due_statement("tasks", "created_at", _FINISHED))


async def tasks_businesses_finished(conn: Conn) -> list[str]:
    """The businesses with tasks (finished or not)."""
    return list(await _BUSINESSES_FINISHED.scalars(conn))


async def tasks_delete_if_finished_many(
    conn: Conn, cutoffs: Mapping[str, datetime], limit: int
) -> Purged:
    """Delete at most ``limit`` tasks finished before their business's cutoff (SUCCEEDED,
    CANCELLED, FAILED), oldest first, with the signals they were sent, in one statement;
    their idempotency keys are free again. A task running, parked or resumed since its cutoff is not touched."""
    (row,) = await _DELETE_IF_FINISHED.fetch(conn, cutoff_params(cutoffs, limit))
    return Purged(row.tasks, {"tasks": row.tasks, "signals": row.signals})


async def tasks_due(conn: Conn, cutoffs: Mapping[str, datetime]) -> dict[str, int]:
    """How many finished tasks of each business are past its cutoff."""
    return {r.business: r.due for r in await _DUE.fetch(conn, cutoff_params(cutoffs))}
