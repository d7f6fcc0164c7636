"""The executor service process: consumers of task.create / task.cancel, the outbox relay,
downstream health checks, and the ExecutorService gRPC API."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiohttp
import httpx
from dispo.executor import control, deadlines, pausing
from dispo.executor.actions import http_session
from dispo.executor.breaker import BreakerState
from dispo.executor.envelope import envelope_problem
from dispo.executor.runner import Executor
from dispo.executor.servicer import ExecutorServicer, WorkerServicer
from dispo.executor.settings import ExecutorSettings
from dispo.executor.store import retention
from dispo.executor.store.status_events import outbox
from dispo.executor.worker_runs import CHECK_SECONDS
from dispo.libs import metrics
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.executor.v1 import executor_pb2_grpc, worker_pb2_grpc
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.bus import Disposition, Term
from dispo.libs.business_policy import load_configured_policy
from dispo.libs.catalogue import Catalogue, CatalogueSettings, load_configured_catalogue
from dispo.libs.catalogue.follow import CatalogueFollower, on_catalogue_changed
from dispo.libs.contracts import tasks
from dispo.libs.downstream_health import check_health
from dispo.libs.erasure import erase_request
from dispo.libs.logging import bind_ids, get_logger
from dispo.libs.outbox import OutboxRelay
from dispo.libs.retention import add_retention, outbox_records, quarantine_records
from dispo.libs.service import Runtime, run_service
from google.protobuf.message import DecodeError
from nats.aio.msg import Msg

log = get_logger(__name__)

MIGRATIONS = Path(__file__).parent / "migrations"
SERVICE_NAME = "dispo.executor.v1.ExecutorService"
WORKER_SERVICE_NAME = "dispo.executor.v1.WorkerService"
# Seconds a downstream health URL has to answer before it counts as unhealthy.
HEALTH_TIMEOUT_SECONDS = 2.0
# dispo_breaker_state's values.
BREAKER_VALUES = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}


async def build_executor(
    rt: Runtime,
    settings: ExecutorSettings,
    calls: aiohttp.ClientSession,
    health: httpx.AsyncClient,
) -> tuple[Executor, OutboxRelay]:
    catalogue_settings = CatalogueSettings()
    catalogue = load_configured_catalogue(catalogue_settings)
    relay = rt.outbox_relay(outbox)
    config = settings.config()
    db = await rt.database()
    limits = queue_limits(catalogue)
    policy = load_configured_policy()
    executor = Executor(
        db,
        relay,
        catalogue.downstreams,
        rt.clock,
        config,
        calls,
        health,
        limits,
        policy.weight,
        tuple(policy.businesses),
        call_timeouts(catalogue),
        queue_rates(catalogue),
    )
    # The catalogue's newer versions, from the gateway (ADR-0111): the file is the start.
    follower = CatalogueFollower(
        rt.channel(catalogue_settings.catalogue_gateway_address),
        lambda _, newer: executor.use_catalogue(
            newer.downstreams, queue_limits(newer), queue_rates(newer)
        ),
    )
    await on_catalogue_changed(rt.bus, follower.check)
    rt.add_periodic(
        "catalogue version check",
        follower.check,
        catalogue_settings.catalogue_check_interval_seconds,
    )
    return executor, relay


def queue_limits(catalogue: Catalogue) -> dict[str, int]:
    """The declared limits of the catalogue's queues (0: none, left out)."""
    return {q.name: q.max_concurrency for q in catalogue.queues.values() if q.max_concurrency}


def queue_rates(catalogue: Catalogue) -> dict[str, int]:
    """The declared runs a second of the catalogue's queues (0: none, left out)."""
    return {
        q.name: q.max_calls_per_second for q in catalogue.queues.values() if q.max_calls_per_second
    }


def call_timeouts(catalogue: Catalogue) -> dict[str, float]:
    """The longest call timeout of each downstream, in seconds (its own or an action's)."""
    longest = {n: d.timeout_ms / 1000 for n, d in catalogue.downstreams.items()}
    for cell in catalogue.cells.values():
        for action in cell.actions:
            if action.downstream in longest and action.timeout_ms:
                longest[action.downstream] = max(
                    longest[action.downstream], action.timeout_ms / 1000
                )
    return longest


async def setup(rt: Runtime) -> None:
    settings = ExecutorSettings()
    await tasks.ensure_task_streams(rt.bus)
    calls = rt.close_on_stop(http_session(settings.max_connections), name="action calls client")
    # Health checks use the shared probe (:mod:`dispo.libs.downstream_health`).
    health = rt.close_on_stop(httpx.AsyncClient(), name="health check client")
    executor, relay = await build_executor(rt, settings, calls, health)

    async def on_create(msg: Msg) -> Disposition:
        try:
            env = task_pb2.Task.FromString(msg.data)
        except DecodeError:
            return Term("malformed task envelope")
        bind_ids(task_id=env.task_id, business=env.business)
        problem = envelope_problem(env)
        if problem is not None:
            log.warning("task envelope refused", task_id=env.task_id, problem=problem)
            return Term(problem)
        return await executor.handle_create(env)

    async def on_cancel(msg: Msg) -> Disposition:
        try:
            request = task_pb2.CancelRequest.FromString(msg.data)
        except DecodeError:
            return Term("malformed cancel request")
        if not request.task_id:
            return Term("cancel without task_id")
        bind_ids(task_id=request.task_id)
        return await control.handle_cancel(executor, request.task_id)

    async def on_close(msg: Msg) -> Disposition:
        try:
            request = task_pb2.CloseRequest.FromString(msg.data)
        except DecodeError:
            return Term("malformed close request")
        if not request.task_id or request.status != common_pb2.TASK_STATUS_FAILED:
            return Term("close request needs task_id and status FAILED")
        bind_ids(task_id=request.task_id)
        return await control.handle_close(
            executor, request.task_id, request.reason, request.generation, request.version
        )

    async def on_signal(msg: Msg) -> Disposition:
        try:
            request = task_pb2.SignalRequest.FromString(msg.data)
        except DecodeError:
            return Term("malformed signal request")
        if not (request.task_id and request.signal and request.signal_id):
            return Term("signal request needs task_id, signal and signal_id")
        bind_ids(task_id=request.task_id)
        return await control.handle_signal(executor, request)

    async def on_erase(msg: Msg) -> Disposition:
        request = erase_request(msg.data)
        if isinstance(request, str):
            return Term(request)
        bind_ids(task_id=request.task_id)
        return await control.handle_erase(executor, request.task_id, rt.bus)

    creates = rt.consumer(
        tasks.TASKS.name,
        durable=settings.durable,
        subject=tasks.TASK_CREATE,
        handler=on_create,
        batch=settings.batch,
        ack_wait=settings.ack_wait_seconds,
        max_ack_pending=settings.max_ack_pending,
    )
    cancels = rt.consumer(
        tasks.TASKS.name,
        durable=f"{settings.durable}-cancel",
        subject=tasks.TASK_CANCEL,
        handler=on_cancel,
        ack_wait=settings.ack_wait_seconds,
    )
    closes = rt.consumer(
        tasks.TASKS.name,
        durable=f"{settings.durable}-close",
        subject=tasks.TASK_CLOSE,
        handler=on_close,
        ack_wait=settings.ack_wait_seconds,
    )
    signals = rt.consumer(
        tasks.TASKS.name,
        durable=f"{settings.durable}-signal",
        subject=tasks.TASK_SIGNAL,
        handler=on_signal,
        ack_wait=settings.ack_wait_seconds,
    )
    erases = rt.consumer(
        tasks.TASKS.name,
        durable=f"{settings.durable}-erase",
        subject=tasks.TASK_ERASE,
        handler=on_erase,
        ack_wait=settings.ack_wait_seconds,
    )
    rt.metrics.probe(lambda: downstream_samples(executor))
    rt.add_servicer(
        lambda server: executor_pb2_grpc.add_ExecutorServiceServicer_to_server(
            ExecutorServicer(executor), server
        ),
        SERVICE_NAME,
    )
    rt.add_servicer(
        lambda server: worker_pb2_grpc.add_WorkerServiceServicer_to_server(
            WorkerServicer(executor.worker_runs), server
        ),
        WORKER_SERVICE_NAME,
    )
    # The outcomes of the worker runs this process waits for that ended elsewhere or timed
    # out (nothing to read while it waits for none).
    rt.add_periodic("worker run outcomes", executor.worker_runs.check, CHECK_SECONDS)
    # Tasks past their deadline that no pass holds, closed (ADR-0103).
    rt.add_periodic(
        "deadlines",
        lambda: deadlines.close_past_deadline(executor),
        settings.deadline_sweep_seconds,
    )

    def stop_creates() -> None:
        executor.intake.close()  # what waits for a pass goes back to the stream
        creates.stop()

    rt.add_part(f"{tasks.TASK_CREATE} consumer", creates.run, stop_creates)
    rt.add_part(f"{tasks.TASK_CANCEL} consumer", cancels.run, cancels.stop)
    rt.add_part(f"{tasks.TASK_CLOSE} consumer", closes.run, closes.stop)
    rt.add_part(f"{tasks.TASK_SIGNAL} consumer", signals.run, signals.stop)
    rt.add_part(f"{tasks.TASK_ERASE} consumer", erases.run, erases.stop)
    rt.add_periodic(
        "wait timeouts", lambda: control.sweep_timeouts(executor), settings.wait_sweep_seconds
    )
    # The paused businesses, read by every executor (ADR-0109).
    rt.add_periodic(
        "business pauses", lambda: pausing.read_pauses(executor), settings.pause_poll_seconds
    )
    rt.add_part("outbox relay", relay.run, relay.stop)
    add_retention(
        rt,
        "executor",
        executor.db,
        retention.tasks_businesses_finished,
        retention.tasks_delete_if_finished_many,
        retention.tasks_due,
        [outbox_records(outbox), quarantine_records()],
    )
    shares = executor.shares
    if shares is not None:  # renewed every third of a lease, sooner when short (ADR-0108)
        shares.kick = rt.add_periodic("downstream shares", shares.renew, shares.lease / 3).kick
        rt.close_on_stop(shares.drop, name="downstream shares")
    if settings.demo_downstream:
        rt.add_part("demo downstream", lambda: serve_demo(settings.demo_downstream))
    if settings.health_interval_seconds > 0:
        rt.add_periodic(
            "downstream health",
            lambda: check_downstreams(executor),
            settings.health_interval_seconds,
            first_after_interval=True,
        )


async def check_downstreams(ex: Executor) -> None:
    """Trip a downstream's breaker when its health URL fails; once it passes again the
    breaker half-opens and its trial calls decide whether calls flow again."""
    for name, downstream in ex.registry.items():
        if not downstream.health_url:
            continue
        healthy, why = await check_health(ex.health, downstream.health_url, HEALTH_TIMEOUT_SECONDS)
        if healthy:
            ex.breakers[name].health_ok()
        else:
            log.warning("downstream unhealthy", downstream=name, reason=why)
            ex.breakers[name].trip(ex.clock.now())


async def downstream_samples(ex: Executor) -> list[metrics.Sample]:
    """The state of every downstream's breaker and call slots in this executor (read at
    scrape time)."""
    now = ex.clock.now()
    return (
        [
            metrics.BREAKER_STATE.sample(BREAKER_VALUES[breaker.state_at(now)], name)
            for name, breaker in ex.breakers.items()
        ]
        + [
            sample
            for name, slots in ex.slots.items()
            for sample in (
                metrics.DOWNSTREAM_CALLS.sample(slots.held, name),
                metrics.DOWNSTREAM_WAITING.sample(slots.waiting, name),
                metrics.DOWNSTREAM_SLOTS_SHARE.sample(slots.bound, name),
            )
        ]
        + [
            sample
            for name, pace in ex.paces.items()
            for sample in (
                metrics.DOWNSTREAM_PACE_SHARE.sample(pace.bound, name),
                metrics.DOWNSTREAM_PACE_WAITING.sample(pace.waiting, name),
            )
        ]
    )


async def serve_demo(address: str) -> None:
    from aiohttp import web
    from dispo.executor.demo_downstream.app import build_app

    host, _, port = address.rpartition(":")
    runner = web.AppRunner(build_app())
    await runner.setup()
    await web.TCPSite(runner, host or "127.0.0.1", int(port)).start()
    try:
        await asyncio.Event().wait()
    finally:
        with contextlib.suppress(Exception):
            await runner.cleanup()


def main() -> None:
    run_service("executor", setup, migrations=MIGRATIONS)
