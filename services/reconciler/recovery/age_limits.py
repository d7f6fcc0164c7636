"""Age limits of parked work. A task DEMOTED (waiting for a degraded downstream) or
AWAITING_DECISION (an UNKNOWN node no probe could settle, waiting for an operator) for
longer than its limit — counted from when it was parked (``parked_at``) — ends FAILED with
the reason, through the same terminal failure as a spent redrive policy: the final status
snapshot the gateway shows (nodes that can no longer run ended, ``redrive.closed``) and
task.close for the executor's own record. It is then resumable like any FAILED task.
"""

from __future__ import annotations

from datetime import datetime

from dispo.libs.logging import get_logger
from dispo.reconciler import envelope as E
from dispo.reconciler.context import Context
from dispo.reconciler.recovery import store
from dispo.reconciler.recovery.redrive import closed, emit_terminal_failure
from dispo.reconciler.recovery.store import Filter, RecoveryRow
from dispo.reconciler.states import RecoveryState

log = get_logger(__name__)
R = RecoveryState


def limits(ctx: Context) -> dict[RecoveryState, float]:
    """The age limit of each limited state, in seconds."""
    return {
        R.DEMOTED: ctx.settings.demoted_max_age_seconds,
        R.AWAITING_DECISION: ctx.settings.decision_max_age_seconds,
    }


def limit_reason(row: RecoveryRow, limit: float, now: datetime) -> str:
    """Why the task ended: which wait outlived its limit, for how long, and on what."""
    age = (now - row.parked_at).total_seconds()
    if row.state is R.DEMOTED:
        waited = f"demoted, waiting for downstream {', '.join(row.downstreams) or '?'}"
    else:
        undecided = ", ".join(n.node_id for n in E.unknown(row.envelope))
        waited = f"awaiting an operator's decision on UNKNOWN node {undecided}"
    return f"age limit reached: {waited}, for {age:.0f} s (limit {limit:.0f} s)"


async def expire_sweep(ctx: Context) -> int:
    """End FAILED every task parked in a limited state for longer than its limit (one
    batch per state, oldest first); returns how many."""
    now = ctx.clock.now()
    ended = 0
    async with ctx.db.transaction() as conn:
        for state, limit in limits(ctx).items():
            aged = Filter(states=(state,), min_age_seconds=limit)
            for row in await store.task_list(
                conn, aged, now, limit=ctx.settings.batch, for_update=True
            ):
                final = closed(row, limit_reason(row, limit, now), now)
                if not await store.task_set_state_if(
                    conn,
                    row.task_id,
                    state,
                    R.FAILED,
                    now,
                    generation=row.generation,
                    envelope=final.envelope,
                    reason=final.reason,
                    next_redrive_at=None,
                ):
                    continue
                await emit_terminal_failure(conn, final, now)
                ended += 1
                log.info("parked task past its age limit", task_id=row.task_id, reason=final.reason)
    if ended:
        ctx.kick()
    return ended
