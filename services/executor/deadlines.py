"""The deadline sweep (ADR-0103): a task past its deadline that no pass holds — parked with
the reconciler, or between two passes — is closed by the normal path of a pass: opened
under the sweep's lease and stepped once, which closes its open nodes and settles it FAILED,
"deadline reached", with its status event and its task.fail (so the completion callback
follows as for any failure). A task a pass holds is closed by that pass's next step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispo.executor.store import task_runs
from dispo.libs.logging import get_logger
from dispo.libs.periodic import Pause

if TYPE_CHECKING:
    from dispo.executor.runner import Executor

log = get_logger(__name__)

# Tasks one sweep transaction closes at most; a full batch is followed by another at once.
BATCH = 100


async def close_past_deadline(ex: Executor, batch: int = BATCH) -> Pause | None:
    """One sweep: close up to ``batch`` tasks past their deadline on the executor's clock
    that no pass holds; returns ``Pause(0)`` when there may be more."""
    now = ex.clock.now()
    async with ex.db.transaction() as conn:
        rows, ended = await task_runs.tasks_past_deadline_lock_many(conn, now, batch)
        await task_runs.task_deadlines_delete_many(conn, [*ended, *(r.task_id for r in rows)])
        if not rows:
            return Pause(0) if len(ended) == batch else None
        # A transaction that fails leaves the rows it would have marked sent to the
        # relay's direct publisher (OutboxRelay.staged).
        staged = ex.relay.staged()
        await ex.passes.close_past_deadline(
            conn, rows, f"{ex.config.instance}:deadline", now, staged
        )
    ex.relay.publish_committed(staged)
    for row in rows:
        log.info("task past its deadline closed", task_id=row.task_id, was=row.status.value)
    return Pause(0) if len(rows) + len(ended) >= batch else None
