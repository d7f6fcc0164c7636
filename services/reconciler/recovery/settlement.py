"""Settling UNKNOWN nodes (a downstream call may have happened, its result was not recorded).

For each UNKNOWN node, in order: its action's status probe (a non-idempotent worker
action's: the workers of its queue, asked through the executor, ADR-0100) decides (done → SUCCEEDED; not
done → PENDING, once that is final: the downstream fenced the key, or the action's
``max_effect_seconds`` passed since the node became UNKNOWN — before that, and without an
answer, ask again later; past the probe limit an operator decides,
:class:`~dispo.reconciler.recovery.policy.ProbeRule`); without a probe, an idempotent action is
re-run under its idempotency key (PENDING); a non-idempotent one waits for an operator's
decision (ResolveNode), with the reason recorded. Once no node is UNKNOWN the task is
scheduled for redrive.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.catalogue import Downstream, default_max_effect_seconds
from dispo.libs.db.driver import Conn
from dispo.libs.error_text import truncate_error
from dispo.libs.errors import FailedPrecondition, InvalidArgument, NotFound
from dispo.libs.logging import get_logger
from dispo.libs.proto_enums import node_status_name
from dispo.reconciler import envelope as E
from dispo.reconciler.context import Context
from dispo.reconciler.probes import ProbeResult, probe_effect
from dispo.reconciler.recovery import store
from dispo.reconciler.recovery.policy import ProbeVerdict
from dispo.reconciler.recovery.redrive import emit_terminal_failure, redrive_row, schedule
from dispo.reconciler.recovery.store import RecoveryRow
from dispo.reconciler.states import RecoveryState, SettlementMethod

log = get_logger(__name__)
R = RecoveryState
NEEDS_OPERATOR = (
    "no status probe and the action is not idempotent: an operator must decide (ResolveNode)"
)


@dataclass(frozen=True)
class SettlementPlan:
    node_id: str
    method: SettlementMethod
    # SUCCEEDED / PENDING, or None when not decided (probe not final, or operator).
    outcome: E.NS.ValueType | None
    reason: str
    # Undecided by its probe: when to ask again.
    probe_again_at: datetime | None = None


def max_effect_seconds(ctx: Context, spec: task_pb2.ActionSpec) -> float:
    """How long after its request a node's effect may land: as its envelope says, else (an
    envelope from before the field) the catalogue's default for its call's timeout."""
    if spec.max_effect_seconds > 0:
        return float(spec.max_effect_seconds)
    info = ctx.config.downstreams.get(spec.downstream)
    timeout_ms = spec.timeout_ms or (info.timeout_ms if info else Downstream.timeout_ms)
    return float(default_max_effect_seconds(timeout_ms))


def unknown_since(node: task_pb2.Node, parked_at: datetime) -> datetime:
    """When the node became UNKNOWN (its call was sent before then): its ``finished_at``,
    else when the reconciler first parked its task (later still)."""
    return E.moment(node.finished_at, parked_at)


def probed_by_its_worker(node: task_pb2.Node) -> bool:
    """A non-idempotent worker action's node is probed by the workers of its queue
    (ADR-0100; through the executor, when the reconciler knows one); an idempotent one is
    run again under its key, as an http action's."""
    return node.spec.kind == "worker" and not node.spec.idempotent


async def _probe(ctx: Context, task_id: str, node: task_pb2.Node) -> ProbeResult | str:
    """The answer of the node's probe, or why it cannot be asked."""
    if probed_by_its_worker(node) and ctx.worker_probes is not None:
        return await ctx.worker_probes.probe(task_id, node.node_id)
    info = ctx.config.downstreams.get(node.spec.downstream)
    if info is None or not info.base_url:
        return f"downstream {node.spec.downstream!r} is not in the reconciler's registry"
    return await probe_effect(
        ctx.http,
        info.base_url,
        node.spec.probe_path,
        node.idempotency_key,
        ctx.settings.http_timeout_seconds,
        node.retry.attempts,
    )


async def plan_node(
    ctx: Context, node: task_pb2.Node, parked_at: datetime | None = None, task_id: str = ""
) -> SettlementPlan:
    by_worker = probed_by_its_worker(node) and task_id and ctx.worker_probes is not None
    if node.spec.probe_path or by_worker:
        result = await _probe(ctx, task_id, node)
        if isinstance(result, str):
            return SettlementPlan(node.node_id, SettlementMethod.PROBE, None, result)
        now = ctx.clock.now()
        since = unknown_since(node, parked_at or now)
        effect = max_effect_seconds(ctx, node.spec)
        rule = ctx.config.probes
        verdict = rule.verdict(result.done, result.fenced, since, effect, now)
        if verdict is ProbeVerdict.DONE:
            return SettlementPlan(
                node.node_id, SettlementMethod.PROBE, E.NS.NODE_STATUS_SUCCEEDED, result.detail
            )
        if verdict is ProbeVerdict.NOT_DONE:
            why = result.detail if result.fenced else f"{result.detail} {effect:g} s after"
            return SettlementPlan(
                node.node_id, SettlementMethod.PROBE, E.NS.NODE_STATUS_PENDING, why
            )
        if verdict is ProbeVerdict.GIVE_UP:
            return SettlementPlan(
                node.node_id,
                SettlementMethod.OPERATOR,
                None,
                f"no final probe answer in {rule.limit:g} s ({result.detail}): an operator"
                " must decide (ResolveNode)",
            )
        reason = result.detail
        if verdict is ProbeVerdict.NOT_YET:
            final = since + timedelta(seconds=effect)
            reason = f"{reason}, not final before {final.isoformat(timespec='seconds')}"
            reason += f" (max_effect_seconds {effect:g})"
        return SettlementPlan(
            node.node_id,
            SettlementMethod.PROBE,
            None,
            reason,
            rule.next_probe(since, effect, now),
        )
    if node.spec.idempotent:
        return SettlementPlan(
            node.node_id,
            SettlementMethod.IDEMPOTENT_RERUN,
            E.NS.NODE_STATUS_PENDING,
            "no status probe; the action is idempotent, re-run under the same idempotency key",
        )
    return SettlementPlan(node.node_id, SettlementMethod.OPERATOR, None, NEEDS_OPERATOR)


async def settle_sweep(ctx: Context) -> int:
    """Probe the UNKNOWN nodes of tasks awaiting settlement (one batch)."""
    now = ctx.clock.now()
    retry_at = now + timedelta(seconds=ctx.config.settle_retry_delay)
    async with ctx.db.transaction() as conn:
        rows = await store.tasks_due(conn, R.AWAITING_SETTLEMENT, now, ctx.settings.batch)
        for row in rows:  # claimed until retry_at: other replicas skip them meanwhile
            await store.task_set_state_if(
                conn,
                row.task_id,
                R.AWAITING_SETTLEMENT,
                R.AWAITING_SETTLEMENT,
                now,
                generation=row.generation,
                next_redrive_at=retry_at,
            )
    for row in rows:
        plans = await asyncio.gather(
            *(plan_node(ctx, n, row.parked_at, row.task_id) for n in E.unknown(row.envelope))
        )
        await _apply(ctx, row, list(plans))
    if rows:
        ctx.kick()
    return len(rows)


async def _apply(ctx: Context, read: RecoveryRow, plans: list[SettlementPlan]) -> None:
    now = ctx.clock.now()
    async with ctx.db.transaction() as conn:
        row = await store.task_get(conn, read.task_id, for_update=True)
        if (
            row is None
            or row.state is not R.AWAITING_SETTLEMENT
            or row.generation != read.generation
        ):
            return
        env = task_pb2.Task()
        env.CopyFrom(row.envelope)
        for plan in plans:
            if plan.outcome is not None:
                E.settle(env, plan.node_id, plan.outcome)
                await store.settlement_add(
                    conn,
                    row.task_id,
                    plan.node_id,
                    row.generation,
                    plan.method.value,
                    node_status_name(plan.outcome),
                    now,
                    reason=plan.reason,
                )
                log.info(
                    "node settled",
                    task_id=row.task_id,
                    node_id=plan.node_id,
                    method=plan.method.value,
                    outcome=node_status_name(plan.outcome),
                )
        undecided = [p for p in plans if p.outcome is None]
        if not undecided:
            await _settled(ctx, conn, replace(row, envelope=env), now)
            return
        reason = truncate_error("; ".join(f"{p.node_id}: {p.reason}" for p in undecided))
        if any(p.method is SettlementMethod.OPERATOR for p in undecided):
            await store.task_set_state_if(
                conn,
                row.task_id,
                R.AWAITING_SETTLEMENT,
                R.AWAITING_DECISION,
                now,
                generation=row.generation,
                envelope=env,
                reason=reason,
                next_redrive_at=None,
            )
        else:
            again = [p.probe_again_at for p in undecided if p.probe_again_at is not None]
            await store.task_set_state_if(
                conn,
                row.task_id,
                R.AWAITING_SETTLEMENT,
                R.AWAITING_SETTLEMENT,
                now,
                generation=row.generation,
                envelope=env,
                reason=reason,
                **({"next_redrive_at": min(again)} if again else {}),
            )


async def _settled(ctx: Context, conn: Conn, row: RecoveryRow, now: datetime) -> None:
    nxt = schedule(ctx, row, now)
    await store.task_set_state_if(
        conn,
        row.task_id,
        row.state,
        nxt.state,
        now,
        generation=row.generation,
        envelope=nxt.envelope,
        next_redrive_at=nxt.next_redrive_at,
        redrive_trigger=nxt.redrive_trigger,
        reason=nxt.reason,
    )
    if nxt.state is R.FAILED:
        await emit_terminal_failure(conn, nxt, now)


async def resolve_node(
    ctx: Context, task_id: str, node_id: str, done: bool, actor: str, reason: str
) -> tuple[RecoveryRow, bool]:
    """An operator's decision on an UNKNOWN node; redrives at once when it was the last one
    and no FAILED node waits for its backoff. On a FAILED task (its wait for a decision
    outlived its age limit) the decision is recorded and the task stays FAILED until an
    operator resumes it (RedriveTask)."""
    if not reason.strip():
        raise InvalidArgument("reason", "required: say why the node is resolved this way")
    now = ctx.clock.now()
    async with ctx.db.transaction() as conn:
        row = await store.task_get(conn, task_id, for_update=True)
        if row is None:
            raise NotFound(f"task {task_id!r} is not held by the reconciler")
        if row.state not in (R.AWAITING_DECISION, R.AWAITING_SETTLEMENT, R.FAILED):
            raise FailedPrecondition(f"task {task_id} is {row.state.name}, not awaiting a decision")
        if node_id not in {n.node_id for n in E.unknown(row.envelope)}:
            raise InvalidArgument("node_id", f"task {task_id} has no UNKNOWN node {node_id!r}")
        env = task_pb2.Task()
        env.CopyFrom(row.envelope)
        outcome = E.NS.NODE_STATUS_SUCCEEDED if done else E.NS.NODE_STATUS_PENDING
        E.settle(env, node_id, outcome)
        await store.settlement_add(
            conn,
            task_id,
            node_id,
            row.generation,
            SettlementMethod.OPERATOR.value,
            node_status_name(outcome),
            now,
            reason=reason,
            actor=actor,
        )
        redriven = False
        if E.unknown(env) or row.state is R.FAILED:  # a FAILED task: RedriveTask resumes it
            await store.task_set_state_if(
                conn, task_id, row.state, row.state, now, generation=row.generation, envelope=env
            )
        else:
            await _settled(ctx, conn, replace(row, envelope=env), now)
            fresh = await store.task_get(conn, task_id, for_update=True)
            assert fresh is not None
            if (
                fresh.state is R.PARKED_FAILED
                and fresh.next_redrive_at is not None
                and fresh.next_redrive_at <= now
            ):
                redriven = await redrive_row(
                    ctx, conn, fresh, "decision", now, actor=actor, reason=reason
                )
        result = await store.task_get(conn, task_id)
    ctx.kick()
    assert result is not None
    return result, redriven
