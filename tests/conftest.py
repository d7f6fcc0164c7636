"""Fixtures shared by every test: real PostgreSQL and NATS JetStream, real service processes.

Infrastructure starts once per test session (temporary folders, free ports) and only when a
test asks for it. ``database_url`` and ``nats_url`` give each test a clean state: a database
of its own, cloned from a template where every service's schema is already migrated (see
``support.databases``; mark a test ``blank_database`` to get one with no Dispo table), and
no JetStream stream left from earlier tests.

NATS is protected as ``dispo up`` protects it: one user per service with its permissions, no
anonymous client; a service process connects as its service, the test's own ``bus`` as
``admin``, and a permission the services lack shows as a violation in the server's log,
which fails the session.

PostgreSQL is protected as ``dispo up`` protects it: a password for every connection, and
each service process logs in as its own role, which owns its schema and nothing else.
``database_url`` is the superuser's URL, for test helpers that read or set up tables
directly; ``role_url("executor")`` is the same database as a service's role.

    async def test_x(database_url, nats_url, start_service):
        gateway = await start_service("gateway")          # a real process, SERVING
        async with open_channel(gateway.address, tokens.admin) as channel: ...

Every test database holds an admin token and each service's token (``tokens``,
``support.auth``); ``start_service`` hands each process its own, as ``dispo up`` does.
        gateway.kill()                                     # SIGKILL
        await gateway.restart()
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
from dispo.auth.bootstrap import MIGRATIONS as AUTH_MIGRATIONS
from dispo.libs.bus import Bus, BusCredentials
from dispo.libs.clock import ManualClock, write_file_clock
from dispo.libs.db import create_engine, migrate
from dispo.libs.db.driver import Database
from dispo.libs.db.passwords import kept_passwords
from dispo.libs.db.roles import Login, login_url, role_name
from dispo.libs.process import ManagedProcess, ProcessSpec, free_port, python_module
from dispo.tools.stack.nats import NatsServer
from dispo.tools.stack.nats_auth import ADMIN, NatsUsers
from dispo.tools.stack.postgres import EmbeddedPostgres
from dispo.tools.stack.stack import SERVICES, service_env
from hypothesis import settings
from support.auth import TestTokens
from support.databases import TestDatabases
from support.http import FakeServer, Routes

# Hypothesis' per-example deadline is a wall-clock assertion: a busy machine fails it.
settings.register_profile("dispo", deadline=None)
settings.load_profile("dispo")

# The gateway / executor / SDK fixtures (catalogue, demo downstream, pipeline processes).
pytest_plugins = ["pipeline_fixtures"]

REPO_ROOT = Path(__file__).resolve().parent.parent


def migration_chains() -> list[tuple[str, Path]]:
    """Every Alembic chain a service applies on start, as (schema, script location)."""
    from dispo.reconciler import drift

    chains = [(s, REPO_ROOT / "services" / s / "migrations") for s in SERVICES]
    return [("auth", AUTH_MIGRATIONS), *chains, ("reconciler", drift.MIGRATIONS)]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--screenshots",
        default="",
        help="where the console's browser tests write their screenshots; docs/screenshots"
        " refreshes the documentation's pictures (.ci/screenshots). Default: a scratch folder"
        " of the run, so a test run changes no tracked file",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files marked ``long_file`` first (each file runs on one worker, in order): a long file
    started last would leave the other worker idle while it ends."""
    items.sort(key=lambda item: item.get_closest_marker("long_file") is None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "long_file: this file's tests take minutes; its file is scheduled first, so the"
        " suite's workers do not wait on it at the end",
    )
    config.addinivalue_line(
        "markers",
        "blank_database: the test's database has no Dispo schema yet (to watch migrations run)",
    )


@dataclass
class Infra:
    root: Path
    postgres: EmbeddedPostgres
    nats: NatsServer
    databases: TestDatabases
    tokens: TestTokens

    @property
    def nats_url(self) -> str:
        return self.nats.url

    @property
    def nats_users(self) -> NatsUsers:
        return self.nats.users

    def nats_credentials(self, user: str = ADMIN) -> BusCredentials:
        return self.nats.credentials(user)

    def restart_nats(self) -> None:
        """Bring NATS back on the same port with the same store (after ``nats.stop()``)."""
        self.nats.start()


@pytest.fixture(scope="session")
def infra() -> Iterator[Infra]:
    with tempfile.TemporaryDirectory(prefix="dispo-test-") as root:
        base = Path(root)
        # Throwaway cluster: no fsync (a crash of PostgreSQL still loses nothing committed).
        postgres = EmbeddedPostgres(base / "postgres", durable=False)
        postgres.start()
        users = NatsUsers.kept(base / "nats-users.json")
        nats = NatsServer(base / "nats", log_file=base / "nats.log", users=users)
        nats.start()
        passwords = kept_passwords(postgres.passwords_file, SERVICES)
        logins = {s: Login(role_name(s), passwords[s]) for s in SERVICES}
        databases = TestDatabases(postgres.url, migration_chains(), logins)
        tokens = TestTokens.make()
        asyncio.run(databases.build_template(seed=tokens.seed))
        yield Infra(base, postgres, nats, databases, tokens)
        databases.close()
        nats.stop()
        postgres.stop("immediate")
        log = (base / "nats.log").read_text(errors="replace").splitlines()
        violations = [line for line in log if "Violation" in line or "authentication error" in line]
        assert not violations, "the bus refused the services:\n" + "\n".join(violations[:20])


async def _delete_streams(url: str, credentials: BusCredentials) -> None:
    bus = await Bus.connect(
        [url], name="test-cleaner", credentials=credentials, max_reconnect_attempts=3
    )
    try:
        for name in await bus.js.streams_info():
            await bus.js.delete_stream(name.config.name)
    finally:
        await bus.close()


@pytest.fixture(scope="session")
def tokens(infra: Infra) -> TestTokens:
    """The admin token and every service's token, in every test database."""
    return infra.tokens


@pytest.fixture
async def database_url(infra: Infra, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """This test's own database (postgresql:// URL, as the superuser), every service's schema
    migrated to head; with the ``blank_database`` mark, one with empty schemas. Dropped after
    the test."""
    if not infra.postgres.running():
        infra.postgres.start()
    databases = infra.databases
    if request.node.get_closest_marker("blank_database"):
        name = await databases.blank()
    else:
        name = await databases.take()
    yield databases.url(name)
    databases.release(name)


@pytest.fixture
async def nats_url(infra: Infra) -> str:
    """NATS JetStream with no streams left from earlier tests."""
    if not infra.nats.running():
        infra.nats.start()
    await _delete_streams(infra.nats_url, infra.nats_credentials())
    return infra.nats_url


@pytest.fixture
async def bus(infra: Infra, nats_url: str) -> AsyncIterator[Bus]:
    """The test's own connection to the bus, as ``admin`` (every subject)."""
    connected = await Bus.connect([nats_url], name="test", credentials=infra.nats_credentials())
    yield connected
    await connected.close()


@pytest.fixture
def role_url(infra: Infra, database_url: str) -> Callable[[str], str]:
    """``role_url("executor")``: this test's database as that service's own role."""
    return lambda service: login_url(database_url, infra.databases.logins[service])


@pytest.fixture
async def service_engine(role_url: Callable[[str], str]):
    """``await service_engine("gateway")``: an engine on that schema as the service's own
    role, migrated to head (already there in a cloned database: the migration finds nothing
    to do)."""
    engines = []

    async def make(service: str, migrations: Path | None = None):
        engine = create_engine(role_url(service), service)
        await migrate(
            engine, service, migrations or REPO_ROOT / "services" / service / "migrations"
        )
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.dispose()


@pytest.fixture
async def service_db(role_url: Callable[[str], str], service_engine):
    """``await service_db("executor")``: the driver port on that schema as the service's
    own role (:class:`dispo.libs.db.driver.Database`), the schema migrated to head."""
    pools = []

    async def make(service: str, migrations: Path | None = None) -> Database:
        await service_engine(service, migrations)
        db = await Database.open(role_url(service), service, size=5)
        pools.append(db)
        return db

    yield make
    for db in pools:
        await db.close()


@pytest.fixture
def manual_clock() -> ManualClock:
    return ManualClock(datetime(2026, 1, 1, tzinfo=UTC))


@dataclass
class FileClockControl:
    """A clock shared with service processes: pass ``env`` to them, move it with ``set``/``advance``."""

    path: Path
    now: datetime = field(default_factory=lambda: datetime(2026, 1, 1, tzinfo=UTC))

    def __post_init__(self) -> None:
        write_file_clock(self.path, self.now)

    @property
    def env(self) -> dict[str, str]:
        return {"DISPO_CLOCK": f"file:{self.path}"}

    def set(self, moment: datetime) -> None:
        self.now = moment
        write_file_clock(self.path, moment)

    def advance(self, **delta: float) -> datetime:
        from datetime import timedelta

        self.set(self.now + timedelta(**delta))
        return self.now

    @contextlib.asynccontextmanager
    async def running(self, every: float = 0.1) -> AsyncIterator[None]:
        """The clock moves on at the pace of real time while the block runs, as a real
        clock does: a part that went to sleep on it after the last ``advance`` (a renewal,
        a heartbeat, a sweep) wakes again, where a clock held still would keep it asleep."""
        from datetime import timedelta

        async def tick() -> None:
            while True:
                await asyncio.sleep(every)
                self.set(self.now + timedelta(seconds=every))

        ticking = asyncio.create_task(tick())
        try:
            yield
        finally:
            ticking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticking


@pytest.fixture
def file_clock(tmp_path: Path) -> FileClockControl:
    return FileClockControl(tmp_path / "clock")


@dataclass
class ServiceProcesses:
    """Real service processes on one database, each as its own database role and with its
    own service token."""

    role_url: Callable[[str], str]
    nats_url: str
    logs: Path
    tokens: TestTokens
    nats_users: NatsUsers | None = None
    started: list[ManagedProcess] = field(default_factory=list)

    async def start(
        self, name: str, env: dict[str, str] | None = None, *, wait: bool = True, port: int = 0
    ) -> ManagedProcess:
        """``port``: where it listens (0: a free port)."""
        port = port or free_port()
        full_env = {
            **service_env(name, self.role_url(name), self.nats_url, self.nats_users),
            "DISPO_LOG_FORMAT": "json",
            "DISPO_LOG_LEVEL": "INFO",
            f"DISPO_{name.upper()}_HOST": "127.0.0.1",
            f"DISPO_{name.upper()}_PORT": str(port),
            **self.tokens.service_env(name),
            **(env or {}),
        }
        service = ManagedProcess(
            ProcessSpec(
                name,
                python_module(f"dispo.{name}"),
                full_env,
                f"127.0.0.1:{port}",
                self.logs / f"{name}-{len(self.started)}.log",
            )
        )
        service.spawn()
        self.started.append(service)
        if wait:
            await service.wait_ready()
        return service

    def kill_all(self) -> None:
        for service in reversed(self.started):
            service.kill()


@pytest.fixture
async def start_service(
    role_url: Callable[[str], str], nats_url: str, tmp_path: Path, infra: Infra
) -> AsyncIterator[Callable[..., Awaitable[ManagedProcess]]]:
    """``await start_service("executor", env={...})``: a real service process, SERVING, on
    this test's database as its own role; killed after the test."""
    services = ServiceProcesses(role_url, nats_url, tmp_path, infra.tokens, infra.nats_users)
    yield services.start
    services.kill_all()


@pytest.fixture(scope="module")
async def module_database(infra: Infra) -> AsyncIterator[str]:
    """A database shared by the tests of one module (for a stack they all use)."""
    if not infra.postgres.running():
        infra.postgres.start()
    name = await infra.databases.take()
    yield infra.databases.url(name)
    infra.databases.release(name)


@pytest.fixture(scope="module")
async def module_services(
    infra: Infra, module_database: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ServiceProcesses]:
    """``await module_services.start("gateway")``: service processes the tests of one module
    share, on :func:`module_database`, with no stream left from earlier tests."""
    if not infra.nats.running():
        infra.nats.start()
    await _delete_streams(infra.nats_url, infra.nats_credentials())
    services = ServiceProcesses(
        lambda service: login_url(module_database, infra.databases.logins[service]),
        infra.nats_url,
        tmp_path_factory.mktemp("services"),
        infra.tokens,
        infra.nats_users,
    )
    yield services
    services.kill_all()


@pytest.fixture
async def authorizer(database_url: str):
    """``create_server(..., authorizer(rules))``-ready: what a service checks calls with,
    on this test's database (``support.auth.authorizer``); ``rules`` for test methods."""
    from support.auth import authorizer as make

    db = await Database.open(database_url, "auth", size=5)  # connects at its first statement

    def build(rules=None):
        return make(db, rules)

    yield build
    await db.close()


@pytest.fixture
async def fake_server() -> AsyncIterator[Callable[..., Awaitable[FakeServer]]]:
    """``server = await fake_server(routes, start=True)``: a real HTTP server on 127.0.0.1 for a
    party outside Dispo (``support.http``), its port known from the start; stopped after the test."""
    servers: list[FakeServer] = []

    async def make(routes: Routes, *, start: bool = True) -> FakeServer:
        server = FakeServer(routes)
        servers.append(server)
        if start:
            await server.start()
        return server

    yield make
    for server in servers:
        await server.stop()
