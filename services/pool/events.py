"""Evaluation events (protos/dispo/pool/v1/events.proto) and their outbox relay.

Events are written to the outbox (libs/outbox.py, on the driver port: a list of one row) in
the transaction that changes the state they report; the relay publishes them with their message id and deletes them once published
(ADR-0062).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from dispo.libs.api.pool.v1 import events_pb2, pool_pb2
from dispo.libs.bus import Bus
from dispo.libs.clock import Clock
from dispo.libs.contracts import evaluations as contract
from dispo.libs.db.driver import Conn, Database
from dispo.libs.evaluation import LINE_TO_PB, VERDICT_TO_PB
from dispo.libs.outbox import DEFAULT_MAX_ATTEMPTS, OutboxRelay, OutboxRow, outbox_add_many
from dispo.libs.timestamps import to_timestamp
from dispo.pool import store
from dispo.pool.domain import Evaluation, EvaluationStatus, RunResult


async def _add(conn: Conn, subject: str, msg_id: str, payload: bytes, now: datetime) -> None:
    await outbox_add_many(conn, store.outbox, [OutboxRow(subject, msg_id, payload, now)])


async def add_started(conn: Conn, ev: Evaluation, now: datetime) -> None:
    message = events_pb2.EvaluationStarted(
        evaluation_id=ev.id,
        series=ev.series,
        line=LINE_TO_PB[ev.line],
        period=ev.period,
        configuration_json=ev.configuration_json,
        analysis_model=ev.analysis_model,
        started_at=to_timestamp(now),
    )
    await _add(
        conn,
        contract.EVALUATION_STARTED,
        contract.started_id(ev.id),
        message.SerializeToString(),
        now,
    )


async def add_run_recorded(
    conn: Conn,
    evaluation_id: str,
    run_id: str,
    case_id: str,
    result: RunResult,
    now: datetime,
) -> None:
    message = events_pb2.EvaluationRunRecorded(
        evaluation_id=evaluation_id,
        run_id=run_id,
        case_id=case_id,
        verdict=VERDICT_TO_PB[result.verdict],
        score=result.score,
        latency_ms=result.latency_ms,
        failure_reason=result.failure_reason,
        recorded_at=to_timestamp(now),
    )
    await _add(
        conn,
        contract.EVALUATION_RUN_RECORDED,
        contract.run_recorded_id(run_id),
        message.SerializeToString(),
        now,
    )


_COMPLETED_STATUS = {
    EvaluationStatus.COMPLETED: pool_pb2.EVALUATION_STATUS_COMPLETED,
    EvaluationStatus.CANCELLED: pool_pb2.EVALUATION_STATUS_CANCELLED,
}


async def add_completed(
    conn: Conn,
    evaluation_id: str,
    status: EvaluationStatus,
    run_count: int,
    now: datetime,
) -> None:
    """The completion reports the runs recorded before it (``run_count``), so a consumer
    applies it only once it holds them all."""
    message = events_pb2.EvaluationCompleted(
        evaluation_id=evaluation_id,
        status=_COMPLETED_STATUS[status],
        completed_at=to_timestamp(now),
        run_count=run_count,
    )
    await _add(
        conn,
        contract.EVALUATION_COMPLETED,
        contract.completed_id(evaluation_id),
        message.SerializeToString(),
        now,
    )


def relay_options(bus: Bus) -> dict[str, Any]:
    """How the pool's relay publishes: it ensures the EVALUATIONS stream before its first
    batch, and publishes one event at a time in outbox order, so that they reach the stream
    in the order they happened (the intelligence service waits for what an event depends
    on, per evaluation, so fewer of them would come back)."""
    return {
        "batch": 100,
        "poll_interval": 0.5,
        "ordered": True,
        "prepare": lambda: contract.ensure_evaluation_stream(bus),
    }


def outbox_relay(
    db: Database,
    bus: Bus,
    clock: Clock,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> OutboxRelay:
    """The pool's relay (:func:`relay_options`) outside a service process (the service's
    is ``rt.outbox_relay(store.outbox, **relay_options(rt.bus))``, with its gauges). Like
    every relay it deletes the rows it published (the stream keeps them), waits on
    ``clock``, and quarantines a row after ``max_attempts`` failed publications (the events
    behind it then go on). Kick it after a commit (Pool's ``on_commit``); it polls as a
    fallback."""
    return OutboxRelay(
        db,
        store.outbox,
        bus,
        clock=clock,
        max_attempts=max_attempts,
        **relay_options(bus),
    )
