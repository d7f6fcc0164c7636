"""Builds the recovery part of the reconciler process: streams, consumers, outbox relay,
the sweep parts and the ReconcilerService servicer."""

from __future__ import annotations

from dispo.auth.signing import configured_key
from dispo.libs import metrics
from dispo.libs.api.reconciler.v1 import reconciler_pb2_grpc
from dispo.libs.bus import Bus
from dispo.libs.catalogue import CatalogueSettings
from dispo.libs.catalogue.follow import CatalogueFollower, on_catalogue_changed
from dispo.libs.contracts import tasks
from dispo.libs.outputs import OutputsReader
from dispo.libs.retention import add_retention, outbox_records, quarantine_records
from dispo.libs.service import Runtime
from dispo.reconciler import retention
from dispo.reconciler.context import Context
from dispo.reconciler.executor_health import ExecutorHealth
from dispo.reconciler.http_client import http_client
from dispo.reconciler.intake import consumers
from dispo.reconciler.outbox import outbox
from dispo.reconciler.probes import WorkerProber
from dispo.reconciler.recovery import store
from dispo.reconciler.servicer import ReconcilerServicer
from dispo.reconciler.settings import ReconcilerSettings, load_config, with_catalogue
from dispo.reconciler.states import WORK_KIND_STATES
from dispo.reconciler.sweeps import sweep_parts

SERVICE_NAME = "dispo.reconciler.v1.ReconcilerService"


async def ensure_streams(bus: Bus) -> None:
    await tasks.ensure_task_streams(bus, "reconciler")
    await tasks.CALLBACKS.ensure(bus)


async def wire_recovery(rt: Runtime) -> Context:
    settings = ReconcilerSettings()
    config = load_config(settings)
    await ensure_streams(rt.bus)
    http = rt.close_on_stop(http_client(), name="http client")
    relay = rt.outbox_relay(outbox)
    executor = rt.channel(settings.executor_address)  # outputs and worker nodes' probes
    ctx = Context(
        rt.engine,
        await rt.database(),
        rt.clock,
        config,
        settings,
        http,
        relay,
        rt.bus,
        egress=rt.settings.egress,
        service_token=rt.settings.service_token,
        signing_key=configured_key(rt.settings.signing_key),
        outputs=OutputsReader(executor, settings.outputs_timeout_seconds),
        executor_health=ExecutorHealth(executor, settings.outputs_timeout_seconds),
        worker_probes=WorkerProber(executor, settings.http_timeout_seconds),
    )
    # The catalogue's newer versions, from the gateway (ADR-0111): the file is the start.
    catalogue_settings = CatalogueSettings()
    follower = CatalogueFollower(
        rt.channel(catalogue_settings.catalogue_gateway_address),
        lambda _, newer: setattr(ctx, "config", with_catalogue(ctx.config, newer)),
    )
    await on_catalogue_changed(rt.bus, follower.check)
    rt.add_periodic(
        "catalogue version check",
        follower.check,
        catalogue_settings.catalogue_check_interval_seconds,
    )
    rt.add_servicer(
        lambda server: reconciler_pb2_grpc.add_ReconcilerServiceServicer_to_server(
            ReconcilerServicer(ctx), server
        ),
        SERVICE_NAME,
    )
    for name, consumer in consumers(
        ctx,
        rt.bus,
        settings.durable,
        rt.quarantine.wrap,
        settings.ack_wait_seconds,
        settings.gather_seconds,
    ):
        rt.add_part(name, consumer.run, consumer.stop)
    rt.add_part("outbox relay", relay.run, relay.stop)
    rt.metrics.probe(lambda: backlog_samples(ctx))
    if settings.sweep_interval_seconds > 0:
        for sweep in sweep_parts(ctx, settings.sweep_interval_seconds).values():
            rt.add_part(sweep.name, sweep.run, sweep.stop)
    rt.add_part("callback deliveries", ctx.deliveries.run)  # stops after the notify sweep
    add_retention(
        rt,
        "reconciler",
        ctx.db,
        retention.businesses,
        retention.purge,
        retention.due,
        [outbox_records(outbox), quarantine_records()],
    )
    return ctx


async def backlog_samples(ctx: Context) -> list[metrics.Sample]:
    """Failed, parked and uncertain work held here: count and oldest age per kind."""
    async with ctx.db.connection() as conn:
        by_state = await store.tasks_backlog_by_state(conn)
    now = ctx.clock.now()
    samples = []
    for kind, states in WORK_KIND_STATES.items():
        held = [by_state[s] for s in states if s in by_state]
        oldest = min((at for _, at in held), default=None)
        samples.append(metrics.RECOVERY_BACKLOG.sample(sum(n for n, _ in held), kind.value))
        samples.append(metrics.RECOVERY_OLDEST.sample(metrics.age_seconds(now, oldest), kind.value))
    return samples
