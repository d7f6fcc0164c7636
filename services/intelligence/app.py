"""The intelligence service process: wiring, and the declared shutdown order.

Parts stop upstream first, so nothing stopped can spawn new work into something still
running: the sweeps (scheduler) -> the evaluation feed consumer (evaluation runtime) -> the
intelligence jobs (running jobs finish within a grace period, the rest are handed back to
the queue) -> the analysis models (HTTP clients). The first two are parts; the last two are
resources the runtime closes once every part has stopped (``Runtime.close_on_stop``). The
gRPC server drains before all of them (``dispo.libs.service``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dispo.intelligence import store
from dispo.intelligence.analysis_models import ModelRegistry
from dispo.intelligence.events import EvaluationEvents, consumer
from dispo.intelligence.feed import EvaluationFeed
from dispo.intelligence.job_settlement import JobDeps
from dispo.intelligence.runtime import IntelligenceJobs
from dispo.intelligence.servicer import IntelligenceServicer
from dispo.intelligence.settings import IntelligenceSettings
from dispo.libs import metrics
from dispo.libs.api.intelligence.v1 import intelligence_pb2_grpc
from dispo.libs.clock import Clock
from dispo.libs.db.driver import Database
from dispo.libs.logging import get_logger
from dispo.libs.service import Runtime, run_service

log = get_logger(__name__)

MIGRATIONS = Path(__file__).parent / "migrations"
SERVICE_NAME = "dispo.intelligence.v1.IntelligenceService"
SHUTDOWN_ORDER = ("sweeps", "evaluation feed", "intelligence jobs", "analysis models")


@dataclass
class Intelligence:
    """The service's objects, built once; also what in-process tests use."""

    settings: IntelligenceSettings
    db: Database  # what the store runs on (dispo.intelligence.store)
    models: ModelRegistry
    jobs: IntelligenceJobs
    feed: EvaluationFeed
    events: EvaluationEvents
    servicer: IntelligenceServicer


def build(
    db: Database,
    clock: Clock,
    settings: IntelligenceSettings | None = None,
    models: ModelRegistry | None = None,
) -> Intelligence:
    settings = settings or IntelligenceSettings()
    models = models or ModelRegistry.from_configs(settings.models, settings.default_analysis_model)
    policy = settings.recovery_policy()
    deps = JobDeps(db, models, clock, settings.retry_policy(), policy.heartbeat.total_seconds())
    jobs = IntelligenceJobs(deps, policy=policy)
    feed = EvaluationFeed(db, models, clock, jobs)
    events = EvaluationEvents(
        feed, settings.unknown_evaluation_retry_seconds, settings.unknown_evaluation_max_deliveries
    )
    return Intelligence(
        settings, db, models, jobs, feed, events, IntelligenceServicer(feed, jobs, db)
    )


async def job_samples(db: Database) -> list[metrics.Sample]:
    """The jobs not completed, by kind and status."""
    async with db.connection() as conn:
        counts = await store.job_counts_unfinished(conn)
    return [metrics.INTELLIGENCE_JOBS.sample(n, kind, status) for kind, status, n in counts]


async def setup(rt: Runtime) -> None:
    app = build(await rt.database(), rt.clock)
    rt.add_servicer(
        lambda server: intelligence_pb2_grpc.add_IntelligenceServiceServicer_to_server(
            app.servicer, server
        ),
        SERVICE_NAME,
    )

    rt.metrics.probe(lambda: job_samples(app.db))
    report = await app.jobs.recover()
    log.info("restart recovery", requeued=len(report.requeued), failed=len(report.failed))
    await app.jobs.sweep_lost_triggers()

    # In SHUTDOWN_ORDER: two parts, stopped in the order added, then two resources, closed
    # by the runtime after every part has stopped, in the order registered.
    rt.add_periodic(
        "sweeps",
        app.jobs.sweep_once,
        app.settings.sweep_interval_seconds,
        first_after_interval=True,
    )
    if app.settings.consume_events:
        feed_consumer = await consumer(
            rt.bus, app.events, app.settings.event_durable, rt.quarantine.wrap
        )
        rt.add_part("evaluation feed", feed_consumer.run, feed_consumer.stop)
    rt.close_on_stop(
        lambda: app.jobs.close(app.settings.jobs_shutdown_grace_seconds), name="intelligence jobs"
    )
    rt.close_on_stop(app.models, name="analysis models")


def main() -> None:
    run_service("intelligence", setup, migrations=MIGRATIONS)
