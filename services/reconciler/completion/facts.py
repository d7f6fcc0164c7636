"""The three completion facts, recorded separately:

1. *finished* — the first terminal status snapshot of a task (task.status.<task_id>);
2. *notified* — the completion notification delivered to the caller's callback: an HTTP
   webhook (POST, HMAC-SHA256 signed with each valid signing secret of the task's business,
   retried with backoff) or a NATS subject
   (``nats:<subject>``, published with a message id); every attempt is recorded;
3. *reconciled* — the reconcile sweep probed the finished task's nodes whose actions
   have status probes and recorded any disagreement as a finding.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from dispo.auth import store as auth_store
from dispo.auth.signing import SigningKey, SigningSecretRecord
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.backoff import backoff
from dispo.libs.clock import within
from dispo.libs.contracts import tasks
from dispo.libs.egress import NATS_SCHEME, EgressRefused, check_callback
from dispo.libs.error_text import truncate_error
from dispo.libs.logging import get_logger
from dispo.libs.outputs import EMPTY_RESULT, OutputsUnavailable, has_outputs, succeeded
from dispo.libs.payload import canonical_json, json_payload, payload_value
from dispo.libs.proto_enums import node_status_name, task_status_name
from dispo.libs.tracing import inject, resumed
from dispo.reconciler import envelope as E
from dispo.reconciler.completion import store as cs
from dispo.reconciler.context import Context
from dispo.reconciler.probes import DeliveryResult, deliver_webhook, probe_effect
from dispo.reconciler.recovery import store
from dispo.reconciler.states import PARKED, NotifyState, ReconcileState, RecoveryState

log = get_logger(__name__)


async def on_status(ctx: Context, env: task_pb2.Task) -> bool:
    """A status snapshot: record "finished" for a terminal one; a held task is resolved.
    True if this snapshot recorded the fact."""
    [recorded] = await on_statuses(ctx, [env])
    return recorded


async def on_statuses(
    ctx: Context, envs: Sequence[task_pb2.Task], traces: Sequence[str | None] = ()
) -> list[bool]:
    """:func:`on_status` for many snapshots in one statement, whatever their number (the
    facts and the held tasks resolved together); one answer per snapshot, in order;
    ``traces``, the trace context each came with, is kept for the callback. Of two terminal
    snapshots of one task, the first is the fact, as it would be one after the other. A held task that
    finished SUCCEEDED or CANCELLED is resolved; one that ended FAILED stays held (its
    task.fail makes it FAILED, for an operator to resume)."""
    now = ctx.clock.now()
    carried = list(traces) or [None] * len(envs)
    facts = [
        cs.Finished(
            env,
            task_status_name(env.status),
            E.moment(env.updated_at, now),
            NotifyState.PENDING if env.callback_url else NotifyState.NONE,
            trace,
            reconcile_at_finish(env, ctx.config.reconcile.sample_percent),
        )
        for env, trace in zip(envs, carried, strict=True)
        if env.status in E.TERMINAL_TASK
    ]
    if not facts:
        return [False] * len(envs)
    reasons: dict[str, str] = {}
    for fact in facts:
        if fact.env.status == E.TS.TASK_STATUS_FAILED:
            continue  # held FAILED (resumable) by intake of the task.fail, or by the policy
        reasons.setdefault(
            fact.env.task_id,
            truncate_error(f"task finished {fact.status}: {fact.env.status_reason}"),
        )
    reconcile_at = now + timedelta(seconds=ctx.config.reconcile.delay)
    resolving = store.tasks_set_state_if_part(
        reasons, (*PARKED, RecoveryState.REDRIVEN), RecoveryState.RESOLVED, now
    )
    async with ctx.db.connection() as conn:  # one statement: it commits alone
        recorded = await cs.finished_add_many(conn, facts, now, reconcile_at, resolving)
    if any(f.notify is NotifyState.PENDING and f.env.task_id in recorded for f in facts):
        ctx.kick_sweep("notify")  # the caller hears now, not at the sweep's next interval
    answers = []
    for env in envs:
        first = env.task_id in recorded and env.status in E.TERMINAL_TASK
        if first:
            recorded.discard(env.task_id)
            log.info(
                "task finished",
                task_id=env.task_id,
                status=task_status_name(env.status),
                callback=bool(env.callback_url),
            )
        answers.append(first)
    return answers


def notification(
    env: task_pb2.Task, finished_at: datetime, result: common_pb2.Payload | None = None
) -> bytes:
    """The callback's body: the task's final snapshot, and its ``result`` (ADR-0093: the
    outputs of its result nodes by node id; null unless it SUCCEEDED)."""
    body = {
        "task_id": env.task_id,
        "business": env.business,
        "status": task_status_name(env.status),
        "status_reason": env.status_reason,
        "finished_at": finished_at.isoformat(),
        "nodes": [
            {
                "node_id": n.node_id,
                "status": node_status_name(n.status),
                "last_error": n.last_error,
            }
            for n in env.nodes
        ],
        "result": payload_value(result) if result is not None else None,
    }
    return canonical_json(body)


async def _result(ctx: Context, env: task_pb2.Task) -> common_pb2.Payload | None:
    """The result a callback of ``env`` carries (None unless it SUCCEEDED); raises
    OutputsUnavailable when it has one the executor did not give."""
    if ctx.outputs is None:
        if succeeded(env) and has_outputs(env):
            raise OutputsUnavailable("the reconciler has no executor address")
        return json_payload(EMPTY_RESULT) if succeeded(env) else None
    return await ctx.outputs.result(env)


def signing_secrets(
    key: SigningKey | None, business: str, records: Sequence[SigningSecretRecord]
) -> list[str] | str:
    """The secrets a webhook of ``business`` is signed with under ``key``, newest first,
    from its valid records; or why it cannot be signed (it is then not sent: never
    unsigned)."""
    if key is None:
        return "not sent: the reconciler has no signing key (DISPO_SIGNING_KEY)"
    if not records:
        return f"not sent: business {business!r} has no webhook signing secret"
    # A secret made under another key cannot be derived here (the key was changed: the
    # business's rotation to a secret under the new one leaves the old one out).
    usable = [r for r in records if r.key_id == key.key_id]
    if not usable:
        return (
            f"not sent: signing secret {records[0].secret_id} was made under another signing"
            f" key (key id {records[0].key_id}; this reconciler's is {key.key_id})"
        )
    return [key.derive(business, r.secret_id, r.salt) for r in usable]


def signing_by_business(
    key: SigningKey | None, businesses: Sequence[str], records: Sequence[SigningSecretRecord]
) -> dict[str, list[str] | str]:
    """:func:`signing_secrets` of each of ``businesses``, from their valid ``records``
    (newest first per business)."""
    by_business: dict[str, list[SigningSecretRecord]] = {b: [] for b in businesses}
    for record in records:
        by_business[record.business].append(record)
    return {b: signing_secrets(key, b, found) for b, found in by_business.items()}


async def _deliver(
    ctx: Context, row: Any, now: datetime, signing: dict[str, list[str] | str]
) -> DeliveryResult:
    """One attempt at the notification, as a span of the task's trace."""
    with resumed(row.trace, "callback"):
        return await _deliver_traced(ctx, row, now, signing)


async def _deliver_traced(
    ctx: Context, row: Any, now: datetime, signing: dict[str, list[str] | str]
) -> DeliveryResult:
    env = task_pb2.Task.FromString(row.envelope)
    attempt = row.notify_attempts + 1
    try:  # again: the allow-list may have changed since the Submit
        where = check_callback(row.callback_url, env.business, ctx.egress)
    except EgressRefused as refused:
        return DeliveryResult(False, None, truncate_error(f"not sent: callback_url {refused}"))
    try:  # never a SUCCEEDED task's body without its result: this attempt fails, a later one
        result = await _result(ctx, env)
    except OutputsUnavailable as error:
        return DeliveryResult(
            False, None, truncate_error(f"not sent: the task's result was not read: {error}")
        )
    body = notification(env, row.finished_at, result)
    if isinstance(where, str):
        subject = where
        if ctx.bus is None:
            return DeliveryResult(False, None, "no NATS connection")
        headers = {"X-Dispo-Task-Id": row.task_id}
        inject(headers)
        try:
            await ctx.bus.publish(
                subject, body, msg_id=tasks.completion_id(row.task_id), headers=headers
            )
        except Exception as error:  # no stream for the subject, NATS down
            return DeliveryResult(
                False, None, truncate_error(f"publish to {subject} failed: {error!r}")
            )
        return DeliveryResult(True)
    secrets = signing[row.business]
    if isinstance(secrets, str):
        return DeliveryResult(False, None, secrets)
    return await deliver_webhook(
        ctx.http,
        where,
        body,
        task_id=row.task_id,
        attempt=attempt,
        secrets=secrets,
        timestamp=str(int(now.timestamp())),
        timeout=ctx.settings.http_timeout_seconds,
    )


def _webhook(row: Any) -> bool:
    return not str(row.callback_url).startswith(NATS_SCHEME)


async def notify_sweep(ctx: Context) -> int:
    """Start due completion notifications in the free delivery slots (one claim); returns
    how many were started. Each delivery runs on its own within its deadline and records
    its own outcome: none waits for another, and a business holds at most
    ``notify_per_business`` of the ``notify_concurrency`` slots (:mod:`.in_flight`)."""
    settings = ctx.settings
    room = min(settings.batch, ctx.deliveries.room(settings.notify_concurrency))
    if room == 0:  # every slot taken: a delivery that ends asks for the next pass
        ctx.deliveries.backlog = True
        return 0
    now = ctx.clock.now()
    async with ctx.db.connection() as conn:  # one statement: it commits alone
        rows = await cs.completions_claim_notify(
            conn,
            now,
            ctx.call_lease(now),
            room,
            per_business=settings.notify_per_business,
            busy=ctx.deliveries.by_business(),
        )
    # the signing secrets of the claim's webhooks: one read, derived once per business
    businesses = sorted({r.business for r in rows if _webhook(r)})
    records = await _signing_records(ctx, businesses, now) if businesses else []
    signing = signing_by_business(ctx.signing_key, businesses, records)
    for row in rows:
        ctx.deliveries.start(row.task_id, row.business, _attempt(ctx, row, now, signing))
    # More may be due when the claim filled its room or a business its share: then a
    # delivery that ends asks for the next pass.
    held = ctx.deliveries.by_business().values()
    ctx.deliveries.backlog = len(rows) == room or any(
        n >= settings.notify_per_business for n in held
    )
    ctx.deliveries.on_free = lambda: ctx.kick_sweep("notify")
    return len(rows)


async def _signing_records(
    ctx: Context, businesses: list[str], now: datetime
) -> list[SigningSecretRecord]:
    """The valid signing secrets of ``businesses`` (the auth context's store)."""
    async with ctx.db.connection() as conn:
        return await auth_store.signing_secrets_valid(conn, businesses, now)


async def _attempt(
    ctx: Context, row: Any, now: datetime, signing: dict[str, list[str] | str]
) -> None:
    """One delivery within its deadline (the whole of it: the request and its answer, on
    the context's clock), then its outcome recorded."""
    deadline = ctx.settings.http_timeout_seconds
    try:
        result = await within(ctx.clock, deadline, _deliver(ctx, row, now, signing))
    except TimeoutError:
        result = DeliveryResult(
            False, None, f"delivery failed: not done within its {deadline:g} s deadline"
        )
    await _record(ctx, row, result)


async def _record(ctx: Context, row: Any, result: DeliveryResult) -> None:
    policy = ctx.config.callbacks
    now = ctx.clock.now()
    attempt = row.notify_attempts + 1
    if result.ok:
        new, next_at = NotifyState.DELIVERED, None
    elif attempt >= policy.max_attempts:
        new, next_at = NotifyState.GAVE_UP, None
    else:
        delay = backoff(policy.base_delay, policy.max_delay, policy.jitter, attempt, ctx.rng)
        new, next_at = NotifyState.PENDING, now + timedelta(seconds=delay)
    async with ctx.db.transaction() as conn:
        await cs.delivery_add(
            conn,
            row.task_id,
            attempt,
            row.callback_url,
            now,
            result.ok,
            result.status_code,
            result.error,
        )
        recorded = await cs.completion_set_notify_if(
            conn, row.task_id, row.notify_attempts, new, now, next_at, result.error
        )
    if recorded:  # the task's line is "task finished"; an attempt that failed is said too
        (log.debug if new is NotifyState.DELIVERED else log.info)(
            "completion notification",
            task_id=row.task_id,
            attempt=attempt,
            outcome=new.value,
            error=result.error,
        )


def sampled(task_id: str, percent: int) -> bool:
    """A stable sample: the same task is always in or out for a given percentage."""
    return int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) % 100 < percent


PROBED = {
    E.NS.NODE_STATUS_SUCCEEDED,
    E.NS.NODE_STATUS_FAILED,
    E.NS.NODE_STATUS_CANCELLED,
    E.NS.NODE_STATUS_DEPENDENCY_FAILED,
}


def probed_nodes(env: task_pb2.Task) -> list[task_pb2.Node]:
    """The nodes of a finished task the reconcile sweep probes: those whose action has a
    status probe and that ran to an end."""
    return [n for n in env.nodes if n.spec.probe_path and n.status in PROBED]


def reconcile_at_finish(env: task_pb2.Task, sample_percent: int) -> ReconcileState:
    """What the reconcile sweep would find without a probe, known when the task finishes:
    NOT_SAMPLED, NOTHING_TO_PROBE, or else PENDING (its nodes are probed after the delay).
    A task with nothing to probe then costs the sweep nothing."""
    if not sampled(env.task_id, sample_percent):
        return ReconcileState.NOT_SAMPLED
    if not probed_nodes(env):
        return ReconcileState.NOTHING_TO_PROBE
    return ReconcileState.PENDING


async def _reconcile_one(
    ctx: Context, row: Any
) -> tuple[ReconcileState, list[tuple[task_pb2.Node, str, str]]]:
    """(state, findings as (node, observed, detail)); PENDING when a probe did not answer."""
    policy = ctx.config.reconcile
    if not sampled(row.task_id, policy.sample_percent):
        return ReconcileState.NOT_SAMPLED, []
    env = task_pb2.Task.FromString(row.envelope)
    nodes = probed_nodes(env)
    if not nodes:
        return ReconcileState.NOTHING_TO_PROBE, []

    async def probe(node: task_pb2.Node) -> tuple[bool | None, str]:
        info = ctx.config.downstreams.get(node.spec.downstream)
        if info is None:
            return None, f"downstream {node.spec.downstream!r} is not in the reconciler's registry"
        result = await probe_effect(
            ctx.http,
            info.base_url,
            node.spec.probe_path,
            node.idempotency_key,
            ctx.settings.http_timeout_seconds,
        )
        return result.done, result.detail

    results = await asyncio.gather(*(probe(n) for n in nodes))
    findings = []
    unanswered = []
    for node, (done, detail) in zip(nodes, results, strict=False):
        recorded_done = node.status == E.NS.NODE_STATUS_SUCCEEDED
        if done is None:
            unanswered.append((node, "unreachable", detail))
        elif done != recorded_done:
            findings.append((node, "done" if done else "not done", detail))
    if unanswered:
        if row.reconcile_attempts + 1 < policy.max_attempts:
            return ReconcileState.PENDING, []
        findings += unanswered
    return (ReconcileState.MISMATCH if findings else ReconcileState.MATCHED), findings


async def reconcile_sweep(ctx: Context) -> int:
    """The periodic reconcile sweep over finished tasks (one batch)."""
    policy = ctx.config.reconcile
    now = ctx.clock.now()
    async with ctx.db.connection() as conn:  # one statement: it commits alone
        rows = await cs.completions_claim_reconcile(
            conn, now, now + timedelta(seconds=policy.retry_delay), ctx.settings.batch
        )
    outcomes = await asyncio.gather(*(_reconcile_one(ctx, row) for row in rows))
    now = ctx.clock.now()
    retry_at = now + timedelta(seconds=policy.retry_delay)
    async with ctx.db.transaction() as conn:
        moved = await cs.completions_set_reconcile_if_many(
            conn,
            [
                (
                    row.task_id,
                    row.reconcile_attempts,
                    state,
                    retry_at if state is ReconcileState.PENDING else None,
                )
                for row, (state, _) in zip(rows, outcomes, strict=True)
            ],
            now,
        )
        found = [
            cs.Finding(
                row.task_id,
                node.node_id,
                node.spec.downstream,
                node_status_name(node.status),
                observed,
                detail,
            )
            for row, (_, findings) in zip(rows, outcomes, strict=True)
            if row.task_id in moved
            for node, observed, detail in findings
        ]
        await cs.findings_add_many(conn, found, now)
    for row, (_, findings) in zip(rows, outcomes, strict=True):
        if row.task_id in moved and findings:
            log.warning(
                "reconciliation mismatch",
                task_id=row.task_id,
                nodes=[n.node_id for n, _, _ in findings],
            )
    return len(rows)
