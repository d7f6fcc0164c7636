"""SQL of the recovery store: parked tasks, failure history, redrive log, settlements and
downstream state, on the driver port (:mod:`dispo.libs.db.driver`) in the caller's
transaction. Every state change is checked against ``RECOVERY_TRANSITIONS`` before it is
written and names its expected state (and the generation it read) in its ``WHERE``; the
rows it moved come back through ``RETURNING``, and none means a lost race, returned as
``False``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.db.driver import Conn, Row
from dispo.reconciler.json_rows import JsonRow, with_json
from dispo.reconciler.states import PARKED, RECOVERY_TRANSITIONS, WORK_KIND_STATES, RecoveryState

# A task sealed for its erasure is never redriven (ADR-0114): its table is the erasure's
# (dispo.reconciler.erasure), the refusal is here, in every statement that redrives.
_UNSEALED = "NOT EXISTS (SELECT 1 FROM erasure_seals e WHERE e.task_id = {})"


@dataclass
class RecoveryRow:
    task_id: str
    business: str
    state: RecoveryState
    kind: str
    cells: list[str]
    downstreams: list[str]
    error_class: str
    reason: str
    envelope: task_pb2.Task
    generation: int
    version: int
    task_created_at: datetime
    first_parked_at: datetime
    parked_at: datetime
    redrives: int
    releases: int
    next_redrive_at: datetime | None
    redrive_trigger: str
    last_redrive_at: datetime | None
    updated_at: datetime
    # The trace context of the event that parked the task (dispo.libs.tracing): its
    # redrives continue that trace.
    trace: str | None = None


def _row(r: Any) -> RecoveryRow:
    return RecoveryRow(
        r.task_id,
        r.business,
        RecoveryState(r.state),
        r.kind,
        list(r.cells),
        list(r.downstreams),
        r.error_class,
        r.reason,
        task_pb2.Task.FromString(r.envelope),
        r.generation,
        r.version,
        r.task_created_at,
        r.first_parked_at,
        r.parked_at,
        r.redrives,
        r.releases,
        r.next_redrive_at,
        r.redrive_trigger,
        r.last_redrive_at,
        r.updated_at,
        r.trace,
    )


@dataclass(frozen=True)
class Filter:
    business: str = ""
    cell: str = ""
    downstream: str = ""
    error_class: str = ""
    min_age_seconds: float = 0
    # Empty: the parked states.
    states: tuple[RecoveryState, ...] = ()
    max_age_seconds: float = 0


def _where(f: Filter, now: datetime) -> tuple[str, dict[str, Any]]:
    clauses = ["state = ANY(CAST(:states AS text[]))"]
    params: dict[str, Any] = {"states": [s.value for s in (f.states or sorted(PARKED))]}
    if f.business:
        clauses.append("business = :business")
        params["business"] = f.business
    if f.cell:
        clauses.append(":cell = ANY(cells)")
        params["cell"] = f.cell
    if f.downstream:
        clauses.append(":downstream = ANY(downstreams)")
        params["downstream"] = f.downstream
    if f.error_class:
        clauses.append("error_class = :error_class")
        params["error_class"] = f.error_class
    if f.min_age_seconds:
        clauses.append("parked_at <= CAST(:parked_before AS timestamptz)")
        params["parked_before"] = now - timedelta(seconds=f.min_age_seconds)
    if f.max_age_seconds:
        clauses.append("parked_at >= CAST(:parked_after AS timestamptz)")
        params["parked_after"] = now - timedelta(seconds=f.max_age_seconds)
    return " AND ".join(clauses), params


async def task_get(conn: Conn, task_id: str, *, for_update: bool = False) -> RecoveryRow | None:
    sql = "SELECT * FROM recovery_tasks WHERE task_id = :id" + (" FOR UPDATE" if for_update else "")
    rows = await conn.fetch(sql, {"id": task_id})
    return _row(rows[0]) if rows else None


async def task_list(
    conn: Conn,
    f: Filter,
    now: datetime,
    *,
    limit: int,
    offset: int = 0,
    after: tuple[datetime, str] | None = None,
    for_update: bool = False,
) -> list[RecoveryRow]:
    """Rows matching ``f``, oldest parked first: from ``offset``, or from after the key
    ``after`` (keyset pages); with ``for_update``, locked (SKIP LOCKED)."""
    where, params = _where(f, now)
    if after is not None:
        where += (
            " AND (parked_at, task_id) > (CAST(:after_at AS timestamptz), CAST(:after_id AS text))"
        )
        params.update(after_at=after[0], after_id=after[1])
    sql = (
        f"SELECT * FROM recovery_tasks WHERE {where} ORDER BY parked_at, task_id LIMIT :limit OFFSET :offset"
        + (" FOR UPDATE SKIP LOCKED" if for_update else "")
    )
    rows = await conn.fetch(sql, {**params, "limit": limit, "offset": offset})
    return [_row(r) for r in rows]


async def task_insert(conn: Conn, row: RecoveryRow) -> bool:
    inserted = await conn.fetch(
        (
            "INSERT INTO recovery_tasks (task_id, business, state, kind, cells, downstreams, error_class, reason, envelope,"
            " generation, version, task_created_at, first_parked_at, parked_at, next_redrive_at, redrive_trigger, updated_at,"
            " trace)"
            " VALUES (:task_id, :business, :state, :kind, :cells, :downstreams, :error_class, :reason, :envelope,"
            " :generation, :version, :task_created_at, :first_parked_at, :parked_at, :next_redrive_at, :redrive_trigger,"
            " :updated_at, :trace) ON CONFLICT (task_id) DO NOTHING RETURNING task_id"
        ),
        _params(row),
    )
    return bool(inserted)


def _params(row: RecoveryRow) -> dict[str, Any]:
    return {
        "task_id": row.task_id,
        "business": row.business,
        "state": row.state.value,
        "kind": row.kind,
        "cells": row.cells,
        "downstreams": row.downstreams,
        "error_class": row.error_class,
        "reason": row.reason,
        "envelope": row.envelope.SerializeToString(),
        "generation": row.generation,
        "version": row.version,
        "task_created_at": row.task_created_at,
        "first_parked_at": row.first_parked_at,
        "parked_at": row.parked_at,
        "next_redrive_at": row.next_redrive_at,
        "redrive_trigger": row.redrive_trigger,
        "updated_at": row.updated_at,
        "trace": row.trace,
    }


async def task_repark_if(
    conn: Conn, row: RecoveryRow, *, expected: RecoveryState, expected_generation: int
) -> bool:
    """Replace the parked picture (a newer envelope arrived) if nobody moved the row."""
    RECOVERY_TRANSITIONS.check(expected, row.state)
    moved = await conn.fetch(
        (
            "UPDATE recovery_tasks SET state = :state, kind = :kind, cells = :cells, downstreams = :downstreams,"
            " error_class = :error_class, reason = :reason, envelope = :envelope, generation = :generation,"
            " version = :version, parked_at = :parked_at, next_redrive_at = :next_redrive_at,"
            " redrive_trigger = :redrive_trigger, updated_at = :updated_at, trace = :trace"
            " WHERE task_id = :task_id AND state = :expected AND generation = :expected_generation"
            " RETURNING task_id"
        ),
        {**_params(row), "expected": expected.value, "expected_generation": expected_generation},
    )
    return bool(moved)


# The columns a state change may set besides its state (:func:`task_set_state_if`).
STATE_FIELDS = frozenset({"envelope", "reason", "next_redrive_at", "redrive_trigger"})


async def task_set_state_if(
    conn: Conn,
    task_id: str,
    expected: RecoveryState | tuple[RecoveryState, ...],
    new: RecoveryState,
    now: datetime,
    *,
    generation: int | None = None,
    **fields: Any,
) -> bool:
    """Move a row from ``expected`` to ``new`` and set ``fields`` (envelope as a Task): only
    the columns of :data:`STATE_FIELDS` (another raises ``ValueError``, nothing written)."""
    unknown = set(fields) - STATE_FIELDS
    if unknown:
        raise ValueError(f"not a column a state change sets: {sorted(unknown)}")
    if "envelope" in fields and isinstance(fields["envelope"], task_pb2.Task):
        fields["envelope"] = fields["envelope"].SerializeToString()
    sets = "".join(f", {name} = :{name}" for name in fields)
    expected_all = [expected] if isinstance(expected, RecoveryState) else list(expected)
    RECOVERY_TRANSITIONS.check(expected_all, new)
    sql = (
        f"UPDATE recovery_tasks SET state = :new, updated_at = :now{sets}"
        " WHERE task_id = :task_id AND state = ANY(CAST(:expected AS text[]))"
        + (" AND generation = :expected_generation" if generation is not None else "")
        + " RETURNING task_id"
    )
    params = {
        "task_id": task_id,
        "new": new.value,
        "now": now,
        "expected": [s.value for s in expected_all],
        "expected_generation": generation,
        **fields,
    }
    return bool(await conn.fetch(sql, params))


def tasks_set_state_if_part(
    reasons: dict[str, str],
    expected: tuple[RecoveryState, ...],
    new: RecoveryState,
    now: datetime,
) -> tuple[str, dict[str, Any]] | None:
    """:func:`task_set_state_if` for many rows, as one data-modifying statement and its
    parameters, to be run as a ``WITH`` item of another statement (it returns nothing the
    other reads): each task in ``reasons`` moves from ``expected`` to ``new`` with its
    reason and no next redrive. Rows are locked in task id order, so two such statements do
    not deadlock. None when ``reasons`` is empty. Its parameters are named ``state_*``
    (``now`` besides), so they do not meet the other statement's."""
    RECOVERY_TRANSITIONS.check(list(expected), new)
    if not reasons:
        return None
    ids = sorted(reasons)
    return (
        "WITH moving AS (SELECT task_id FROM recovery_tasks"
        "  WHERE task_id = ANY(:state_ids) AND state = ANY(:state_expected)"
        "  ORDER BY task_id FOR UPDATE)"
        " UPDATE recovery_tasks r SET state = :state_new, updated_at = :now,"
        " reason = v.reason, next_redrive_at = NULL"
        " FROM moving JOIN unnest(CAST(:state_ids AS text[]), CAST(:state_reasons AS text[]))"
        " AS v(task_id, reason) ON v.task_id = moving.task_id"
        " WHERE r.task_id = moving.task_id",
        {
            "state_ids": ids,
            "state_reasons": [reasons[i] for i in ids],
            "state_expected": [s.value for s in expected],
            "state_new": new.value,
            "now": now,
        },
    )


async def task_redriven_if(
    conn: Conn,
    task_id: str,
    expected: RecoveryState,
    generation: int,
    envelope: task_pb2.Task,
    now: datetime,
    *,
    release: bool,
) -> bool:
    """Move the row to REDRIVEN with the envelope sent, counting the redrive. A release is
    a redrive too (the policy's ``max_redrives`` bounds both: a task demoted again after
    each release does not cycle for ever) and is also counted as a release. A resume (the
    redrive of a row ``expected`` FAILED) starts the redrive policy afresh: no redrive
    used, first parked now. A task sealed for its erasure is not moved (ADR-0114): the
    caller took the task's lock against a seal first, so a seal committed before this
    statement is seen."""
    RECOVERY_TRANSITIONS.check(expected, RecoveryState.REDRIVEN)
    counter = "redrives = redrives + 1" + (", releases = releases + 1" if release else "")
    if expected is RecoveryState.FAILED:
        counter = "redrives = 0, first_parked_at = :now"
    moved = await conn.fetch(
        (
            f"UPDATE recovery_tasks SET state = 'redriven', envelope = :envelope, generation = :new_generation, {counter},"
            " last_redrive_at = :now, next_redrive_at = NULL, updated_at = :now"
            " WHERE task_id = :task_id AND state = :expected AND generation = :generation"
            f" AND {_UNSEALED.format(':task_id')} RETURNING task_id"
        ),
        {
            "task_id": task_id,
            "expected": expected.value,
            "generation": generation,
            "now": now,
            "envelope": envelope.SerializeToString(),
            "new_generation": envelope.generation,
        },
    )
    return bool(moved)


async def tasks_manual_redrive_last_due(conn: Conn, now: datetime) -> datetime | None:
    """When the last operator-scheduled redrive still waiting is due (None: none waits)."""
    due: list[datetime | None] = await conn.scalars(
        "SELECT max(next_redrive_at) FROM recovery_tasks WHERE state = 'parked_failed'"
        " AND redrive_trigger LIKE 'manual|%' AND next_redrive_at > :now",
        {"now": now},
    )
    return due[0]


async def tasks_due(
    conn: Conn, state: RecoveryState, now: datetime, limit: int
) -> list[RecoveryRow]:
    """Rows in ``state`` whose next_redrive_at has come, oldest due first, locked (SKIP
    LOCKED); none sealed for its erasure (it would be refused at every pass)."""
    rows = await conn.fetch(
        (
            "SELECT * FROM recovery_tasks t WHERE state = :state AND next_redrive_at <= :now"
            f" AND {_UNSEALED.format('t.task_id')} ORDER BY next_redrive_at, task_id LIMIT :limit FOR UPDATE SKIP LOCKED"
        ),
        {"state": state.value, "now": now, "limit": limit},
    )
    return [_row(r) for r in rows]


async def history_add(
    conn: Conn,
    env: task_pb2.Task,
    kind: str,
    now: datetime,
    reason: str,
    error_class: str,
    nodes: list[dict],
) -> None:
    await conn.fetch(
        (
            "INSERT INTO failure_history (task_id, kind, generation, received_at, reason, error_class, nodes)"
            " VALUES (:id, :kind, :gen, :now, :reason, :error_class, CAST(:nodes AS jsonb)) ON CONFLICT DO NOTHING"
        ),
        {
            "id": env.task_id,
            "kind": kind,
            "gen": env.generation,
            "now": now,
            "reason": reason,
            "error_class": error_class,
            "nodes": json.dumps(nodes),
        },
    )


async def history_get(conn: Conn, task_id: str) -> list[JsonRow]:
    """The task's failure records, oldest first (``nodes`` read as JSON)."""
    rows = await conn.fetch(
        "SELECT * FROM failure_history WHERE task_id = :id ORDER BY id", {"id": task_id}
    )
    return with_json(rows, "nodes")


async def redrive_log_add(
    conn: Conn,
    task_id: str,
    generation: int,
    trigger: str,
    now: datetime,
    *,
    actor: str = "",
    reason: str = "",
    downstream: str = "",
    nodes: list[str] | None = None,
) -> None:
    await conn.fetch(
        (
            "INSERT INTO redrive_log (task_id, generation, trigger, actor, reason, downstream, at, nodes_reset)"
            " VALUES (:id, :gen, :trigger, :actor, :reason, :downstream, :now, :nodes)"
        ),
        {
            "id": task_id,
            "gen": generation,
            "trigger": trigger,
            "actor": actor,
            "reason": reason,
            "downstream": downstream,
            "now": now,
            "nodes": nodes or [],
        },
    )


async def redrive_log_get(conn: Conn, task_id: str) -> list[Row]:
    return await conn.fetch(
        "SELECT * FROM redrive_log WHERE task_id = :id ORDER BY id", {"id": task_id}
    )


async def settlement_add(
    conn: Conn,
    task_id: str,
    node_id: str,
    generation: int,
    method: str,
    outcome: str,
    now: datetime,
    *,
    reason: str = "",
    actor: str = "",
) -> None:
    await conn.fetch(
        (
            "INSERT INTO settlements (task_id, node_id, generation, method, outcome, reason, actor, at)"
            " VALUES (:id, :node, :gen, :method, :outcome, :reason, :actor, :now) ON CONFLICT DO NOTHING"
        ),
        {
            "id": task_id,
            "node": node_id,
            "gen": generation,
            "method": method.lower(),
            "outcome": outcome.lower(),
            "reason": reason,
            "actor": actor,
            "now": now,
        },
    )


async def settlements_get(conn: Conn, task_id: str) -> list[Row]:
    return await conn.fetch(
        "SELECT * FROM settlements WHERE task_id = :id ORDER BY id", {"id": task_id}
    )


# ---- downstreams ------------------------------------------------------------------------


async def downstream_get(conn: Conn, name: str, *, for_update: bool = False) -> Row:
    await conn.fetch(
        "INSERT INTO downstream_state (name) VALUES (:name) ON CONFLICT DO NOTHING", {"name": name}
    )
    sql = "SELECT * FROM downstream_state WHERE name = :name" + (
        " FOR UPDATE" if for_update else ""
    )
    [row] = await conn.fetch(sql, {"name": name})
    return row


async def downstream_all(conn: Conn) -> dict[str, Row]:
    return {r.name: r for r in await conn.fetch("SELECT * FROM downstream_state")}


async def downstream_record_probe(
    conn: Conn, name: str, healthy: bool, error: str, now: datetime
) -> bool:
    """Record a health probe; True when the health changed."""
    row = await downstream_get(conn, name, for_update=True)
    changed = row.healthy is not healthy
    await conn.fetch(
        (
            "UPDATE downstream_state SET healthy = :healthy, probe_error = :error, last_probe_at = :now"
            + (", last_change_at = :now, tokens = 0, tokens_at = NULL" if changed else "")
            + " WHERE name = :name"
        ),
        {"name": name, "healthy": healthy, "error": error, "now": now},
    )
    return changed


async def downstream_set_paused(
    conn: Conn, name: str, paused: bool, actor: str, reason: str
) -> None:
    await downstream_get(conn, name, for_update=True)
    await conn.fetch(
        (
            "UPDATE downstream_state SET paused = CAST(:paused AS boolean), paused_by = :actor,"
            " paused_reason = :reason,"
            " tokens = CASE WHEN CAST(:paused AS boolean) THEN 0 ELSE tokens END,"
            " tokens_at = CASE WHEN CAST(:paused AS boolean) THEN NULL ELSE tokens_at END"
            " WHERE name = :name"
        ),
        {"name": name, "paused": paused, "actor": actor, "reason": reason},
    )


async def downstream_set_tokens(conn: Conn, name: str, tokens: float, now: datetime) -> None:
    await conn.fetch(
        "UPDATE downstream_state SET tokens = :tokens, tokens_at = :now WHERE name = :name",
        {"name": name, "tokens": tokens, "now": now},
    )


async def downstreams_demoted(conn: Conn) -> list[str]:
    """The downstreams demoted tasks wait for."""
    names: list[str] = await conn.scalars(
        "SELECT DISTINCT unnest(downstreams) AS name FROM recovery_tasks WHERE state = 'demoted'"
    )
    return sorted(names)


async def tasks_releasable(conn: Conn, downstream: str, limit: int) -> list[RecoveryRow]:
    """Oldest DEMOTED tasks waiting for ``downstream`` whose every blocking downstream is
    healthy and not paused, none sealed for its erasure; locked, SKIP LOCKED."""
    rows = await conn.fetch(
        (
            "SELECT * FROM recovery_tasks t WHERE t.state = 'demoted' AND :name = ANY(t.downstreams)"
            " AND NOT EXISTS (SELECT 1 FROM unnest(t.downstreams) d(name)"
            "   LEFT JOIN downstream_state s ON s.name = d.name"
            "   WHERE s.name IS NULL OR s.healthy IS NOT TRUE OR s.paused)"
            f" AND {_UNSEALED.format('t.task_id')} ORDER BY t.parked_at, t.task_id LIMIT :limit FOR UPDATE OF t SKIP LOCKED"
        ),
        {"name": downstream, "limit": limit},
    )
    return [_row(r) for r in rows]


async def tasks_backlog_by_state(conn: Conn) -> dict[RecoveryState, tuple[int, datetime]]:
    """How many tasks each held state has, and the oldest one's parked_at (the index on
    (state, parked_at))."""
    held = [s.value for states in WORK_KIND_STATES.values() for s in states]
    rows = await conn.fetch(
        (
            "SELECT state, count(*) AS n, min(parked_at) AS oldest FROM recovery_tasks"
            " WHERE state = ANY(CAST(:held AS text[])) GROUP BY state"
        ),
        {"held": held},
    )
    return {RecoveryState(r.state): (int(r.n), r.oldest) for r in rows}


async def downstreams_queue_depths(conn: Conn) -> dict[str, Row]:
    """Per downstream, its parked tasks: demoted and failed, how many and the oldest."""
    rows = await conn.fetch(
        (
            "SELECT d AS name,"
            " count(*) FILTER (WHERE state = 'demoted') AS demoted,"
            " min(parked_at) FILTER (WHERE state = 'demoted') AS oldest_demoted,"
            " count(*) FILTER (WHERE state <> 'demoted') AS failed,"
            " min(first_parked_at) FILTER (WHERE state <> 'demoted') AS oldest_failed"
            " FROM recovery_tasks, unnest(downstreams) AS d"
            " WHERE state = ANY(CAST(:parked AS text[])) GROUP BY d"
        ),
        {"parked": [s.value for s in PARKED]},
    )
    return {r.name: r for r in rows}


# ---- retention (ADR-0105) ---------------------------------------------------------------
# The recovery records of finished tasks whose completion facts retention deleted, with
# their failure history, redrive log, settlements and erasure seals (ADR-0114, held or
# not); a record parked again is kept, with its seal.
_DELETE_IF_DONE = (
    "WITH doomed AS (SELECT r.task_id FROM recovery_tasks r"
    " WHERE r.task_id = ANY(CAST(:ids AS text[])) AND NOT r.state = ANY(CAST(:parked AS text[]))"
    " ORDER BY r.task_id FOR UPDATE),"
    " gone_history AS (DELETE FROM failure_history x USING doomed d"
    " WHERE x.task_id = d.task_id RETURNING 1),"
    " gone_redrives AS (DELETE FROM redrive_log x USING doomed d WHERE x.task_id = d.task_id"
    " RETURNING 1),"
    " gone_settlements AS (DELETE FROM settlements x USING doomed d"
    " WHERE x.task_id = d.task_id RETURNING 1),"
    " gone AS (DELETE FROM recovery_tasks r USING doomed d WHERE r.task_id = d.task_id"
    " AND NOT r.state = ANY(CAST(:parked AS text[])) RETURNING 1),"
    " gone_seals AS (DELETE FROM erasure_seals x WHERE x.task_id = ANY(CAST(:ids AS text[]))"
    " AND NOT EXISTS (SELECT 1 FROM recovery_tasks r WHERE r.task_id = x.task_id"
    " AND r.state = ANY(CAST(:parked AS text[]))) RETURNING 1)"
    " SELECT (SELECT count(*) FROM gone) AS recovery_tasks,"
    " (SELECT count(*) FROM gone_seals) AS erasure_seals,"
    " (SELECT count(*) FROM gone_history) AS failure_history,"
    " (SELECT count(*) FROM gone_redrives) AS redrive_log,"
    " (SELECT count(*) FROM gone_settlements) AS settlements"
)


async def tasks_delete_if_done_many(conn: Conn, task_ids: list[str]) -> dict[str, int]:
    """Delete the recovery records of ``task_ids`` that are not parked (REDRIVEN, RESOLVED,
    FAILED, ABANDONED) with their history, redrive log, settlements and erasure seals, in
    one statement; the rows deleted by table."""
    if not task_ids:
        return {}
    (row,) = await conn.fetch(
        _DELETE_IF_DONE, {"ids": sorted(task_ids), "parked": [s.value for s in PARKED]}
    )
    return dict(row.items())
