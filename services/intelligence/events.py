"""The cron pool's evaluation events (stream ``EVALUATIONS``) into the evaluation feed.

Idempotent: a repeated ``started`` or ``completed`` is a no-op, a run_id already stored is
skipped. A malformed or contradictory event is refused (and so quarantined, with the
reason).

Order is kept per evaluation, not across the stream: many events are handled at once, by
every replica, and each one waits only for its own evaluation. An event that arrived before
what it depends on is redelivered later: a run or a completion before the evaluation's
registration, a completion before the ``run_count`` runs it reports. So the read model goes
registered -> runs -> completed for each evaluation whatever the delivery order, and an
evaluation whose events are stuck or quarantined delays no other. After
``max_unknown_deliveries`` such deliveries the event is given up to the quarantine, from
where it can be replayed once what it waited for is there.
"""

from __future__ import annotations

from collections.abc import Callable

from dispo.intelligence.convert import line_name, verdict_name
from dispo.intelligence.evaluations import (
    EvaluationRecordStatus,
    new_evaluation,
    new_run_result,
)
from dispo.intelligence.feed import EvaluationFeed
from dispo.libs.api.pool.v1 import events_pb2, pool_pb2
from dispo.libs.bus import ACK, Bus, Consumer, Disposition, Handler, Nak, Term
from dispo.libs.contracts import evaluations as contract
from dispo.libs.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from dispo.libs.logging import get_logger
from dispo.libs.timestamps import from_timestamp
from nats.aio.msg import Msg

log = get_logger(__name__)

STREAM = contract.EVALUATIONS.name
STARTED, RUN_RECORDED, COMPLETED = (
    contract.EVALUATION_STARTED,
    contract.EVALUATION_RUN_RECORDED,
    contract.EVALUATION_COMPLETED,
)


class EvaluationEvents:
    def __init__(
        self, feed: EvaluationFeed, retry_delay: float, max_unknown_deliveries: int
    ) -> None:
        self.feed = feed
        self.retry_delay = retry_delay
        # An event whose evaluation is still unknown after this many deliveries is given up
        # (terminated, logged) so that it cannot hold up the ordered stream for ever.
        self.max_unknown_deliveries = max_unknown_deliveries

    async def handle_message(self, message: Msg) -> Disposition:
        return await self.handle(
            message.subject, message.data, deliveries=message.metadata.num_delivered or 1
        )

    async def handle(self, subject: str, data: bytes, deliveries: int = 1) -> Disposition:
        try:
            if subject == STARTED:
                started = events_pb2.EvaluationStarted.FromString(data)
                evaluation = new_evaluation(
                    started.evaluation_id,
                    started.series,
                    line_name(started.line),
                    started.period,
                    started.configuration_json,
                    started.analysis_model,
                )
                await self.feed.create(evaluation)
            elif subject == RUN_RECORDED:
                run = events_pb2.EvaluationRunRecorded.FromString(data)
                result = new_run_result(
                    run.run_id,
                    run.case_id,
                    verdict_name(run.verdict),
                    run.score,
                    run.latency_ms,
                    run.failure_reason,
                    from_timestamp(run.recorded_at, run.HasField("recorded_at")),
                )
                await self.feed.record_runs(run.evaluation_id, [result])
            elif subject == COMPLETED:
                completed = events_pb2.EvaluationCompleted.FromString(data)
                await self._runs_arrived(completed)
                await self.feed.complete(
                    completed.evaluation_id, completion_status(completed.status)
                )
            else:
                return Term(f"unknown subject {subject}")
        except NotFound as error:
            if deliveries >= self.max_unknown_deliveries:
                return Term(f"{error.message} after {deliveries} deliveries; giving up")
            log.info(
                "event came before what it depends on; retrying later",
                subject=subject,
                error=error.message,
                deliveries=deliveries,
            )
            return Nak(self.retry_delay)
        except (InvalidArgument, AlreadyExists, FailedPrecondition) as error:
            return Term(f"{type(error).__name__}: {error.message}")
        except Exception as error:
            if type(error).__name__ == "DecodeError":
                return Term(f"malformed {subject}: {error}")
            raise
        return ACK

    async def _runs_arrived(self, completed: events_pb2.EvaluationCompleted) -> None:
        """``NotFound`` (come back later) while fewer runs are stored than the completion
        reports; a completion already applied passes (a redelivery)."""
        evaluation = await self.feed.get(completed.evaluation_id)
        if not evaluation.is_terminal and evaluation.run_count < completed.run_count:
            raise NotFound(
                f"evaluation {completed.evaluation_id!r} has {evaluation.run_count} of the "
                f"{completed.run_count} runs its completion reports"
            )


_COMPLETION_STATUS = {
    pool_pb2.EVALUATION_STATUS_COMPLETED: EvaluationRecordStatus.COMPLETED,
    pool_pb2.EVALUATION_STATUS_CANCELLED: EvaluationRecordStatus.CANCELLED,
}


def completion_status(status: pool_pb2.EvaluationStatus.ValueType) -> EvaluationRecordStatus:
    """The evaluation status an ``evaluation.completed`` event's pool status ends in."""
    try:
        return _COMPLETION_STATUS[status]
    except KeyError:
        raise InvalidArgument(
            "status", "must be EVALUATION_STATUS_COMPLETED or EVALUATION_STATUS_CANCELLED"
        ) from None


ACK_WAIT_SECONDS = 30.0
# Events handled at once by one replica, and in flight across all replicas of the durable.
IN_HAND = 64
MAX_ACK_PENDING = 256


async def consumer(
    bus: Bus,
    events: EvaluationEvents,
    durable: str,
    guard: Callable[[Handler], Handler] = lambda h: h,
) -> Consumer:
    """The feed's consumer, its handler wrapped by ``guard`` (the service's quarantine). A
    durable left strictly ordered (one in flight) by an earlier version is brought to
    :data:`MAX_ACK_PENDING`."""
    await contract.ensure_evaluation_stream(bus, update=False)
    return bus.consumer(
        STREAM,
        durable=durable,
        subject=contract.EVALUATION_ALL,
        handler=guard(events.handle_message),
        batch=IN_HAND,
        ack_wait=ACK_WAIT_SECONDS,
        max_ack_pending=MAX_ACK_PENDING,
    )
