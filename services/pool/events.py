"""Evaluation events (protos/dispo/pool/v1/events.proto) and their outbox relay.

Events are written to the outbox in the transaction that changes the state they report;
the relay publishes them with their message id and marks them published.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime

from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from dispo.libs.api.pool.v1 import events_pb2
from dispo.libs.bus import Bus
from dispo.libs.clock import Clock
from dispo.libs.logging import get_logger
from dispo.pool import repository as repo
from dispo.pool.domain import Evaluation, RunResult

log = get_logger(__name__)

STREAM = "EVALUATIONS"
SUBJECTS = ["evaluation.>"]


def _ts(moment: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(moment)
    return stamp


async def add_started(conn: AsyncConnection, ev: Evaluation, now: datetime) -> None:
    message = events_pb2.EvaluationStarted(
        evaluation_id=ev.id, series=ev.series, line=ev.line.value, period=ev.period,
        configuration_json=ev.configuration_json, analysis_model=ev.analysis_model, started_at=_ts(now))
    await repo.outbox_add(conn, "evaluation.started", f"{ev.id}:started", message.SerializeToString(), now)


async def add_run_recorded(conn: AsyncConnection, evaluation_id: str, run_id: str, case_id: str,
                           result: RunResult, now: datetime) -> None:
    message = events_pb2.EvaluationRunRecorded(
        evaluation_id=evaluation_id, run_id=run_id, case_id=case_id, verdict=result.verdict.value,
        score=result.score, latency_ms=result.latency_ms, failure_reason=result.failure_reason, recorded_at=_ts(now))
    await repo.outbox_add(conn, "evaluation.run_recorded", run_id, message.SerializeToString(), now)


async def add_completed(conn: AsyncConnection, evaluation_id: str, status: str, now: datetime) -> None:
    message = events_pb2.EvaluationCompleted(evaluation_id=evaluation_id, status=status, completed_at=_ts(now))
    await repo.outbox_add(conn, "evaluation.completed", f"{evaluation_id}:completed", message.SerializeToString(), now)


class Relay:
    """Publishes outbox rows in order; woken by :meth:`kick` after a commit, polls as a fallback."""

    def __init__(self, engine: AsyncEngine, bus: Bus, clock: Clock, *, batch: int = 100, poll: float = 0.5) -> None:
        self.engine = engine
        self.bus = bus
        self.clock = clock
        self.batch = batch
        self.poll = poll
        self._kicked = asyncio.Event()
        self._stopping = asyncio.Event()

    def kick(self) -> None:
        self._kicked.set()

    def stop(self) -> None:
        self._stopping.set()
        self._kicked.set()

    async def publish_once(self) -> int:
        """Publish one batch; returns how many were published."""
        async with self.engine.begin() as conn:
            rows = await repo.outbox_unpublished(conn, self.batch)
            published = []
            for row_id, subject, msg_id, payload in rows:
                await self.bus.publish(subject, payload, msg_id=msg_id)
                published.append(row_id)
            if published:
                await repo.outbox_mark_published(conn, published, self.clock.now())
        return len(published)

    async def run(self) -> None:
        ensured = False
        while not self._stopping.is_set():
            try:
                if not ensured:
                    await self.bus.ensure_stream(STREAM, SUBJECTS)
                    ensured = True
                while await self.publish_once() == self.batch:
                    pass
            except Exception as error:  # NATS or PostgreSQL away: try again shortly
                log.warning("outbox relay failed", error=repr(error))
            self._kicked.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kicked.wait(), self.poll)
