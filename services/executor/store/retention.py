"""Finished task runs past their business's retention, deleted with everything the executor
keeps about them: their nodes (with their outputs), their worker runs, the signals they
were sent, their wait timeouts and their deadlines (ADR-0105)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from dispo.executor.store.task_runs import FINISHED_SQL
from dispo.libs.db.driver import Conn, Statement
from dispo.libs.retention import (
    Purged,
    businesses_statement,
    cutoff_params,
    due_statement,
    past_cutoff,
)

# Finished, and finished before the cutoff (a resume clears finished_at). Read by
# task_runs_business_created.
_FINISHED = f"t.status IN ({FINISHED_SQL}) AND t.finished_at < p.cutoff"

_BUSINESSES_FINISHED = Statement(businesses_statement("task_runs"))
# The task rows go last in the statement's order of effects, but their foreign keys are
# checked at its end, once the nodes are gone too.
_DELETE_IF_FINISHED = Statement(
    f"WITH {past_cutoff('task_runs', 'created_at', _FINISHED)},"
    " nodes AS (DELETE FROM node_runs n USING doomed d WHERE n.task_id = d.task_id"
    " RETURNING 1),"
    " runs AS (DELETE FROM worker_runs w USING doomed d WHERE w.task_id = d.task_id"
    " RETURNING 1),"
    " signals AS (DELETE FROM signals s USING doomed d WHERE s.task_id = d.task_id"
    " RETURNING 1),"
    " waits AS (DELETE FROM waits w USING doomed d WHERE w.task_id = d.task_id RETURNING 1),"
    " deadlines AS (DELETE FROM task_deadlines l USING doomed d WHERE l.task_id = d.task_id"
    " RETURNING 1),"
    " tasks AS (DELETE FROM task_runs t USING doomed d WHERE t.task_id = d.task_id"
    f" AND t.status IN ({FINISHED_SQL}) RETURNING 1)"
    " SELECT (SELECT count(*) FROM tasks) AS tasks, (SELECT count(*) FROM nodes) AS nodes,"
    " (SELECT count(*) FROM runs) AS runs, (SELECT count(*) FROM signals) AS signals,"
    " (SELECT count(*) FROM waits) AS waits, (SELECT count(*) FROM deadlines) AS deadlines"
)
_DUE = Statement(due_statement("task_runs", "created_at", _FINISHED))


async def tasks_businesses_finished(conn: Conn) -> list[str]:
    """The businesses with task runs (``''``: runs recorded without one)."""
    return list(await _BUSINESSES_FINISHED.scalars(conn))


async def tasks_delete_if_finished_many(
    conn: Conn, cutoffs: Mapping[str, datetime], limit: int
) -> Purged:
    """Delete at most ``limit`` task runs finished before their business's cutoff, oldest
    first, with their nodes, worker runs, signals, waits and deadlines, in one statement. A run still going, parked
    (RETRY_EXHAUSTED, DEMOTED) or opened again by a resume is not touched."""
    (row,) = await _DELETE_IF_FINISHED.fetch(conn, cutoff_params(cutoffs, limit))
    return Purged(
        row.tasks,
        {
            "task_runs": row.tasks,
            "node_runs": row.nodes,
            "worker_runs": row.runs,
            "signals": row.signals,
            "waits": row.waits,
            "task_deadlines": row.deadlines,
        },
    )


async def tasks_due(conn: Conn, cutoffs: Mapping[str, datetime]) -> dict[str, int]:
    """How many finished task runs of each business are past its cutoff."""
    return {r.business: r.due for r in await _DUE.fetch(conn, cutoff_params(cutoffs))}
