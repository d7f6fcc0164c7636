"""The stack as its callers find it: the names of its processes, the order they stop in,
and the state file ``dispo up`` keeps in the data folder (``stack.json``: each service's
address and metrics, the pids, the TLS a caller uses). The ``dispo`` commands that talk to a
running stack read it from here without importing what starts one (:mod:`.stack`).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from dispo.libs.settings import TLSSettings, server_settings
from dispo.libs.tls import ClientTLS
from dispo.tools.stack.ownership import Recorded, recorded, stop_recorded

SERVICES = ("gateway", "executor", "reconciler", "intelligence", "pool")
# Processes that serve the services rather than callers: the pool's local-driver crons,
# and the demo downstream the example catalogue points at.
POOL_WORKER = "pool-worker"
DEMO_DOWNSTREAM = "demo-downstream"
# The web console: people's way in, over the services' APIs (HTTP, not gRPC).
CONSOLE = "console"
# Stop the ways in first so nothing new arrives while the rest drains.
SHUTDOWN_ORDER = [
    CONSOLE,
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
# The OpenClaw gateway the pool's openclaw driver uses, when the stack starts it.
OPENCLAW = "openclaw"
INFRASTRUCTURE_SHUTDOWN_ORDER = [OPENCLAW, NATS, POSTGRES]
STOP_ORDER = SHUTDOWN_ORDER + INFRASTRUCTURE_SHUTDOWN_ORDER
STATE_FILE = "stack.json"


def metrics_url(host: str, port: int) -> str:
    return f"http://{host}:{port}/metrics"


def stop_stale(data_dir: Path, state: dict[str, Any]) -> list[Recorded]:
    """Stop, in order, what still runs of the stale stack ``state`` describes and remove its
    state file (the caller holds the folder's lock); returns what was stopped."""
    stopped = stop_recorded(state, STOP_ORDER, {POSTGRES: signal.SIGINT})
    (data_dir / STATE_FILE).unlink(missing_ok=True)
    return stopped


def live_processes(state: dict[str, Any]) -> dict[str, int]:
    """The pid of every process ``state`` names that still runs (not another process that
    reused its pid), by name: services, companions and the infrastructure."""
    return {p.name: p.pid for p in recorded(state, STOP_ORDER) if p.alive()}


def metrics_addresses(state: dict[str, Any]) -> dict[str, str]:
    """Where each service ``state`` names serves its metrics, by name (none that serves none)."""
    return {n: info["metrics"] for n, info in state["services"].items() if info.get("metrics")}


def service_metrics(data_dir: Path) -> dict[str, str]:
    """Where each service serves its metrics: from the running stack's state file, else
    from the ``DISPO_<SERVICE>_METRICS_PORT`` settings (none where it is 0)."""
    state = read_state(data_dir)
    if state:
        return metrics_addresses(state)
    found = {n: server_settings(n) for n in SERVICES}
    return {n: metrics_url(s.host, s.metrics_port) for n, s in found.items() if s.metrics_port}


def read_state(data_dir: Path) -> dict[str, Any] | None:
    path = data_dir / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else None


def caller_tls(data_dir: Path) -> ClientTLS | None:
    """The TLS a command-line caller of the stack in ``data_dir`` uses: its own
    ``DISPO_TLS_*`` settings when they name a CA, else the CA and client certificate of the
    stack running there with TLS; None otherwise (the settings' own: plaintext)."""
    settings = TLSSettings()
    if settings.ca_file:
        return settings.client
    tls = (read_state(data_dir) or {}).get("tls")
    if not tls:
        return None
    return ClientTLS(tls["ca_file"], tls["client_cert_file"], tls["client_key_file"])
