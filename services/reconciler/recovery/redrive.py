"""Failed and demoted work: intake from task.fail / task.demote, the redrive schedule
(policy, backoff with jitter, terminal FAILED), and the one redrive implementation every
path uses — a guarded state change, a redrive-log row and the task.create outbox row,
all in one transaction.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from dispo.libs import metrics
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.contracts import tasks
from dispo.libs.db.driver import Conn
from dispo.libs.error_text import truncate_error
from dispo.libs.logging import get_logger
from dispo.libs.tracing import current, resumed
from dispo.reconciler import envelope as E
from dispo.reconciler.context import Context
from dispo.reconciler.erasure import task_lock_against_seal
from dispo.reconciler.outbox import emit
from dispo.reconciler.recovery import store
from dispo.reconciler.recovery.store import RecoveryRow
from dispo.reconciler.states import RECOVERY_ENDED, RecoveryState

log = get_logger(__name__)
R = RecoveryState


def _last_error(env: task_pb2.Task) -> str:
    for node in E.stuck(env):
        if node.last_error:
            return f"{node.node_id}: {node.last_error}"
    return env.status_reason


def schedule(ctx: Context, row: RecoveryRow, now: datetime) -> RecoveryRow:
    """Where a failed task (UNKNOWN nodes settled) goes next: PARKED_FAILED with its next
    redrive time, or terminal FAILED when the policy is spent. Without FAILED nodes (only
    settled UNKNOWN ones) the redrive is due at once and the policy does not apply."""
    env = row.envelope
    if not E.failed(env):
        return replace(
            row, state=R.PARKED_FAILED, next_redrive_at=now, redrive_trigger="settlement"
        )
    policy = ctx.config.redrive_policy(row.business, E.first_stuck_cell(env))
    spent = policy.spent(row.redrives, row.first_parked_at, now)
    if spent:
        return closed(row, f"{spent}; last error {_last_error(env)}", now)
    delay = policy.delay(row.redrives, ctx.rng)
    return replace(
        row,
        state=R.PARKED_FAILED,
        next_redrive_at=now + timedelta(seconds=delay),
        redrive_trigger="auto",
    )


def closed(row: RecoveryRow, reason: str, now: datetime) -> RecoveryRow:
    """The parked task ends FAILED with ``reason``: its nodes that can no longer run ended
    (:func:`E.closed`); :func:`emit_terminal_failure` publishes it once written."""
    reason = truncate_error(reason)
    return replace(
        row,
        state=R.FAILED,
        next_redrive_at=None,
        reason=reason,
        envelope=E.closed(row.envelope, reason, now),
    )


def _picture(
    ctx: Context, env: task_pb2.Task, kind: str, now: datetime, old: RecoveryRow | None
) -> RecoveryRow:
    demoted = kind == "demote"
    ended = env.status == E.TS.TASK_STATUS_FAILED  # the executor ended it (a permanent failure)
    row = RecoveryRow(
        task_id=env.task_id,
        business=env.business,
        state=R.DEMOTED if demoted else R.AWAITING_SETTLEMENT,
        kind=kind,
        cells=E.cells(env),
        downstreams=E.blocking_downstreams(env) if demoted else E.stuck_downstreams(env),
        error_class=E.error_class(env),
        reason=truncate_error(env.status_reason or _last_error(env)),
        envelope=env,
        generation=env.generation,
        version=env.version,
        task_created_at=E.moment(env.created_at, now),
        first_parked_at=old.first_parked_at if old else now,
        parked_at=now,
        redrives=old.redrives if old else 0,
        releases=old.releases if old else 0,
        next_redrive_at=None if demoted else now,
        redrive_trigger="auto",
        last_redrive_at=old.last_redrive_at if old else None,
        updated_at=now,
        trace=current() or (old.trace if old else None),
    )
    if ended:
        reason = f"{env.status_reason}; last error {_last_error(env)}"
        return replace(row, state=R.FAILED, next_redrive_at=None, reason=truncate_error(reason))
    if demoted:
        return demote(ctx, row, now)
    if E.unknown(env):
        return row
    return schedule(ctx, row, now)


def demote(ctx: Context, row: RecoveryRow, now: datetime) -> RecoveryRow:
    """Where a demoted task goes: DEMOTED, to wait for its release; or terminal FAILED when
    its redrives (releases included) are spent — a downstream whose health passes while its
    calls fail would otherwise release and demote it again for ever."""
    policy = ctx.config.redrive_policy(row.business, E.first_stuck_cell(row.envelope))
    spent = policy.redrives_spent(row.redrives)
    if spent:
        return closed(row, f"{spent}; last error {_last_error(row.envelope)}", now)
    return row


async def intake(ctx: Context, env: task_pb2.Task, kind: str) -> bool:
    """Record a task arriving on task.fail (``kind`` "fail") or task.demote ("demote"). A
    task.fail of a task the executor ended FAILED (a permanent failure) is held FAILED as it
    is, for an operator to resume; no redrive is scheduled.
    Returns False when it lost a race and should be delivered again."""
    now = ctx.clock.now()
    async with ctx.db.transaction() as conn:
        old = await store.task_get(conn, env.task_id, for_update=True)
        if old is not None:
            if old.state in RECOVERY_ENDED:
                log.info(
                    "parked task already final here; ignored",
                    task_id=env.task_id,
                    state=old.state.value,
                )
                return True
            if env.generation < old.generation or (
                env.generation == old.generation and old.state is not R.REDRIVEN
            ):
                log.info(
                    "stale or repeated envelope ignored",
                    task_id=env.task_id,
                    generation=env.generation,
                    recorded=old.generation,
                )
                return True
        row = _picture(ctx, env, kind, now, old)
        if old is None:
            if not await store.task_insert(conn, row):
                return False
        elif not await store.task_repark_if(
            conn, row, expected=old.state, expected_generation=old.generation
        ):
            return False
        await store.history_add(conn, env, kind, now, row.reason, row.error_class, E.picture(env))
        if row.state is R.FAILED and env.status != E.TS.TASK_STATUS_FAILED:
            await emit_terminal_failure(conn, row, now)  # (the executor ended the others)
    ctx.kick()
    log.info(
        "task parked",
        task_id=env.task_id,
        kind=kind,
        state=row.state.value,
        generation=env.generation,
        next_redrive_at=row.next_redrive_at.isoformat() if row.next_redrive_at else None,
        reason=row.reason,
    )
    return True


async def emit_terminal_failure(conn: Conn, row: RecoveryRow, now: datetime) -> None:
    """The task ends FAILED with the reason: a status snapshot newer than the executor's
    last one (``row.envelope`` as :func:`closed` left it: no node shows PENDING or DEMOTED),
    on the status subject the gateway keeps its view from, and task.close so the executor's
    own record says FAILED too, with the same nodes ended."""
    snap = E.terminal(row.envelope, E.TS.TASK_STATUS_FAILED, row.reason, now)
    await emit(
        conn,
        tasks.task_status(row.task_id, snap.status),
        tasks.status_id(row.task_id, snap.version, "reconciler"),
        snap.SerializeToString(),
        now,
        row.trace,
    )
    close = task_pb2.CloseRequest(
        task_id=row.task_id,
        status=E.TS.TASK_STATUS_FAILED,
        reason=row.reason,
        generation=row.generation,
        version=snap.version,
    )
    await emit(
        conn,
        tasks.TASK_CLOSE,
        tasks.close_id(row.task_id, row.generation),
        close.SerializeToString(),
        now,
        row.trace,
    )


async def redrive_row(
    ctx: Context,
    conn: Conn,
    row: RecoveryRow,
    trigger: str,
    now: datetime,
    *,
    actor: str = "",
    reason: str = "",
    downstream: str = "",
    include_permanent: bool = False,
) -> bool:
    """Send a parked task back to task.create (generation + 1) from where it stopped; a
    FAILED one is resumed: every FAILED node reset, and the redrive policy starts afresh.
    False when the row was not in the state / generation read (a lost race). The redrive
    is a span of the trace the task was parked in, and its task.create carries it on."""
    with resumed(row.trace, "redrive"):
        return await _redrive_row(
            ctx,
            conn,
            row,
            trigger,
            now,
            actor=actor,
            reason=reason,
            downstream=downstream,
            include_permanent=include_permanent,
        )


async def _redrive_row(
    ctx: Context,
    conn: Conn,
    row: RecoveryRow,
    trigger: str,
    now: datetime,
    *,
    actor: str,
    reason: str,
    downstream: str,
    include_permanent: bool,
) -> bool:
    why = f"redriven by the reconciler ({trigger}{': ' + reason if reason else ''})"
    await task_lock_against_seal(conn, row.task_id)  # then the statement sees any seal
    resume = row.state is R.FAILED
    env, reset = E.redrive(row.envelope, why, include_permanent=include_permanent or resume)
    release = trigger == "release"
    if not await store.task_redriven_if(
        conn, row.task_id, row.state, row.generation, env, now, release=release
    ):
        log.info("redrive lost a race", task_id=row.task_id, state=row.state.value)
        return False
    await store.redrive_log_add(
        conn,
        row.task_id,
        env.generation,
        trigger,
        now,
        actor=actor,
        reason=reason,
        downstream=downstream,
        nodes=reset,
    )
    await emit(
        conn,
        tasks.TASK_CREATE,
        tasks.create_id(row.task_id, env.generation),
        env.SerializeToString(),
        now,
        current(),
    )
    metrics.task_redriven(trigger)
    log.info(
        "task redriven",
        task_id=row.task_id,
        trigger=trigger,
        generation=env.generation,
        nodes_reset=reset,
    )
    return True


def _trigger(row: RecoveryRow) -> tuple[str, str, str]:
    """(trigger, actor, reason) of a scheduled redrive; manual ones carry "manual|actor|reason"."""
    parts = row.redrive_trigger.split("|", 2)
    return parts[0], parts[1] if len(parts) > 1 else "", parts[2] if len(parts) > 2 else ""


async def redrive_sweep(ctx: Context) -> int:
    """Redrive every PARKED_FAILED task whose time has come (one batch, oldest due first)."""
    now = ctx.clock.now()
    done = 0
    async with ctx.db.transaction() as conn:
        for row in await store.tasks_due(conn, R.PARKED_FAILED, now, ctx.settings.batch):
            trigger, actor, reason = _trigger(row)
            done += await redrive_row(ctx, conn, row, trigger, now, actor=actor, reason=reason)
    if done:
        ctx.kick()
    return done
