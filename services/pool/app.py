"""The pool service process: PoolService, the outbox relay and the periodic sweeps."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dispo.libs import metrics
from dispo.libs.api.pool.v1 import pool_pb2_grpc
from dispo.libs.logging import get_logger
from dispo.libs.periodic import Pause
from dispo.libs.private_files import write_private
from dispo.libs.service import Runtime, run_service
from dispo.pool import store, sweeps
from dispo.pool.analysis_models import IntelligenceModels
from dispo.pool.driver_calls import DriverCalls
from dispo.pool.drivers import Driver
from dispo.pool.drivers.local import LocalDriver
from dispo.pool.drivers.openclaw import (
    PROVIDER,
    OpenClawCli,
    OpenClawDriver,
    provider_config,
    wake_command,
)
from dispo.pool.events import relay_options
from dispo.pool.openclaw import ensure_openclaw
from dispo.pool.operations import Pool
from dispo.pool.servicer import PoolServicer
from dispo.pool.settings import PoolSettings
from dispo.pool.worker.supervisor import WorkerSupervisor

log = get_logger(__name__)

MIGRATIONS = Path(__file__).parent / "migrations"
SERVICE_NAME = "dispo.pool.v1.PoolService"


def own_address(rt: Runtime) -> str:
    host = "127.0.0.1" if rt.server.host in ("", "0.0.0.0", "::") else rt.server.host
    return f"{host}:{rt.server.port}"


async def openclaw_driver(settings: PoolSettings, rt: Runtime) -> OpenClawDriver:
    if settings.openclaw_path:
        argv, env = [settings.openclaw_path], {"HOME": str(settings.openclaw_home)}
    else:  # the OpenClaw of the cache, installed now if missing (once, a few minutes, off
        # the event loop: the bus connection keeps answering its pings meanwhile)
        install = await asyncio.to_thread(
            ensure_openclaw, progress=lambda line: log.info("openclaw", progress=line)
        )
        argv, env = install.argv(), install.env(settings.openclaw_home)
    settings.openclaw_home.mkdir(parents=True, exist_ok=True)
    where = (
        ["--url", settings.openclaw_url]
        if settings.openclaw_url
        else ["--port", str(settings.openclaw_port)]
    )
    token = ["--token", settings.openclaw_token] if settings.openclaw_token else []
    cli = OpenClawCli(argv, [*where, *token], env, settings.openclaw_timeout_seconds)
    agent_model = provider = ""
    if settings.openclaw_payload == "agent":
        if not (settings.openclaw_model_base_url and settings.openclaw_model_name):
            raise ValueError(
                "DISPO_POOL_OPENCLAW_PAYLOAD=agent needs DISPO_POOL_OPENCLAW_MODEL_BASE_URL"
                " and DISPO_POOL_OPENCLAW_MODEL_NAME"
            )
        agent_model = f"{PROVIDER}/{settings.openclaw_model_name}"
        provider = provider_config(
            settings.openclaw_model_base_url,
            settings.openclaw_model_name,
            settings.openclaw_model_api_key,
        )
    # The automations' wake command calls the pool with the pool's own service token.
    token_file = None
    if rt.settings.service_token:
        token_file = settings.openclaw_home.parent / "wake.token"
        write_private(token_file, rt.settings.service_token)
    return OpenClawDriver(
        cli,
        namespace=settings.openclaw_namespace,
        tick_seconds=settings.tick_seconds,
        command=wake_command(settings.openclaw_wake_address or own_address(rt), token_file),
        agent_model=agent_model,
        agent_provider=provider,
    )


async def make_driver(settings: PoolSettings, rt: Runtime) -> Driver:
    if settings.driver == "openclaw":
        return await openclaw_driver(settings, rt)

    async def publish(subject: str, data: bytes) -> None:
        await rt.bus.nc.publish(subject, data)

    return LocalDriver(settings.local_registry, publish)


class StuckSweep:
    """The stuck sweep's passes, the first after the restart grace."""

    def __init__(self, pool: Pool, batch: int) -> None:
        self.pool = pool
        self.batch = batch
        self._graced = False

    async def __call__(self) -> None:
        if not self._graced:
            self._graced = True
            try:
                await sweeps.grace_after_restart(self.pool)
            except Exception as error:
                log.warning("restart grace failed", error=repr(error))
        await sweeps.stuck_sweep(self.pool, self.batch)


def add_sweeps(rt: Runtime, pool: Pool, settings: PoolSettings) -> None:
    """Every sweep a periodic part of its own, every ``sweep_seconds`` of the service's
    clock, so a slow pass of one holds up no other (as the reconciler's sweeps); their
    driver calls run beside them (``pool.driver_calls``). And the slot wake-ups, kicked by
    the pool when the next due slot may have moved."""
    every = settings.sweep_seconds
    rt.add_periodic("stuck sweep", StuckSweep(pool, settings.sweep_batch), every)
    rt.add_periodic("hold sweep", lambda: sweeps.hold_sweep(pool, settings.sweep_batch), every)
    rt.add_periodic("scale sweep", lambda: sweeps.scale_sweep(pool), every)
    wakeups = rt.add_periodic("slot wake-ups", SlotWakeups(pool, settings), every)
    pool.on_schedule_change = wakeups.kick


class SlotWakeups:
    """Wakes idle crons the moment a waiting evaluation's next slot falls due (the crons'
    tick is the fallback): each pass wakes as many idle crons as there are queue items and
    sleeps until the next due slot, at most ``sweep_seconds``. The pool kicks it when that
    time may have moved (``Pool.on_schedule_change``: an evaluation created, resumed or
    boosted, or let go by its cron until its next slot)."""

    def __init__(self, pool: Pool, settings: PoolSettings) -> None:
        self.pool = pool
        self.settings = settings

    async def __call__(self) -> Pause:
        try:
            await self.pool.wake_idle_crons()
        except Exception as error:  # the next pass tries again
            log.warning("slot wake-up failed", error=repr(error))
        return Pause(await self._until_next_slot())

    async def _until_next_slot(self) -> float:
        now = self.pool.clock.now()
        async with self.pool.db.connection() as conn:
            due = await store.evaluations_next_slot_at(conn, now)
        if due is None:
            return self.settings.sweep_seconds
        return max(0.001, min(self.settings.sweep_seconds, (due - now).total_seconds()))


async def pool_samples(pool: Pool) -> list[metrics.Sample]:
    """Crons by status, queue depth and the oldest wait (the pool's load, as GetPoolStatus
    reports it)."""
    load = await pool.load()
    crons = [metrics.POOL_CRONS.sample(n, status.value) for status, n in load.counts.items()]
    return [
        *crons,
        metrics.POOL_QUEUE_DEPTH.sample(load.queue_depth),
        metrics.POOL_OLDEST_WAIT.sample(load.oldest_wait_seconds),
    ]


async def setup(rt: Runtime) -> None:
    settings = PoolSettings()
    relay = rt.outbox_relay(store.outbox, **relay_options(rt.bus))
    driver = await make_driver(settings, rt)
    pool = Pool(
        await rt.database(),
        driver,
        rt.clock,
        settings.policy(),
        on_commit=relay.kick,
        egress=rt.settings.egress,
        analysis_models=IntelligenceModels(rt.channel(settings.intelligence_address)),
        driver_calls=rt.close_on_stop(
            DriverCalls(settings.driver_concurrency, settings.driver_call_seconds),
            name="driver calls",
        ),
    )
    if isinstance(driver, OpenClawDriver):  # a lost compare-and-set asks the database again
        driver.state_of = pool.cron_driver_state
    rt.add_servicer(
        lambda server: pool_pb2_grpc.add_PoolServiceServicer_to_server(PoolServicer(pool), server),
        SERVICE_NAME,
    )
    rt.add_part("outbox relay", relay.run, relay.stop)
    rt.metrics.probe(lambda: pool_samples(pool))
    add_sweeps(rt, pool, settings)
    if settings.driver == "local" and settings.spawn_worker:
        worker = WorkerSupervisor(
            {
                "DISPO_POOL_WORKER_POOL_ADDRESS": own_address(rt),
                "DISPO_POOL_WORKER_LOCAL_REGISTRY": str(settings.local_registry.resolve()),
                "DISPO_POOL_WORKER_TICK_SECONDS": str(settings.tick_seconds),
            }
        )
        rt.add_part("pool worker", worker.run, worker.stop)


def main() -> None:
    run_service("pool", setup, migrations=MIGRATIONS)
