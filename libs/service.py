"""The process runner every service's ``__main__`` uses.

    async def setup(rt: Runtime) -> None:
        relay = rt.outbox_relay(store.outbox)         # publishes, and prunes rows long sent
        rt.add_servicer(lambda s: add_GatewayServiceServicer_to_server(Servicer(rt), s),
                        "dispo.gateway.v1.GatewayService")
        rt.add_part("outbox relay", relay.run, relay.stop)
        rt.add_periodic("sweeps", sweep_once, settings.sweep_interval_seconds)
        http = rt.close_on_stop(httpx.AsyncClient())   # closed after every part stopped

    def main() -> None:
        run_service("gateway", setup, migrations=Path(__file__).parent / "migrations")

Start-up: logging → PostgreSQL (waits until reachable) → migrations → NATS → the service's
:class:`~dispo.libs.db.driver.Database` (``rt.db``, one per process) → ``setup`` →
gRPC server → parts → health SERVING. Shutdown (SIGTERM / SIGINT): health NOT_SERVING →
server drains in-flight calls → parts stopped in the order they were added → resources
closed in the order they were registered → NATS → DB.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from dispo.libs import metrics, quarantine
from dispo.libs.auth import Authorizer, open_channel
from dispo.libs.auth.verifier import TokenVerifier
from dispo.libs.bus import Bus, BusCredentialsRefused, Consumer, Handler, inbox_prefix
from dispo.libs.clock import Clock, clock_from_spec
from dispo.libs.db import create_engine, login_refused, migrate
from dispo.libs.db.driver import Database
from dispo.libs.eventloop import loop_factory
from dispo.libs.grpcserver import create_server
from dispo.libs.logging import configure_logging, get_logger
from dispo.libs.metrics import Metrics, Sample
from dispo.libs.outbox import OutboxRelay, outbox_backlog
from dispo.libs.periodic import Periodic
from dispo.libs.ratelimit import TokenBuckets
from dispo.libs.settings import CommonSettings, ServerSettings, TLSSettings, server_settings
from dispo.libs.tracing import configure_tracing
from sqlalchemy import Table, text
from sqlalchemy.ext.asyncio import AsyncEngine

log = get_logger(__name__)
T = TypeVar("T")
# Connections of a service's Database at most (:attr:`Runtime.db`).
DATABASE_POOL = 20
Close = Callable[[], Awaitable[None] | None]


@dataclass
class Part:
    """A long-running piece of a service (consumer, relay, sweep loop)."""

    name: str
    run: Callable[[], Awaitable[None]]
    stop: Callable[[], Awaitable[None] | None] | None = None
    task: asyncio.Task[None] | None = None


@dataclass
class Runtime:
    """What a service's ``setup`` gets: settings, database, bus, clock, and places to plug in."""

    name: str
    settings: CommonSettings
    server: ServerSettings
    engine: AsyncEngine
    # The driver port on the service's schema (:mod:`dispo.libs.db.driver`): what its store,
    # its outbox relay, its quarantine and its token checks run their statements on.
    db: Database
    bus: Bus
    clock: Clock
    # Checks the tokens of the calls this service serves (its cache is the one TokenService
    # clears on a revoke).
    verifier: TokenVerifier
    registrations: list[Callable[[grpc.aio.Server], None]] = field(default_factory=list)
    service_names: list[str] = field(default_factory=list)
    parts: list[Part] = field(default_factory=list)
    closers: list[tuple[str, Close]] = field(default_factory=list)
    _quarantine: quarantine.Quarantine | None = None
    _outbox_table: Table | None = None
    # The service's metrics: its families, and the probes read when Prometheus scrapes.
    metrics: Metrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = Metrics(self.name, self.settings.metrics_cache_seconds)

    def add_servicer(self, register: Callable[[grpc.aio.Server], None], service_name: str) -> None:
        self.registrations.append(register)
        self.service_names.append(service_name)

    async def database(self) -> Database:
        """The driver port on the service's schema (:attr:`db`), for the statements of its
        store: opened before ``setup``, closed when the service stops, after every part and
        every resource."""
        return self.db

    def channel(self, address: str) -> grpc.aio.Channel:
        """A channel to another service, its calls carrying this service's token
        (``DISPO_SERVICE_TOKEN``); closed when the service stops."""
        return self.close_on_stop(
            open_channel(address, self.settings.service_token), name=f"channel to {address}"
        )

    def add_part(
        self,
        name: str,
        run: Callable[[], Awaitable[None]],
        stop: Callable[[], Awaitable[None] | None] | None = None,
    ) -> None:
        """Run ``run()`` for the life of the service. Parts stop in the order they were added,
        each by its ``stop`` (then awaited to finish) or, without one, by cancellation."""
        self.parts.append(Part(name, run, stop))

    def add_periodic(
        self,
        name: str,
        action: Callable[[], Awaitable[Any]],
        interval: float,
        *,
        first_after_interval: bool = False,
    ) -> Periodic:
        """Run ``action`` every ``interval`` seconds of the service's clock, as a part
        (see :class:`dispo.libs.periodic.Periodic`)."""
        periodic = Periodic(
            name, action, interval, self.clock, first_after_interval=first_after_interval
        )
        self.add_part(name, periodic.run, periodic.stop)
        return periodic

    def close_on_stop(self, resource: T, *, name: str | None = None) -> T:
        """Close ``resource`` when the service stops, after every part has stopped; resources
        close in the order they were registered. ``resource`` has ``aclose()`` or ``close()``
        (awaited when it returns an awaitable) or is itself the callable that closes.
        Returns ``resource``."""
        close = getattr(resource, "aclose", None) or getattr(resource, "close", None)
        if close is None:
            if not callable(resource):
                raise TypeError(f"cannot close {resource!r}: no aclose() or close()")
            close = resource
        self.closers.append((name or type(resource).__name__, close))
        return resource

    @property
    def quarantine(self) -> quarantine.Quarantine:
        """The service's quarantine (the ``quarantine`` table of its schema); the first use
        adds ``dispo.quarantine.v1.QuarantineService`` to the service's gRPC server."""
        if self._quarantine is None:
            self._quarantine = quarantine.Quarantine(
                self.db,
                self.bus,
                self.clock,
                quarantine.RetryBound(
                    max_failures=self.settings.consumer_max_failures,
                    base_seconds=self.settings.consumer_retry_base_seconds,
                    max_seconds=self.settings.consumer_retry_max_seconds,
                ),
                self.name,
            )
            servicer = self._quarantine.servicer
            if self._outbox_table is not None:
                servicer.outbox = (self.db, self._outbox_table)
            self.metrics.probe(self._quarantine_size)
            self.add_servicer(
                lambda server: quarantine.add_to_server(servicer, server), quarantine.SERVICE_NAME
            )
        return self._quarantine

    def consumer(
        self,
        stream: str,
        *,
        durable: str,
        subject: str | Sequence[str],
        handler: Handler,
        **options: Any,
    ) -> Consumer:
        """A durable consumer whose handler is guarded by the service's quarantine: a message
        that keeps failing, or that the handler refuses, is quarantined and terminated
        (:mod:`dispo.libs.quarantine.guard`). ``options`` are :meth:`Bus.consumer`'s."""
        return self.bus.consumer(
            stream,
            durable=durable,
            subject=subject,
            handler=self.quarantine.wrap(handler),
            **options,
        )

    def outbox_relay(self, table: Table, **options: Any) -> OutboxRelay:
        """The shared outbox relay for ``table`` on this service's database, bus and clock,
        deleting the rows it sent (ADR-0062) and quarantining a row after
        ``DISPO_OUTBOX_MAX_ATTEMPTS`` failed publications. ``options`` are the relay's
        (``ordered``, ``prepare``, ``batch``...). Add it as a part where its stop order fits."""
        relay = OutboxRelay(
            self.db,
            table,
            self.bus,
            clock=self.clock,
            max_attempts=self.settings.outbox_max_attempts,
            **options,
        )
        self.metrics.probe(lambda: self._outbox_samples(table))
        # Its set-aside rows are listed, replayed and discarded beside the quarantine's
        # messages (QuarantineService), where the service has a quarantine.
        self._outbox_table = table
        if self._quarantine is not None:
            self._quarantine.servicer.outbox = (self.db, table)
        return relay

    async def _quarantine_size(self) -> list[Sample]:
        assert self._quarantine is not None
        return [metrics.QUARANTINED.sample(await self._quarantine.store.size())]

    async def _outbox_samples(self, table: Table) -> list[Sample]:
        async with self.db.connection() as conn:
            backlog = await outbox_backlog(conn, table)
        age = metrics.age_seconds(self.clock.now(), backlog.oldest_unsent)
        return [
            metrics.OUTBOX_UNSENT.sample(backlog.unsent, table.name),
            metrics.OUTBOX_OLDEST.sample(age, table.name),
            metrics.OUTBOX_QUARANTINED.sample(backlog.quarantined, table.name),
        ]


async def _consumer_samples(consumers: Sequence[Consumer]) -> list[Sample]:
    """The backlog of each of the service's durable consumers (one API call each)."""
    backlogs = await asyncio.gather(*(c.backlog() for c in consumers))
    return [
        sample
        for consumer, backlog in zip(consumers, backlogs, strict=True)
        for sample in (
            metrics.CONSUMER_PENDING.sample(backlog.pending, consumer.durable),
            metrics.CONSUMER_ACK_PENDING.sample(backlog.ack_pending, consumer.durable),
            metrics.CONSUMER_REDELIVERED.sample(backlog.redelivered, consumer.durable),
        )
    ]


async def until_reachable(
    what: str,
    connect: Callable[[], Awaitable[T]],
    *,
    attempts: int = 120,
    delay: float = 0.5,
    final: Callable[[BaseException], bool] = lambda error: False,
) -> T:
    """``connect()`` until it succeeds (PostgreSQL or NATS may start after the service);
    an error ``final`` says waiting cannot cure (a refused login) is raised at once."""
    for attempt in range(attempts):
        try:
            return await connect()
        except Exception as error:
            if attempt == attempts - 1 or final(error):
                raise
            log.info(f"waiting for {what}", error=repr(error))
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


async def _ping(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        await conn.execute(text("SELECT 1"))


async def serve(
    name: str,
    setup: Callable[[Runtime], Awaitable[None]],
    *,
    migrations: Path | None,
    stop: asyncio.Event,
    settings: CommonSettings | None = None,
    server: ServerSettings | None = None,
) -> list[str]:
    """Run service ``name`` until ``stop`` is set. Usable in-process from tests.

    Returns the names of parts that crashed (a crashed part stops the whole service)."""
    settings = settings or CommonSettings()
    server = server or server_settings(name)
    tls = TLSSettings().server  # a wrong configuration stops the service before it connects
    if tls is not None:
        tls.credentials()  # its files are readable
    engine = create_engine(server.database_url or settings.database_url, name)
    await until_reachable("database", lambda: _ping(engine), final=login_refused)
    if migrations is not None:
        await migrate(engine, name, migrations)
    bus = await until_reachable(
        "nats",
        lambda: Bus.connect(
            settings.nats_servers,
            name=f"dispo-{name}",
            credentials=settings.nats_credentials,
            inbox=inbox_prefix(name),
            replicas=settings.stream_replicas,
        ),
        final=lambda error: isinstance(error, BusCredentialsRefused),
    )
    url = server.database_url or settings.database_url
    db = await Database.open(url, name, size=DATABASE_POOL)  # connects at its first statement
    crashed: list[str] = []
    clock = clock_from_spec(settings.clock)
    rt = Runtime(
        name,
        settings,
        server,
        engine,
        db,
        bus,
        clock,
        TokenVerifier(
            db,
            clock,
            settings.auth_cache_seconds,
            refused_seconds=settings.auth_refused_cache_seconds,
            failures=TokenBuckets(
                settings.auth_failures_per_second, settings.auth_failure_burst, clock
            ),
        ),
    )
    rt.metrics.probe(lambda: _consumer_samples(bus.consumers))
    try:
        await setup(rt)
        grpc_server = create_server(
            server.address,
            rt.registrations,
            rt.service_names,
            Authorizer(rt.verifier),
            tls,
        )
        await grpc_server.start()
        if server.metrics_port:
            port = rt.metrics.start(server.host, server.metrics_port)
            log.info("metrics served", address=f"http://{server.host}:{port}/metrics")
        for part in rt.parts:
            part.task = asyncio.create_task(_run_part(part, stop, crashed), name=part.name)
        await grpc_server.set_serving(True)
        log.info(
            "serving",
            address=f"{server.host}:{grpc_server.port}",
            services=rt.service_names,
            tls="mtls" if tls and tls.client_auth else "tls" if tls else "plaintext",
        )
        await stop.wait()
        log.info("stopping")
        await grpc_server.stop(server.shutdown_grace_seconds)
        for part in rt.parts:
            await _stop_part(part)
    finally:
        rt.metrics.stop()
        await close_all(rt.closers)
        await bus.close()
        await db.close()
        await engine.dispose()
    log.info("stopped", crashed=crashed)
    return crashed


async def _run_part(part: Part, stop: asyncio.Event, crashed: list[str]) -> None:
    try:
        await part.run()
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("part crashed; stopping the service so it is restarted", part=part.name)
        crashed.append(part.name)
        stop.set()


async def _stop_part(part: Part) -> None:
    if part.task is None:
        return
    if part.stop is not None:
        result = part.stop()
        if asyncio.iscoroutine(result):
            await result
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(part.task), 10)
    if not part.task.done():
        part.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await part.task
    log.info("part stopped", part=part.name)


async def close_all(closers: list[tuple[str, Close]]) -> None:
    """Close each resource in order; one that fails to close is logged, the rest still close."""
    for name, close in closers:
        try:
            result = close()
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("resource failed to close", resource=name)
        else:
            log.info("resource closed", resource=name)


def run_service(
    name: str, setup: Callable[[Runtime], Awaitable[None]], *, migrations: Path | None
) -> None:
    """Process entry point: run until SIGTERM or SIGINT, then shut down in order."""
    settings = CommonSettings()
    configure_logging(settings.log_format, settings.log_level, service=name)
    configure_tracing(name, settings.otlp_endpoint)
    _tune_gc()

    async def main() -> list[str]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await serve(name, setup, migrations=migrations, stop=stop, settings=settings)

    with asyncio.Runner(loop_factory=loop_factory(settings.uvloop)) as runner:
        if runner.run(main()):
            raise SystemExit(1)


# Allocations (net) between two young-generation collections: ten times Python's 700. A
# service allocates short-lived objects per message and statement; the default ran the
# collector thousands of times a second under load (4-5 % of a service's CPU in a profile).
GC_YOUNG_THRESHOLD = 7000


def _tune_gc() -> None:
    """Fewer garbage collections: what the process holds once its modules are imported
    (code, protobuf descriptors, SQLAlchemy's compiled machinery) is moved out of the
    collector's sight (``gc.freeze``), so a full collection scans the objects the service
    made since, and the young generation is collected less often."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)
