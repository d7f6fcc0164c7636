"""The cron pool's evaluation events (stream ``EVALUATIONS``) into the campaign feed.

Idempotent: a repeated ``started`` or ``completed`` is a no-op, a run_id already stored is
skipped. An event for a campaign not registered yet is redelivered later; a malformed or
contradictory one is terminated with a logged reason.
"""

from __future__ import annotations

from nats.aio.msg import Msg

from dispo.intelligence.campaigns import completion_status, new_campaign, new_run_result
from dispo.intelligence.convert import from_timestamp
from dispo.intelligence.feed import CampaignFeed
from dispo.libs.api.pool.v1 import events_pb2
from dispo.libs.bus import ACK, Bus, Consumer, Disposition, Nak, Term
from dispo.libs.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from dispo.libs.logging import get_logger

log = get_logger(__name__)

STREAM = "EVALUATIONS"
SUBJECTS = ["evaluation.>"]
STARTED, RUN_RECORDED, COMPLETED = "evaluation.started", "evaluation.run_recorded", "evaluation.completed"


class EvaluationEvents:
    def __init__(self, feed: CampaignFeed, retry_delay: float = 2.0) -> None:
        self.feed = feed
        self.retry_delay = retry_delay

    async def handle_message(self, message: Msg) -> Disposition:
        return await self.handle(message.subject, message.data)

    async def handle(self, subject: str, data: bytes) -> Disposition:
        try:
            if subject == STARTED:
                started = events_pb2.EvaluationStarted.FromString(data)
                campaign = new_campaign(started.evaluation_id, started.series, started.line, started.period,
                                        started.configuration_json, started.analysis_model)
                await self.feed.create(campaign)
            elif subject == RUN_RECORDED:
                run = events_pb2.EvaluationRunRecorded.FromString(data)
                result = new_run_result(run.run_id, run.case_id, run.verdict, run.score, run.latency_ms,
                                        run.failure_reason, from_timestamp(run.recorded_at, run.HasField("recorded_at")))
                await self.feed.record_runs(run.evaluation_id, [result])
            elif subject == COMPLETED:
                completed = events_pb2.EvaluationCompleted.FromString(data)
                await self.feed.complete(completed.evaluation_id, completion_status(completed.status))
            else:
                return Term(f"unknown subject {subject}")
        except NotFound as error:
            log.info("event for an unknown campaign; retrying later", subject=subject, error=error.message)
            return Nak(self.retry_delay)
        except (InvalidArgument, AlreadyExists, FailedPrecondition) as error:
            return Term(f"{type(error).__name__}: {error.message}")
        except Exception as error:  # noqa: BLE001 - protobuf DecodeError and the like
            if type(error).__name__ == "DecodeError":
                return Term(f"malformed {subject}: {error}")
            raise
        return ACK


async def consumer(bus: Bus, events: EvaluationEvents, durable: str) -> Consumer:
    await bus.ensure_stream(STREAM, SUBJECTS)
    # One message at a time, in stream order: a completion must not overtake its runs.
    return bus.consumer(STREAM, durable=durable, subject="evaluation.>", handler=events.handle_message, batch=1)
