"""The gateway service process: GatewayService, the outbox relay publishing task.create /
task.cancel, and the consumer of the executor's status events (task.status.>)."""

from __future__ import annotations

import uuid
from pathlib import Path

from dispo.auth import servicer as tokens
from dispo.auth.bootstrap import MIGRATIONS as AUTH_MIGRATIONS
from dispo.auth.bootstrap import SCHEMA as AUTH_SCHEMA
from dispo.auth.bootstrap import apply_bootstrap
from dispo.auth.signing import configured_key
from dispo.gateway import store
from dispo.gateway.bulk import store as bulk_store
from dispo.gateway.bulk.operations import BulkCancels
from dispo.gateway.catalogue import servicer as catalogues
from dispo.gateway.catalogue.operations import CatalogueBook
from dispo.gateway.operations import Gateway
from dispo.gateway.outputs import ViewOutputs
from dispo.gateway.schedules import servicer as schedules
from dispo.gateway.schedules.operations import Schedules
from dispo.gateway.seals import ReconcilerSeals
from dispo.gateway.servicer import GatewayServicer, bulk_filter
from dispo.gateway.settings import GatewaySettings
from dispo.gateway.shares import SubmitShares
from dispo.gateway.snapshots import snapshot_problem
from dispo.libs.api.gateway.v1 import gateway_pb2_grpc
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.bus import ACK, Disposition, Term
from dispo.libs.catalogue import Catalogue, CatalogueSettings, configured_document
from dispo.libs.catalogue.follow import announce_catalogue, on_catalogue_changed
from dispo.libs.contracts import tasks
from dispo.libs.db import migrate
from dispo.libs.logging import bind_ids
from dispo.libs.outputs import OutputsReader
from dispo.libs.retention import (
    BULK_ACTIONS_RULE,
    add_retention,
    business_records,
    outbox_records,
    quarantine_records,
)
from dispo.libs.service import Runtime, run_service
from google.protobuf.message import DecodeError
from nats.aio.msg import Msg

MIGRATIONS = Path(__file__).parent / "migrations"
SERVICE_NAME = "dispo.gateway.v1.GatewayService"


async def setup(rt: Runtime) -> None:
    settings = GatewaySettings()
    signing_key = configured_key(rt.settings.signing_key)  # a malformed key stops the start
    # The token store: every service reads it, the gateway alone writes it (ADR-0040).
    await migrate(rt.engine, AUTH_SCHEMA, AUTH_MIGRATIONS)
    db = await rt.database()
    if settings.auth_bootstrap_file:
        await apply_bootstrap(db, Path(settings.auth_bootstrap_file), rt.clock)
    await tasks.ensure_task_streams(rt.bus, "gateway")
    limits = settings.limits()
    relay = rt.outbox_relay(store.outbox)
    gateway = Gateway(
        db,
        relay,
        Catalogue(),
        limits,
        rt.clock,
        settings.watch_poll_interval_seconds,
        submit_batch=settings.submit_batch,
        submit_flushes=settings.submit_flushes,
        status_batch=settings.status_batch,
        egress=rt.settings.egress,
        max_delay_seconds=settings.max_delay_seconds,
        seals=ReconcilerSeals(
            rt.channel(settings.reconciler_address), settings.seal_timeout_seconds
        ),
    )

    # The catalogue's versions (ADR-0111): the file seeds an empty catalogue; from then on
    # every replica follows the newest version, checked every few seconds.
    book = CatalogueBook(
        db,
        rt.clock,
        lambda row, catalogue: gateway.use_catalogue(catalogue, row.version, row.retired),
        lambda version: announce_catalogue(rt.bus, version),
    )
    catalogue_settings = CatalogueSettings()
    await book.seed(configured_document(catalogue_settings))
    await on_catalogue_changed(rt.bus, book.refresh)
    rt.add_periodic(
        "catalogue version check",
        book.refresh,
        catalogue_settings.catalogue_check_interval_seconds,
    )
    catalogue_servicer = catalogues.CatalogueServicer(book, gateway, settings.max_page_size)
    rt.add_servicer(
        lambda server: catalogues.add_to_server(catalogue_servicer, server),
        catalogues.SERVICE_NAME,
    )

    async def on_status(msg: Msg) -> Disposition:
        try:
            env = task_pb2.Task.FromString(msg.data)
        except DecodeError:
            return Term("malformed status event")
        problem = snapshot_problem(env, limits)
        if problem is not None:
            return Term(f"status event refused: {problem}")
        bind_ids(task_id=env.task_id, business=env.business)
        await gateway.apply_status(env, msg.data)
        return ACK

    statuses = rt.consumer(
        tasks.TASK_STATUS.name,
        durable=settings.status_durable,
        subject=tasks.TASK_STATUS_ALL,
        handler=on_status,
        batch=settings.status_batch,
        ack_wait=settings.status_ack_wait_seconds,
    )
    # The outputs of GetTask's and WatchTask's views: the executor's record (ADR-0093).
    outputs = ViewOutputs(
        OutputsReader(rt.channel(settings.executor_address), settings.outputs_timeout_seconds)
    )
    # Bulk actions (ADR-0112): every replica runs the pass; the action's row lock shares them.
    bulk = BulkCancels(
        gateway,
        bulk_filter(limits.max_key_length),
        batch=settings.bulk_batch,
        max_rate=settings.bulk_max_rate,
    )
    rt.add_periodic("bulk actions", bulk.run_once, settings.bulk_interval_seconds)
    # The shares of the businesses' Submit rate this gateway holds (ADR-0108).
    shares = SubmitShares(
        db,
        rt.clock,
        f"gateway-{uuid.uuid4().hex[:12]}",
        settings.submit_rate_per_second,
        settings.submit_burst,
        settings.share_lease_seconds,
    )
    caller_limits = settings.caller_limits(rt.clock, shares)
    if caller_limits.shares is not None:
        rt.add_periodic("submit shares", shares.renew, shares.lease / 3, first_after_interval=True)
        rt.close_on_stop(shares.drop, name="submit shares")
    rt.add_servicer(
        lambda server: gateway_pb2_grpc.add_GatewayServiceServicer_to_server(
            GatewayServicer(
                gateway,
                settings.max_page_size,
                caller_limits,
                rt.bus,
                settings.events_read_timeout_seconds,
                outputs,
                bulk,
            ),
            server,
        ),
        SERVICE_NAME,
    )
    token_servicer = tokens.TokenServicer(db, rt.clock, rt.verifier, signing_key)
    rt.add_servicer(
        lambda server: tokens.add_to_server(token_servicer, server), tokens.SERVICE_NAME
    )
    # Schedules (ADR-0104): every replica runs the firing pass; the row locks share the work.
    firings = Schedules(gateway, batch=settings.schedule_batch)
    schedule_servicer = schedules.ScheduleServicer(firings, settings.max_page_size)
    rt.add_servicer(
        lambda server: schedules.add_to_server(schedule_servicer, server), schedules.SERVICE_NAME
    )
    rt.add_periodic("schedule firings", firings.fire_due, settings.schedule_interval_seconds)
    rt.add_part("outbox relay", relay.run, relay.stop)
    rt.add_part("status consumer", statuses.run, statuses.stop)
    add_retention(
        rt,
        "gateway",
        db,
        store.tasks_businesses_finished,
        store.tasks_delete_if_finished_many,
        store.tasks_due,
        [
            business_records(
                "bulk_actions",
                BULK_ACTIONS_RULE,
                bulk_store.bulk_actions_businesses,
                bulk_store.bulk_actions_delete_if_done_many,
                bulk_store.bulk_actions_due,
            ),
            outbox_records(store.outbox),
            quarantine_records(),
        ],
    )


def main() -> None:
    run_service("gateway", setup, migrations=MIGRATIONS)
