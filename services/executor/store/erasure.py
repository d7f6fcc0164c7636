"""A finished task run's user data replaced by tombstones (ADR-0113): its envelope (the
payloads), its nodes' outputs and last errors, its worker runs' payloads, outputs and
messages, the signals it was sent; the quarantined messages that name it are discarded.
Ids, statuses and times stay."""

from __future__ import annotations

from collections.abc import Sequence

from dispo.executor.store.task_runs import FINISHED_SQL
from dispo.libs.db.driver import Conn, Statement
from dispo.libs.erasure import ERASED_TEXT, TOMBSTONE

# Each (task, tombstoned envelope) whose run is finished; NULL envelope: a run recorded
# without one (a cancel ahead of its task.create) keeps none.
_ERASE_IF_FINISHED = Statement(
    "WITH e AS (SELECT * FROM unnest(CAST(:ids AS text[]), CAST(:envelopes AS bytea[]))"
    " AS e(task_id, envelope)),"
    " done AS (UPDATE task_runs t SET envelope = e.envelope FROM e"
    f" WHERE t.task_id = e.task_id AND t.status IN ({FINISHED_SQL}) RETURNING t.task_id),"
    " nodes AS (UPDATE node_runs n SET output = CASE WHEN n.output IS NULL THEN NULL"
    " ELSE CAST(:tombstone AS bytea) END,"
    " last_error = CASE WHEN n.last_error = '' THEN '' ELSE :erased END"
    " FROM done d WHERE n.task_id = d.task_id RETURNING 1),"
    " runs AS (UPDATE worker_runs w SET payload = :tombstone,"
    " output = CASE WHEN w.output IS NULL THEN NULL ELSE CAST(:tombstone AS bytea) END,"
    " message = CASE WHEN w.message IS NULL THEN NULL ELSE :erased END"
    " FROM done d WHERE w.task_id = d.task_id RETURNING 1),"
    " sig AS (UPDATE signals s SET payload = :tombstone FROM done d"
    " WHERE s.task_id = d.task_id RETURNING 1),"
    " q AS (DELETE FROM quarantine q USING done d"
    " WHERE position(convert_to(d.task_id, 'UTF8') IN q.payload) > 0 RETURNING 1)"
    " SELECT task_id FROM done"
)


async def tasks_erase_if_finished_many(
    conn: Conn, erasures: Sequence[tuple[str, bytes | None]]
) -> set[str]:
    """Write the tombstones of the runs among ``erasures`` (task id, tombstoned envelope)
    that are finished, with everything the executor keeps of them, in one statement;
    answers the runs erased. Applying it again changes nothing."""
    rows = await _ERASE_IF_FINISHED.fetch(
        conn,
        {
            "ids": [task_id for task_id, _ in erasures],
            "envelopes": [envelope for _, envelope in erasures],
            "tombstone": TOMBSTONE,
            "erased": ERASED_TEXT,
        },
    )
    return {r.task_id for r in rows}
