"""Operators' commands on parked tasks: redrive one now, redrive many at a bounded rate,
abandon. Bad input raises a domain error and changes nothing."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.contracts import tasks
from dispo.libs.db.driver import Conn
from dispo.libs.erasure import erased
from dispo.libs.error_text import truncate_error
from dispo.libs.errors import FailedPrecondition, InvalidArgument, NotFound
from dispo.libs.logging import get_logger
from dispo.libs.timestamps import to_timestamp
from dispo.reconciler import envelope as E
from dispo.reconciler.context import Context
from dispo.reconciler.erasure import task_lock_against_seal, task_sealed
from dispo.reconciler.outbox import emit
from dispo.reconciler.recovery import store
from dispo.reconciler.recovery.redrive import redrive_row
from dispo.reconciler.recovery.store import Filter, RecoveryRow
from dispo.reconciler.states import RecoveryState

log = get_logger(__name__)
R = RecoveryState
# States an operator may redrive from; UNKNOWN nodes must be settled first. RedriveTask also
# resumes a FAILED task (RESUMABLE).
REDRIVABLE = (R.PARKED_FAILED, R.DEMOTED)
RESUMABLE = (*REDRIVABLE, R.FAILED)
ABANDONABLE = (R.PARKED_FAILED, R.AWAITING_SETTLEMENT, R.AWAITING_DECISION, R.DEMOTED)
MAX_BY_FILTER = 1000
# The slowest a redrive by filter spaces its tasks: one a day (its 1000 tasks then span
# less than three years; a slower rate would put them past any time a row can hold).
MIN_RATE_PER_SECOND = 1 / 86400


async def _get(conn: Conn, task_id: str) -> RecoveryRow:
    if not task_id:
        raise InvalidArgument("task_id", "required")
    row = await store.task_get(conn, task_id, for_update=True)
    if row is None:
        raise NotFound(f"task {task_id!r} is not held by the reconciler")
    return row


async def redrive_one(
    ctx: Context, task_id: str, actor: str, reason: str, include_permanent: bool
) -> RecoveryRow:
    now = ctx.clock.now()
    async with ctx.db.transaction() as conn:
        row = await _get(conn, task_id)
        if row.state not in RESUMABLE:
            hint = (
                " (resolve its UNKNOWN nodes first)"
                if row.state in (R.AWAITING_DECISION, R.AWAITING_SETTLEMENT)
                else ""
            )
            raise FailedPrecondition(
                f"task {task_id} is {row.state.name}; only PARKED_FAILED, DEMOTED or FAILED"
                f" tasks can be redriven{hint}"
            )
        await task_lock_against_seal(conn, task_id)  # a seal under way is seen below
        if erased(row.envelope) or await task_sealed(conn, task_id):
            raise FailedPrecondition(
                f"task {task_id} was erased: its payloads are gone, it cannot run again"
            )
        undecided = [n.node_id for n in E.unknown(row.envelope)]
        if undecided:  # a FAILED task whose age limit ended its wait for a decision
            raise FailedPrecondition(
                f"task {task_id} has UNKNOWN nodes ({', '.join(undecided)}): their effect may"
                " have happened; decide each with ResolveNode before resuming it"
            )
        if not await redrive_row(
            ctx,
            conn,
            row,
            "resume" if row.state is R.FAILED else "manual",
            now,
            actor=actor,
            reason=reason,
            include_permanent=include_permanent,
        ):
            raise FailedPrecondition(f"task {task_id} changed while redriving; try again")
        result = await store.task_get(conn, task_id)
    ctx.kick()
    assert result is not None
    return result


async def redrive_by_filter(
    ctx: Context, f: Filter, rate_per_second: float, limit: int, actor: str, reason: str
) -> tuple[list[str], datetime | None]:
    """Schedule matching parked tasks (oldest first) for redrive, ``1 / rate`` seconds apart;
    the redrive sweep sends each when it is due, so a restart neither loses nor repeats one."""
    if not MIN_RATE_PER_SECOND <= rate_per_second < math.inf:
        raise InvalidArgument(
            "rate_per_second",
            "required: a number of redrives per second, at least one a day"
            f" ({MIN_RATE_PER_SECOND:.3g})",
        )
    if limit < 0 or limit > MAX_BY_FILTER:
        raise InvalidArgument("limit", f"between 0 and {MAX_BY_FILTER} (0 means {MAX_BY_FILTER})")
    bad = [s for s in f.states if s not in REDRIVABLE]
    if bad:
        raise InvalidArgument(
            "filter.states", f"only {', '.join(s.value for s in REDRIVABLE)} can be redriven"
        )
    f = Filter(
        f.business, f.cell, f.downstream, f.error_class, f.min_age_seconds, f.states or REDRIVABLE
    )
    now = ctx.clock.now()
    step = 1.0 / rate_per_second
    trigger = truncate_error(f"manual|{actor}|{reason}")
    ids: list[str] = []
    last: datetime | None = None
    async with ctx.db.transaction() as conn:
        # Tasks already scheduled by an earlier request keep their place in the queue.
        latest = await store.tasks_manual_redrive_last_due(conn, now)
        start = now if latest is None else latest + timedelta(seconds=step)
        for i, row in enumerate(
            await store.task_list(conn, f, now, limit=limit or MAX_BY_FILTER, for_update=True)
        ):
            due = start + timedelta(seconds=i * step)
            if await store.task_set_state_if(
                conn,
                row.task_id,
                row.state,
                R.PARKED_FAILED,
                now,
                generation=row.generation,
                next_redrive_at=due,
                redrive_trigger=trigger,
            ):
                ids.append(row.task_id)
                last = due
    log.info(
        "redrive by filter scheduled", count=len(ids), rate_per_second=rate_per_second, actor=actor
    )
    return ids, last


async def abandon(ctx: Context, task_id: str, actor: str, reason: str) -> RecoveryRow:
    """Stop recovering a task; it is cancelled through the executor's normal cancel path
    (its pending nodes become CANCELLED and the gateway shows the task CANCELLED)."""
    now = ctx.clock.now()
    async with ctx.db.transaction() as conn:
        row = await _get(conn, task_id)
        if row.state not in ABANDONABLE:
            raise FailedPrecondition(
                f"task {task_id} is {row.state.name}; only parked tasks can be abandoned"
            )
        if not await _abandon_in(conn, row, actor, reason, now):
            raise FailedPrecondition(f"task {task_id} changed meanwhile; try again")
        result = await store.task_get(conn, task_id)
    ctx.kick()
    log.info("task abandoned", task_id=task_id, actor=actor, reason=reason)
    assert result is not None
    return result


async def _abandon_in(conn: Conn, row: RecoveryRow, actor: str, reason: str, now: datetime) -> bool:
    """Abandon a parked ``row`` in the caller's transaction (AbandonTask's and
    AbandonByFilter's one path): ABANDONED if still in its state, its redrive log and a
    task.cancel; False if it changed meanwhile."""
    task_id = row.task_id
    why = f"abandoned by {actor or 'an operator'}" + (f": {reason}" if reason else "")
    if not await store.task_set_state_if(
        conn,
        task_id,
        row.state,
        R.ABANDONED,
        now,
        generation=row.generation,
        reason=truncate_error(why),
        next_redrive_at=None,
    ):
        return False
    await store.redrive_log_add(
        conn, task_id, row.generation, "abandon", now, actor=actor, reason=reason
    )
    cancel = task_pb2.CancelRequest(task_id=task_id, requested_at=to_timestamp(now))
    await emit(
        conn,
        tasks.TASK_CANCEL,
        tasks.cancel_id(task_id, "abandon"),
        cancel.SerializeToString(),
        now,
    )
    return True


# The fastest a bulk abandon goes, and how many it abandons in one transaction.
MAX_ABANDON_RATE = 1000.0
ABANDON_BATCH = 100


async def abandon_by_filter(
    ctx: Context,
    f: Filter,
    limit: int,
    dry_run: bool,
    rate_per_second: float,
    actor: str,
    reason: str,
) -> tuple[int, list[str]]:
    """Abandon the matching parked tasks, oldest parked first, at most ``limit``, a batch
    at a time, each batch in its transaction and the batches spaced on the clock to
    ``rate_per_second``; a dry run only counts. (matched, the ids abandoned)."""
    if not dry_run and not 0 < rate_per_second <= MAX_ABANDON_RATE:
        raise InvalidArgument("rate_per_second", f"must be > 0 and at most {MAX_ABANDON_RATE:g}")
    if limit < 0 or limit > MAX_BY_FILTER:
        raise InvalidArgument("limit", f"between 0 and {MAX_BY_FILTER} (0 means {MAX_BY_FILTER})")
    if any(s not in ABANDONABLE for s in f.states):
        raise InvalidArgument(
            "filter.states", f"only {', '.join(s.value for s in ABANDONABLE)} can be abandoned"
        )
    f = Filter(
        f.business, f.cell, f.downstream, f.error_class, f.min_age_seconds, f.states or ABANDONABLE
    )
    async with ctx.db.connection() as conn:
        matched = await store.task_list(conn, f, ctx.clock.now(), limit=limit or MAX_BY_FILTER)
    if dry_run:
        return len(matched), []
    ids: list[str] = []
    batch = max(1, min(ABANDON_BATCH, math.floor(rate_per_second)))
    for first in range(0, len(matched), batch):
        if first:
            await ctx.clock.sleep(batch / rate_per_second)
        now = ctx.clock.now()
        async with ctx.db.transaction() as conn:
            for listed in matched[first : first + batch]:
                row = await store.task_get(conn, listed.task_id, for_update=True)
                if row is not None and row.state in f.states:
                    if await _abandon_in(conn, row, actor, reason, now):
                        ids.append(row.task_id)
        ctx.kick()
    log.info("abandon by filter", matched=len(matched), abandoned=len(ids), actor=actor)
    return len(matched), ids
