"""Arbitration between businesses issuing conflicting effects on one target.

A cell may declare a conflict key (a payload field naming its target, e.g. content_id)
and an effect. Every task accepted on task.create records a *claim* per such cell. The
arbitration sweep looks at targets with open claims: when claims from different
businesses meet within the window, the policy (ordered business / cell priority, ties to
the earlier accepted task) picks a winner, a verdict with its reason is recorded, and
each losing task is cancelled through the executor's normal path (task.cancel: its
pending nodes become CANCELLED, running ones finish). A claim that meets no conflict
within the window is closed as uncontested.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.contracts import tasks
from dispo.libs.db.driver import Conn
from dispo.libs.logging import get_logger
from dispo.libs.payload import payload_value
from dispo.libs.timestamps import to_timestamp
from dispo.reconciler import envelope as E
from dispo.reconciler.arbitration import store as arb
from dispo.reconciler.arbitration.policy import Contender
from dispo.reconciler.context import Context
from dispo.reconciler.outbox import emit
from dispo.reconciler.states import ClaimState

log = get_logger(__name__)
C = ClaimState


def claims_of(ctx: Context, env: task_pb2.Task) -> list[arb.Claim]:
    """A claim for each cell of the task that declares a conflict."""
    conflicts = ctx.config.arbitration.conflicts
    out, seen = [], set()
    for node in env.nodes:
        conflict = conflicts.get(node.cell)
        if conflict is None or node.cell_ref in seen:
            continue
        seen.add(node.cell_ref)
        payload = (
            payload_value(env.payloads[node.cell_ref]) if node.cell_ref in env.payloads else {}
        )
        value = payload.get(conflict.key)
        if value is None:
            continue
        out.append(
            arb.Claim(node.cell_ref, node.cell, f"{conflict.key}={value}", conflict.effect, payload)
        )
    return out


async def on_create(ctx: Context, env: task_pb2.Task) -> int:
    """Record the claims of a newly accepted task (first publication only)."""
    if env.generation != 0:
        return 0
    claims = claims_of(ctx, env)
    if not claims:
        return 0
    accepted_at = E.moment(env.created_at, ctx.clock.now())
    async with ctx.db.connection() as conn:  # one statement: it commits alone
        return await arb.claims_add_many(conn, env.task_id, env.business, accepted_at, claims)


async def arbitrate_sweep(ctx: Context) -> int:
    """Decide every target with open claims (one batch); returns verdicts recorded."""
    now = ctx.clock.now()
    verdicts = 0
    async with ctx.db.connection() as conn:
        targets = await arb.claims_open_targets(conn, ctx.settings.batch)
    for target, effect in targets:
        async with ctx.db.transaction() as conn:
            verdicts += await _decide_target(ctx, conn, target, effect, now)
    if verdicts:
        ctx.kick()
    return verdicts


async def _decide_target(ctx: Context, conn: Conn, target: str, effect: str, now: datetime) -> int:
    """Settle every open claim on one target, oldest first: each meets the claims within
    the window of it; a conflict yields a verdict, no conflict past the window closes it."""
    policy = ctx.config.arbitration
    rows = await arb.claims_of_target(conn, target, effect, policy.window)
    by_task: dict[str, Contender] = {}
    states: dict[str, C] = {}
    for r in rows:
        by_task.setdefault(r.task_id, Contender(r.task_id, r.business, r.cell, r.accepted_at))
        states[r.task_id] = C(r.state)
    verdicts = 0
    seen: set[str] = set()
    while True:
        waiting = sorted(
            (c.accepted_at, t) for t, c in by_task.items() if states[t] is C.OPEN and t not in seen
        )
        if not waiting:
            return verdicts
        anchor = by_task[waiting[0][1]]
        seen.add(anchor.task_id)
        group = [
            c
            for t, c in by_task.items()
            if states[t] in (C.OPEN, C.WON)
            and policy.within_window(c.accepted_at, anchor.accepted_at)
        ]
        ruling = policy.decide(group)
        if ruling is None:
            if anchor.accepted_at < now - timedelta(seconds=policy.window):
                await arb.claims_set_if(
                    conn, target, effect, [anchor.task_id], (C.OPEN,), C.UNCONTESTED, None
                )
                states[anchor.task_id] = C.UNCONTESTED
            continue
        losers = {c.task_id for c in ruling.losers}
        winners = [
            c.task_id for c in group if c.task_id not in losers and states[c.task_id] is C.OPEN
        ]
        new_losers = [c.task_id for c in ruling.losers]
        verdict = await arb.verdict_add(
            conn, target, effect, ruling.winner.task_id, new_losers, ruling.reason, now
        )
        await arb.claims_set_if(conn, target, effect, winners, (C.OPEN,), C.WON, verdict)
        await arb.claims_set_if(conn, target, effect, new_losers, (C.OPEN, C.WON), C.LOST, verdict)
        states.update({t: C.WON for t in winners} | {t: C.LOST for t in new_losers})
        for loser in new_losers:
            cancel = task_pb2.CancelRequest(task_id=loser, requested_at=to_timestamp(now))
            await emit(
                conn,
                tasks.TASK_CANCEL,
                tasks.cancel_id(loser, f"verdict{verdict}"),
                cancel.SerializeToString(),
                now,
            )
            for (
                r
            ) in rows:  # a declared compensating cell undoes what the loser may already have done
                conflict = policy.conflicts.get(r.cell)
                if r.task_id == loser and conflict is not None and conflict.compensate:
                    await arb.compensation_add(
                        conn, verdict, loser, r.business, conflict.compensate, r.payload, now
                    )
        verdicts += 1
        log.info(
            "arbitration verdict",
            verdict=verdict,
            target=target,
            effect=effect,
            winner=ruling.winner.task_id,
            losers=new_losers,
            reason=ruling.reason,
        )
