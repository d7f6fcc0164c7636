"""The whole stack on one machine: what ``dispo up`` runs.

Embedded PostgreSQL and nats-server keep their data under one folder (``.dispo`` by
default), so stopping and starting the stack keeps every task. Given external URLs
(``DISPO_DATABASE_URL`` / ``DISPO_NATS_URL`` or the flags) it starts only the services.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
from dispo.auth.bootstrap import StackCredentials, prepare_token_store, stack_credentials
from dispo.auth.signing import KEY_ENV, SIGNING_KEY_HOLDERS
from dispo.libs.catalogue import example_calling
from dispo.libs.clock import SystemClock
from dispo.libs.db.passwords import PASSWORDS_FILE, kept_passwords
from dispo.libs.db.roles import (
    Login,
    bootstrap,
    login_from_url,
    login_url,
    role_name,
    without_password,
)
from dispo.libs.logging import get_logger
from dispo.libs.private_files import PRIVATE_FOLDER, private_folder, write_private
from dispo.libs.process import ProcessSpec, free_port, python_module
from dispo.libs.service import until_reachable
from dispo.libs.settings import DEFAULT_METRICS_PORTS, server_settings
from dispo.libs.tls import LocalCertificates
from dispo.tools.stack.cluster import NatsCluster
from dispo.tools.stack.logs import LogSettings, log_rotation
from dispo.tools.stack.nats import NatsServer
from dispo.tools.stack.nats_auth import NatsUsers
from dispo.tools.stack.ownership import (
    FolderLock,
    Recorded,
    StackRunning,
    start_ticks,
)
from dispo.tools.stack.state import (
    CONSOLE,
    DEMO_DOWNSTREAM,
    INFRASTRUCTURE_SHUTDOWN_ORDER,
    NATS,
    OPENCLAW,
    POOL_WORKER,
    POSTGRES,
    SERVICES,
    SHUTDOWN_ORDER,
    STATE_FILE,
    metrics_url,
    read_state,
    stop_stale,
)
from dispo.tools.stack.supervisor import Supervisor

if TYPE_CHECKING:
    from dispo.tools.stack.postgres import EmbeddedPostgres

log = get_logger(__name__)

# Where `dispo up --tls` keeps its local CA and certificates.
TLS_FOLDER = "tls"
# The example catalogue as this stack's services read it: calling its demo downstream.
DEMO_CATALOGUE = "catalogue.yaml"


@dataclass
class StackOptions:
    data_dir: Path
    database_url: str | None = None
    nats_url: str | None = None
    nats_port: int = 4222
    host: str = "127.0.0.1"
    # DISPO_<SERVICE>_PORT, else the default port of each service.
    ports: dict[str, int] = field(
        default_factory=lambda: {n: server_settings(n).port for n in SERVICES}
    )
    # Ports of the services' metrics endpoints: DISPO_<SERVICE>_METRICS_PORT, else 9151…
    metrics_ports: dict[str, int] = field(default_factory=lambda: default_metrics_ports())
    services: tuple[str, ...] = SERVICES
    # Port of the demo downstream (0: do not start it).
    demo_port: int = 8181
    # Port of the web console, started beside the gateway (0: do not start it; `dispo up`
    # gives DISPO_CONSOLE_PORT, else 8180).
    console_port: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)
    # Processes per service (default 1): replica 1 is named as the service and listens on
    # its port, replica k > 1 is ``<service>-k`` on a free port. Executor replicas share
    # the durable consumers (they split the work); each gateway serves callers on its own port.
    replicas: dict[str, int] = field(default_factory=dict)
    # Nodes of the embedded NATS (1: one nats-server on nats_port; 3: a JetStream cluster
    # ``nats-0``… on free loopback ports, streams created with that many replicas).
    nats_nodes: int = 1
    # Where the pool's crons run: ``local`` (the pool-worker companion) or ``openclaw`` (an
    # OpenClaw gateway the stack starts on ``openclaw_port``, its state under the data
    # folder, unless ``openclaw_url`` names one to attach to with ``openclaw_token``).
    pool_driver: str = "local"
    openclaw_url: str | None = None
    openclaw_token: str | None = None
    openclaw_port: int = 18789
    # TLS for every server and channel, with a local CA and certificates made in the data
    # folder on the first start with it and kept (``dispo up --tls``); mTLS besides when
    # DISPO_TLS_CLIENT_AUTH is set.
    tls: bool = False

    @property
    def demo_origin(self) -> str | None:
        """Where the demo downstream this stack starts answers (None: it starts none)."""
        if not self.demo_port or "executor" not in self.services:
            return None
        return f"http://{self.host}:{self.demo_port}"

    @property
    def demo_catalogue(self) -> Path | None:
        """The example catalogue calling this stack's demo downstream on its port, kept in the
        data folder and handed to the services; None when the stack starts no demo downstream
        or the operator names a catalogue (``DISPO_CATALOGUE``)."""
        if self.demo_origin is None or {**os.environ, **self.extra_env}.get("DISPO_CATALOGUE"):
            return None
        return self.data_dir / DEMO_CATALOGUE

    def address(self, service: str) -> str:
        """Where ``service`` (its first replica) listens for gRPC in this stack."""
        return f"{self.host}:{self.ports[service]}"

    @property
    def certificates(self) -> LocalCertificates | None:
        return LocalCertificates(self.data_dir / TLS_FOLDER) if self.tls else None

    @property
    def tls_hosts(self) -> list[str]:
        """The names the servers' certificate carries: loopback and the host they bind."""
        return list(dict.fromkeys(["127.0.0.1", "localhost", self.host]))


def default_metrics_ports() -> dict[str, int]:
    """Each service's metrics port: its ``DISPO_<SERVICE>_METRICS_PORT``, else its default."""
    return {n: server_settings(n).metrics_port or DEFAULT_METRICS_PORTS[n] for n in SERVICES}


def replica_names(service: str, count: int) -> list[str]:
    """``["executor", "executor-2", "executor-3"]`` for three executor replicas."""
    return [service, *(f"{service}-{k}" for k in range(2, count + 1))]


def service_env(
    service: str, database_url: str, nats_url: str, nats_users: NatsUsers | None
) -> dict[str, str]:
    """What every process of ``service`` is handed, by ``dispo up`` and the tests alike:
    ``database_url``, its own database role's (never another service's, never the
    superuser's), where NATS is, and its own bus user. Without ``nats_users`` (an external
    bus) the process keeps the bus credentials of its environment (``DISPO_NATS_*``)."""
    env = {"DISPO_DATABASE_URL": database_url, "DISPO_NATS_URL": nats_url}
    if nats_users is not None:
        env.update(nats_users.env(service))
    return env


# The settings that tell a service where it calls another one of the stack, by service:
# setting -> the service it names. The stack hands each the address it gave that service.
PEERS = {
    "gateway": {
        "DISPO_GATEWAY_EXECUTOR_ADDRESS": "executor",
        # Where EraseTask seals a FAILED task against a resume (ADR-0114).
        "DISPO_GATEWAY_RECONCILER_ADDRESS": "reconciler",
    },
    # Where the executor and the reconciler follow the catalogue's versions (ADR-0111).
    "executor": {"DISPO_CATALOGUE_GATEWAY_ADDRESS": "gateway"},
    "reconciler": {
        "DISPO_CATALOGUE_GATEWAY_ADDRESS": "gateway",
        "DISPO_RECONCILER_GATEWAY_ADDRESS": "gateway",
        "DISPO_RECONCILER_DRIFT_POOL_ADDRESS": "pool",
        "DISPO_RECONCILER_EXECUTOR_ADDRESS": "executor",
    },
    "pool": {"DISPO_POOL_INTELLIGENCE_ADDRESS": "intelligence"},
}


def service_specs(
    options: StackOptions,
    database_urls: dict[str, str],
    nats_url: str,
    pool_env: dict[str, str] | None = None,
    nats_users: NatsUsers | None = None,
    credentials: StackCredentials | None = None,
) -> list[ProcessSpec]:
    """``database_urls``: each service's own URL (its role)."""
    common = {"DISPO_LOG_FORMAT": "json", **options.extra_env}
    if options.certificates is not None:  # every process serves and calls over TLS
        common.update(options.certificates.env())
    if options.nats_nodes > 1:  # each stream on every node of the cluster
        common.setdefault("DISPO_STREAM_REPLICAS", str(options.nats_nodes))
    logs = options.data_dir / "logs"
    local_crons = str(options.data_dir / "pool" / "local-crons.sqlite")
    common["DISPO_POOL_LOCAL_REGISTRY"] = local_crons
    specs = []
    demo = options.demo_origin
    if demo and "DISPO_EGRESS_ALLOW" not in {**os.environ, **common}:
        # The embedded default: callers' addresses may name the demo downstream it starts.
        common["DISPO_EGRESS_ALLOW"] = demo
    if (catalogue := options.demo_catalogue) is not None:  # and the example calls it there
        common["DISPO_CATALOGUE"] = str(catalogue)
    if demo:
        specs.append(
            ProcessSpec(
                DEMO_DOWNSTREAM,
                [
                    *python_module("dispo.executor.demo_downstream"),
                    "--host",
                    options.host,
                    "--port",
                    str(options.demo_port),
                ],
                common,
                None,
                logs / f"{DEMO_DOWNSTREAM}.log",
                http_health=f"http://{options.host}:{options.demo_port}/healthz",
                new_session=True,
            )
        )

    def token(name: str) -> dict[str, str]:
        if credentials is None:
            return {}
        env = {"DISPO_SERVICE_TOKEN": credentials.service_token(name)}
        if name == "gateway":  # the token store's writer stores the stack's tokens
            env["DISPO_GATEWAY_AUTH_BOOTSTRAP_FILE"] = str(credentials.bootstrap_file)
        if name in SIGNING_KEY_HOLDERS:  # one set in the environment is the operator's
            env[KEY_ENV] = os.environ.get(KEY_ENV) or credentials.signing_key
        return env

    def peers(service: str) -> dict[str, str]:
        """Where ``service`` calls the other services of this stack (:data:`PEERS`), unless
        the operator set it in the environment."""
        return {
            setting: options.address(peer)
            for setting, peer in PEERS.get(service, {}).items()
            if peer in options.services and setting not in os.environ and setting not in common
        }

    for service in options.services:
        for k, name in enumerate(replica_names(service, options.replicas.get(service, 1))):
            port = options.ports[service] if k == 0 else free_port()
            metrics_port = options.metrics_ports[service] if k == 0 else free_port()
            env = {
                **service_env(service, database_urls[service], nats_url, nats_users),
                **common,
                **peers(service),
                **((pool_env or {}) if service == "pool" else {}),
                **token(service),
                f"DISPO_{service.upper()}_HOST": options.host,
                f"DISPO_{service.upper()}_PORT": str(port),
                f"DISPO_{service.upper()}_METRICS_PORT": str(metrics_port),
            }
            specs.append(
                ProcessSpec(
                    name,
                    python_module(f"dispo.{service}"),
                    env,
                    f"{options.host}:{port}",
                    logs / f"{name}.log",
                    new_session=True,
                    metrics=metrics_url(options.host, metrics_port),
                )
            )
    if options.console_port and "gateway" in options.services:
        specs.append(console_spec(options, common, logs))
    if "pool" in options.services and options.pool_driver == "local":
        env = {
            **service_env("pool", database_urls["pool"], nats_url, nats_users),  # part of the pool
            **common,
            **token(POOL_WORKER),
            "DISPO_POOL_WORKER_POOL_ADDRESS": options.address("pool"),
            "DISPO_POOL_WORKER_LOCAL_REGISTRY": local_crons,
        }
        specs.append(
            ProcessSpec(
                POOL_WORKER,
                python_module("dispo.pool.worker"),
                env,
                None,
                logs / f"{POOL_WORKER}.log",
                new_session=True,
            )
        )
    return specs


def console_spec(options: StackOptions, common: dict[str, str], logs: Path) -> ProcessSpec:
    """The web console on ``console_port``, calling the services of this stack (its users'
    tokens on its calls: it is handed none of its own)."""
    url = console_address(options)
    env = {
        **common,
        "DISPO_CONSOLE_HOST": options.host,
        "DISPO_CONSOLE_PORT": str(options.console_port),
        **{
            f"DISPO_CONSOLE_{service.upper()}_ADDRESS": options.address(service)
            for service in ("gateway", "reconciler", "executor", "pool", "intelligence")
        },
    }
    return ProcessSpec(
        CONSOLE,
        python_module("dispo.console"),
        env,
        None,
        logs / f"{CONSOLE}.log",
        http_health=f"{url}/healthz",
        new_session=True,
    )


def console_address(options: StackOptions) -> str:
    return f"http://{options.host}:{options.console_port}"


class Stack:
    def __init__(
        self, options: StackOptions, progress: Callable[[str], None] | None = None
    ) -> None:
        self.options = options
        # Told what a slow step of the start is doing (dispo up prints it).
        self.progress = progress or (lambda line: None)
        self.postgres: EmbeddedPostgres | None = None
        self.nats: NatsServer | None = None
        self.nats_cluster: NatsCluster | None = None
        # Runs the embedded PostgreSQL and nats-server, restarting them like the services.
        self.infrastructure = Supervisor([])
        self.supervisor: Supervisor | None = None
        self._lock = FolderLock(options.data_dir)
        self._ready = False
        # The admin token and the services' tokens (dispo.auth.bootstrap), once started.
        self.credentials: StackCredentials | None = None

    def claim(self) -> list[Recorded] | None:
        """Make this process the one running the folder's stack, before starting anything.

        :class:`StackRunning` if a live stack runs there. A stale one (its state file left
        by a ``dispo up`` that was killed) is cleaned up: what of it still runs is stopped,
        in order. Returns what was stopped then, None if the folder held no stale stack."""
        data = self.options.data_dir
        try:
            self._lock.acquire()
        except StackRunning as running:
            running.state = read_state(data)
            raise
        stale = read_state(data)
        if stale is None:
            return None
        log.warning("cleaning up a stack whose dispo up did not stop", pid=stale.get("pid"))
        return stop_stale(data, stale)

    async def start(self) -> dict[str, str]:
        """Start infrastructure and services; return each service's address once SERVING.

        Claims the folder first unless :meth:`claim` was called."""
        data = self.options.data_dir
        data.mkdir(parents=True, exist_ok=True, mode=PRIVATE_FOLDER)
        private_folder(data / "logs")
        if not self._lock.held:
            await asyncio.to_thread(self.claim)
        infrastructure = []
        database_url = self.options.database_url
        if database_url is None:
            # Only here: the embedded server comes with the `local` extra, which hosts given
            # an external database (`dispo up --services executor`) need not install.
            from dispo.tools.stack.postgres import EmbeddedPostgres

            self.postgres = EmbeddedPostgres(data / "postgres")
            log_path = data / "logs" / f"{POSTGRES}.log"
            infrastructure.append(await asyncio.to_thread(self.postgres.spec, log_path, POSTGRES))
            database_url = self.postgres.url
        nats_url = self.options.nats_url
        nats_users = None
        if nats_url is None:  # the embedded bus: its users made on first start, kept 0600
            nats_users = await asyncio.to_thread(NatsUsers.kept, data / "nats" / "users.json")
        if nats_users is not None and self.options.nats_nodes > 1:
            self.nats_cluster = NatsCluster(
                data / "nats", nats_users, self.options.nats_nodes, data / "logs", name=NATS
            )
            infrastructure += self.nats_cluster.specs()
            nats_url = self.nats_cluster.url
        elif nats_users is not None:
            self.nats = NatsServer(
                data / "nats",
                self.options.nats_port,
                data / "logs" / f"{NATS}.log",
                users=nats_users,
            )
            infrastructure.append(self.nats.spec(NATS))
            nats_url = self.nats.url
        assert nats_url is not None  # given, or the embedded one's
        if self.options.tls:  # made on the first start with --tls, kept for the next
            from dispo.tools.stack.certificates import local_certificates  # (cryptography)

            await asyncio.to_thread(local_certificates, data / TLS_FOLDER, self.options.tls_hosts)
        pool_env: dict[str, str] = {}
        if "pool" in self.options.services and self.options.pool_driver == "openclaw":
            pool_env, gateway = await self._openclaw()
            infrastructure += gateway
        addresses: dict[str, str] = {}
        shown_url = without_password(database_url)
        credentials = await asyncio.to_thread(stack_credentials, data, [*SERVICES, POOL_WORKER])
        self.credentials = credentials

        def write_state() -> None:
            self._write_state(addresses, shown_url, nats_url)

        self.infrastructure = Supervisor(infrastructure, on_spawn=write_state)
        await self.infrastructure.start_all()
        if self.nats_cluster is not None:  # JetStream answers once the nodes elect a leader
            await asyncio.to_thread(self.nats_cluster.wait_ready, 120.0)
        database_urls = await self._database_roles(database_url)
        specs = service_specs(
            self.options, database_urls, nats_url, pool_env, nats_users, credentials
        )
        addresses.update({spec.name: spec.address for spec in specs if spec.address})
        # Tokens are checked from the services' first call on, whichever of them run here: the
        # token store is made and the stack's tokens stored as the gateway, its one writer.
        await until_reachable(
            "database",
            lambda: prepare_token_store(
                database_urls["gateway"], credentials.bootstrap_file, SystemClock()
            ),
        )
        if (catalogue := self.options.demo_catalogue) is not None:
            assert self.options.demo_origin is not None  # a catalogue only for a demo
            write_private(catalogue, example_calling(self.options.demo_origin))
        self.supervisor = Supervisor(specs, on_spawn=write_state)
        await self.supervisor.start_all()
        self._ready = True
        write_state()
        return addresses

    async def _database_roles(self, admin_url: str) -> dict[str, str]:
        """Each service's own database URL: its ``DISPO_<SERVICE>_DATABASE_URL``, else its
        role with a password kept in the data folder, both made sure of by the bootstrap
        (run as ``admin_url``'s role). Against an external database where every service
        has its own URL, the operator has bootstrapped it: nothing is run."""
        # The gateway's role owns the token store, which every service reads: it is made
        # whichever services run here.
        wanted = {*self.options.services, "gateway"}
        services = [s for s in SERVICES if s in wanted]
        given = {s: url for s in services if (url := server_settings(s).database_url)}
        made = [s for s in services if s not in given]
        if not made and self.postgres is None:
            return given
        passwords = await asyncio.to_thread(
            kept_passwords, self.options.data_dir / PASSWORDS_FILE, made
        )
        logins = {s: Login(role_name(s), passwords[s]) for s in made}
        logins |= {s: login_from_url(url) for s, url in given.items()}
        try:
            await bootstrap(admin_url, logins)
        except asyncpg.PostgresError as error:
            raise RuntimeError(
                f"the database bootstrap failed on {without_password(admin_url)}: {error}."
                " dispo up needs a superuser's DISPO_DATABASE_URL to make the services' roles,"
                " or every service its own DISPO_<SERVICE>_DATABASE_URL (docs/security.md)"
            ) from error
        return {s: given.get(s) or login_url(admin_url, logins[s]) for s in services}

    async def _openclaw(self) -> tuple[dict[str, str], list[ProcessSpec]]:
        """The pool's settings for the openclaw driver, and the gateway to start (none when
        attaching to ``openclaw_url``)."""
        options = self.options
        home = options.data_dir / "openclaw" / "home"
        env = {"DISPO_POOL_DRIVER": "openclaw", "DISPO_POOL_OPENCLAW_HOME": str(home)}
        if options.openclaw_url:
            env["DISPO_POOL_OPENCLAW_URL"] = options.openclaw_url
            if options.openclaw_token:
                env["DISPO_POOL_OPENCLAW_TOKEN"] = options.openclaw_token
            return env, []
        from dispo.pool.openclaw import OpenClawGateway, ensure_openclaw

        # Minutes, the first time only: it says what it is doing.
        install = await asyncio.to_thread(ensure_openclaw, progress=self.progress)
        token = options.openclaw_token or _kept_token(options.data_dir / "openclaw" / "token")
        log_path = options.data_dir / "logs" / f"{OPENCLAW}.log"
        gateway = OpenClawGateway(install, home, log_path, port=options.openclaw_port, token=token)
        self.progress(
            f"starting the OpenClaw gateway on 127.0.0.1:{gateway.port} (a minute or so; its"
            f" log: {log_path})"
        )
        env.update(gateway.cli_env())
        spec = gateway.process.spec
        if options.certificates is not None:  # the wake commands it runs call the pool
            spec = dataclasses.replace(spec, env={**spec.env, **options.certificates.env()})
        return env, [dataclasses.replace(spec, name=OPENCLAW)]

    async def watch(self) -> None:
        """Restart any process of the stack that exits, until :meth:`stop`."""
        assert self.supervisor is not None, "start() first"
        rotation = log_rotation(self.options.data_dir / "logs", LogSettings(), SystemClock())
        try:
            await asyncio.gather(
                self.infrastructure.watch(), self.supervisor.watch(), rotation.run()
            )
        finally:
            rotation.stop()

    def metrics_addresses(self) -> dict[str, str]:
        """Where each service process of the stack serves its metrics, by name."""
        children = self.supervisor.children if self.supervisor is not None else {}
        return {n: c.process.spec.metrics for n, c in children.items() if c.process.spec.metrics}

    def pids(self) -> dict[str, int]:
        """The pid of every process of the stack that is running, by name: services,
        companions, ``postgres`` (the postmaster) and ``nats`` (or ``nats-0``… of a cluster)."""
        found: dict[str, int] = {}
        for supervisor in (self.infrastructure, self.supervisor):
            for name, child in (supervisor.children if supervisor else {}).items():
                if child.process.running() and child.process.pid is not None:
                    found[name] = child.process.pid
        return found

    def _write_state(self, addresses: dict[str, str], database_url: str, nats_url: str) -> None:
        if self.supervisor is None:  # still starting: written once the services are up
            return
        supervisor, infrastructure = self.supervisor, self.infrastructure

        def process(supervisor: Supervisor, name: str) -> dict[str, Any]:
            pid = supervisor.pid(name)
            # The start time tells this process from a later one that reuses its pid.
            return {"pid": pid, "started": start_ticks(pid) if pid is not None else None}

        state = {
            # The dispo up running the stack, and whether all of it is up yet.
            "pid": os.getpid(),
            "ready": self._ready,
            "database_url": database_url,
            "nats_url": nats_url,
            # What a caller presents and trusts (the CLI reads it: caller_tls).
            "tls": (
                {
                    "ca_file": str(certificates.ca_file),
                    "client_cert_file": str(certificates.client_cert_file),
                    "client_key_file": str(certificates.client_key_file),
                }
                if (certificates := self.options.certificates) is not None
                else None
            ),
            "services": {
                name: {
                    "address": address,
                    "metrics": supervisor.children[name].process.spec.metrics,
                    **process(supervisor, name),
                }
                for name, address in addresses.items()
            },
            # Where the web console answers (None when the stack runs none).
            "console": (console_address(self.options) if CONSOLE in supervisor.children else None),
            "companions": {
                name: process(supervisor, name)
                for name in supervisor.children
                if name not in addresses
            },
            "infrastructure": {
                name: process(infrastructure, name) for name in infrastructure.children
            },
        }
        # owner-only, and readers never see half a file
        write_private(self.options.data_dir / STATE_FILE, json.dumps(state, indent=2))

    async def stop(self) -> list[str]:
        """Stop services, then NATS, then PostgreSQL; each runs even if one before failed.

        Returns what failed to stop (empty when everything stopped cleanly)."""
        if not self._lock.held:  # the folder is another stack's, or none was started
            return []
        failed = []
        if self.supervisor is not None:
            order = [
                name
                for service in SHUTDOWN_ORDER
                for name in replica_names(service, self.options.replicas.get(service, 1))
            ]
            failed += await self.supervisor.stop_all(order)
        nodes = self.nats_cluster.names if self.nats_cluster is not None else []
        failed += await self.infrastructure.stop_all(
            [*nodes, *INFRASTRUCTURE_SHUTDOWN_ORDER], timeout=60
        )
        (self.options.data_dir / STATE_FILE).unlink(missing_ok=True)
        self._lock.release()
        return failed


def _kept_token(path: Path) -> str:
    """The stack's gateway token, made once and kept beside its state."""
    if not path.exists():
        write_private(path, secrets.token_hex(16))
    return path.read_text().strip()
