"""A NATS JetStream cluster on loopback: ``size`` nodes of the ``nats-server`` binary, routed
to each other, each keeping its own store.

    cluster = NatsCluster(Path("data/nats"), users, size=3, log_dir=Path("data/logs"))
    servers = cluster.start()        # "nats://127.0.0.1:p1,nats://127.0.0.1:p2,…" once JetStream answers
    cluster.nodes[0].stop(kill=True)  # SIGKILL one node; the others keep a quorum
    cluster.nodes[0].start()          # back with the same ports and store

Streams on it are replicated when created with ``num_replicas`` > 1 (``DISPO_STREAM_REPLICAS``);
a node is ready once its ``/healthz`` (monitoring port) says JetStream has a meta leader.
Every node takes the same ``users`` (:class:`~dispo.tools.stack.nats_auth.NatsUsers`) alone.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from dispo.libs.bus import BusCredentials
from dispo.libs.process import ProcessSpec, free_port
from dispo.tools.stack.nats import NatsServer
from dispo.tools.stack.nats_auth import ADMIN, NatsUsers


class NatsCluster:
    def __init__(
        self,
        root: Path,
        users: NatsUsers,
        size: int = 3,
        log_dir: Path | None = None,
        name: str = "dispo",
    ) -> None:
        self.root = Path(root)
        self.users = users
        self.size = size
        route_ports = [free_port() for _ in range(size)]
        self.monitor_ports = [free_port() for _ in range(size)]
        routes = ",".join(f"nats://127.0.0.1:{port}" for port in route_ports)
        # Server names, as JetStream reports a stream's leader; also the processes' names.
        self.names = [f"{name}-{i}" for i in range(size)]
        self.nodes = [
            NatsServer(
                self.root / f"node-{i}",
                log_file=log_dir / f"nats-{i}.log" if log_dir else None,
                args=[
                    "--name",
                    self.names[i],
                    "--cluster_name",
                    name,
                    "--cluster",
                    f"nats://127.0.0.1:{route_ports[i]}",
                    "--routes",
                    routes,
                    "-m",
                    str(self.monitor_ports[i]),
                ],
                users=users,
            )
            for i in range(size)
        ]

    def credentials(self, user: str = ADMIN) -> BusCredentials:
        return self.users.credentials(user)

    def node(self, name: str) -> NatsServer:
        """The node with this server name (as JetStream reports a stream's leader)."""
        return self.nodes[self.names.index(name)]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    @property
    def url(self) -> str:
        """Every node's URL, comma-separated (the form ``DISPO_NATS_URL`` takes)."""
        return ",".join(self.urls)

    def specs(self) -> list[ProcessSpec]:
        """The nodes as processes a :class:`~dispo.tools.stack.supervisor.Supervisor` runs
        (and restarts), named as the servers; call :meth:`wait_ready` once they run."""
        return [node.spec(name) for node, name in zip(self.nodes, self.names, strict=True)]

    def start(self, timeout: float = 60.0) -> str:
        """Start every node not running and wait until each one's JetStream is ready."""
        for node in self.nodes:
            if not node.running():
                node.start()
        self.wait_ready(timeout)
        return self.url

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every node answers ``/healthz`` with 200 (JetStream has a meta leader and
        its streams are current)."""
        deadline = time.monotonic() + timeout
        pending = list(range(self.size))
        with httpx.Client(timeout=1.0) as client:
            while pending:
                i = pending[0]
                try:
                    ready = (
                        client.get(f"http://127.0.0.1:{self.monitor_ports[i]}/healthz").status_code
                        == 200
                    )
                except httpx.HTTPError:
                    ready = False
                if ready:
                    pending.pop(0)
                    continue
                if time.monotonic() > deadline:
                    raise TimeoutError(f"NATS node {i} not ready after {timeout}s")
                time.sleep(0.1)

    def stop(self, kill: bool = False) -> None:
        for node in self.nodes:
            node.stop(kill=kill)
