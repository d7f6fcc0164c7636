"""The cron pool's evaluation events (stream ``EVALUATIONS``) into the evaluation feed.

Idempotent: a repeated ``started`` or ``completed`` is a no-op, a run_id already stored is
skipped. An event for an evaluation not registered yet is redelivered later; a malformed or
contradictory one is terminated with a logged reason. Events are applied strictly in
stream order (one in flight per durable consumer, whatever the number of replicas).
"""

from __future__ import annotations

from dispo.intelligence.convert import line_name, verdict_name
from dispo.intelligence.evaluations import (
    EvaluationStatus,
    new_evaluation,
    new_run_result,
)
from dispo.intelligence.feed import EvaluationFeed
from dispo.libs.api.pool.v1 import events_pb2, pool_pb2
from dispo.libs.bus import ACK, Bus, Consumer, Disposition, Nak, Term
from dispo.libs.contracts import evaluations as contract
from dispo.libs.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from dispo.libs.logging import get_logger
from dispo.libs.timestamps import from_timestamp
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import BadRequestError, NotFoundError

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
                await self.feed.complete(
                    completed.evaluation_id, completion_status(completed.status)
                )
            else:
                return Term(f"unknown subject {subject}")
        except NotFound as error:
            if deliveries >= self.max_unknown_deliveries:
                return Term(f"{error.message} after {deliveries} deliveries; giving up")
            log.info(
                "event for an unknown evaluation; retrying later",
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


_COMPLETION_STATUS = {
    pool_pb2.EVALUATION_STATUS_COMPLETED: EvaluationStatus.COMPLETED,
    pool_pb2.EVALUATION_STATUS_CANCELLED: EvaluationStatus.CANCELLED,
}


def completion_status(status: pool_pb2.EvaluationStatus.ValueType) -> EvaluationStatus:
    """The evaluation status an ``evaluation.completed`` event's pool status ends in."""
    try:
        return _COMPLETION_STATUS[status]
    except KeyError:
        raise InvalidArgument(
            "status", "must be EVALUATION_STATUS_COMPLETED or EVALUATION_STATUS_CANCELLED"
        ) from None


ACK_WAIT_SECONDS = 30.0


async def ensure_ordered_consumer(bus: Bus, durable: str) -> None:
    """Create the durable with ``max_ack_pending=1``: across every replica sharing it, one
    message is in flight at a time, so a completion never overtakes its runs."""
    try:
        info = await bus.js.consumer_info(STREAM, durable)
    except NotFoundError:
        config = ConsumerConfig(
            durable_name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            filter_subject=contract.EVALUATION_ALL,
            ack_wait=ACK_WAIT_SECONDS,
            max_ack_pending=1,
        )
        try:
            await bus.js.add_consumer(STREAM, config)
        except BadRequestError:
            info = await bus.js.consumer_info(STREAM, durable)  # another replica created it first
        else:
            return
    if info.config.max_ack_pending != 1:
        log.warning(
            "evaluation consumer is not strictly ordered",
            durable=durable,
            max_ack_pending=info.config.max_ack_pending,
        )


async def consumer(bus: Bus, events: EvaluationEvents, durable: str) -> Consumer:
    await contract.ensure_evaluation_stream(bus)
    await ensure_ordered_consumer(bus, durable)
    return bus.consumer(
        STREAM,
        durable=durable,
        subject=contract.EVALUATION_ALL,
        handler=events.handle_message,
        batch=1,
        ack_wait=ACK_WAIT_SECONDS,
    )
