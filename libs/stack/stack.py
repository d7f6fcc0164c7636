"""The whole stack on one machine: what ``dispo up`` runs.

Embedded PostgreSQL and nats-server keep their data under one folder (``.dispo`` by
default), so stopping and starting the stack keeps every task. Given external URLs
(``DISPO_DATABASE_URL`` / ``DISPO_NATS_URL`` or the flags) it starts only the services.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispo.libs.logging import get_logger
from dispo.libs.settings import server_settings
from dispo.libs.stack.cluster import NatsCluster
from dispo.libs.stack.nats import NatsServer, free_port
from dispo.libs.stack.process import ProcessSpec, python_module
from dispo.libs.stack.supervisor import Supervisor

if TYPE_CHECKING:
    from dispo.libs.stack.postgres import EmbeddedPostgres

log = get_logger(__name__)

SERVICES = ("gateway", "executor", "reconciler", "intelligence", "pool")
# Processes that serve the services rather than callers: the pool's local-driver crons,
# and the demo downstream the example catalogue points at.
POOL_WORKER = "pool-worker"
DEMO_DOWNSTREAM = "demo-downstream"
# Stop the entry point first so nothing new arrives while the rest drains.
SHUTDOWN_ORDER = [
    "gateway",
    POOL_WORKER,
    "pool",
    "intelligence",
    "reconciler",
    "executor",
    DEMO_DOWNSTREAM,
]
# The infrastructure the stack starts itself (unless given external URLs), stopped after
# the services, PostgreSQL last.
NATS = "nats"
POSTGRES = "postgres"
INFRASTRUCTURE_SHUTDOWN_ORDER = [NATS, POSTGRES]
STATE_FILE = "stack.json"


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
    services: tuple[str, ...] = SERVICES
    # Port of the demo downstream (0: do not start it).
    demo_port: int = 8181
    extra_env: dict[str, str] = field(default_factory=dict)
    # Processes per service (default 1): replica 1 is named as the service and listens on
    # its port, replica k > 1 is ``<service>-k`` on a free port. Executor replicas share
    # the durable consumers (they split the work); each gateway serves callers on its own port.
    replicas: dict[str, int] = field(default_factory=dict)
    # Nodes of the embedded NATS (1: one nats-server on nats_port; 3: a JetStream cluster
    # ``nats-0``… on free loopback ports, streams created with that many replicas).
    nats_nodes: int = 1


def replica_names(service: str, count: int) -> list[str]:
    """``["executor", "executor-2", "executor-3"]`` for three executor replicas."""
    return [service, *(f"{service}-{k}" for k in range(2, count + 1))]


def service_specs(options: StackOptions, database_url: str, nats_url: str) -> list[ProcessSpec]:
    common = {
        "DISPO_DATABASE_URL": database_url,
        "DISPO_NATS_URL": nats_url,
        "DISPO_LOG_FORMAT": "json",
        **options.extra_env,
    }
    if options.nats_nodes > 1:  # each stream on every node of the cluster
        common.setdefault("DISPO_STREAM_REPLICAS", str(options.nats_nodes))
    logs = options.data_dir / "logs"
    local_crons = str(options.data_dir / "pool" / "local-crons.sqlite")
    common["DISPO_POOL_LOCAL_REGISTRY"] = local_crons
    specs = []
    if options.demo_port and "executor" in options.services:
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
    for service in options.services:
        for k, name in enumerate(replica_names(service, options.replicas.get(service, 1))):
            port = options.ports[service] if k == 0 else free_port()
            env = {
                **common,
                f"DISPO_{service.upper()}_HOST": options.host,
                f"DISPO_{service.upper()}_PORT": str(port),
            }
            specs.append(
                ProcessSpec(
                    name,
                    python_module(f"dispo.{service}"),
                    env,
                    f"{options.host}:{port}",
                    logs / f"{name}.log",
                    new_session=True,
                )
            )
    if "pool" in options.services:
        env = {
            **common,
            "DISPO_POOL_WORKER_POOL_ADDRESS": f"{options.host}:{options.ports['pool']}",
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


class Stack:
    def __init__(self, options: StackOptions) -> None:
        self.options = options
        self.postgres: EmbeddedPostgres | None = None
        self.nats: NatsServer | None = None
        self.nats_cluster: NatsCluster | None = None
        # Runs the embedded PostgreSQL and nats-server, restarting them like the services.
        self.infrastructure = Supervisor([])
        self.supervisor: Supervisor | None = None

    async def start(self) -> dict[str, str]:
        """Start infrastructure and services; return each service's address once SERVING."""
        data = self.options.data_dir
        data.mkdir(parents=True, exist_ok=True)
        infrastructure = []
        database_url = self.options.database_url
        if database_url is None:
            # Only here: the embedded server comes with the `local` extra, which hosts given
            # an external database (`dispo up --services executor`) need not install.
            from dispo.libs.stack.postgres import EmbeddedPostgres

            self.postgres = EmbeddedPostgres(data / "postgres")
            log_path = data / "logs" / f"{POSTGRES}.log"
            infrastructure.append(await asyncio.to_thread(self.postgres.spec, log_path, POSTGRES))
            database_url = self.postgres.url
        nats_url = self.options.nats_url
        if nats_url is None and self.options.nats_nodes > 1:
            self.nats_cluster = NatsCluster(
                data / "nats", self.options.nats_nodes, data / "logs", name=NATS
            )
            infrastructure += self.nats_cluster.specs()
            nats_url = self.nats_cluster.url
        elif nats_url is None:
            self.nats = NatsServer(
                data / "nats", self.options.nats_port, data / "logs" / f"{NATS}.log"
            )
            infrastructure.append(self.nats.spec(NATS))
            nats_url = self.nats.url
        specs = service_specs(self.options, database_url, nats_url)
        addresses = {spec.name: spec.address for spec in specs if spec.address}

        def write_state() -> None:
            self._write_state(addresses, database_url, nats_url)

        self.infrastructure = Supervisor(infrastructure, on_spawn=write_state)
        await self.infrastructure.start_all()
        if self.nats_cluster is not None:  # JetStream answers once the nodes elect a leader
            await asyncio.to_thread(self.nats_cluster.wait_ready)
        self.supervisor = Supervisor(specs, on_spawn=write_state)
        await self.supervisor.start_all()
        write_state()
        return addresses

    async def watch(self) -> None:
        """Restart any process of the stack that exits, until :meth:`stop`."""
        assert self.supervisor is not None, "start() first"
        await asyncio.gather(self.infrastructure.watch(), self.supervisor.watch())

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
        state = {
            "database_url": database_url,
            "nats_url": nats_url,
            "services": {
                name: {"address": address, "pid": self.supervisor.pid(name)}
                for name, address in addresses.items()
            },
            "companions": {
                name: {"pid": self.supervisor.pid(name)}
                for name in self.supervisor.children
                if name not in addresses
            },
            "infrastructure": {
                name: {"pid": self.infrastructure.pid(name)}
                for name in self.infrastructure.children
            },
        }
        (self.options.data_dir / STATE_FILE).write_text(json.dumps(state, indent=2))

    async def stop(self) -> list[str]:
        """Stop services, then NATS, then PostgreSQL; each runs even if one before failed.

        Returns what failed to stop (empty when everything stopped cleanly)."""
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
        return failed


def read_state(data_dir: Path) -> dict[str, Any] | None:
    path = data_dir / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else None
