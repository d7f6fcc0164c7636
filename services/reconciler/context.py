"""What every part of the reconciler works with: the driver port its stores run on, clock,
policies, HTTP client, bus (for NATS callbacks), the outbox relay to kick after a commit,
its service token, the signing key of webhook callbacks and the executor's outputs (a
callback's result)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import httpx
from dispo.auth.signing import SigningKey
from dispo.libs.bus import Bus
from dispo.libs.clock import Clock
from dispo.libs.db.driver import Database
from dispo.libs.egress import AllowList
from dispo.libs.outbox import OutboxRelay
from dispo.libs.outputs import OutputsReader
from dispo.libs.settings import DEMO_DOWNSTREAM_ORIGIN
from dispo.reconciler.completion.in_flight import InFlight
from dispo.reconciler.executor_health import ExecutorHealth
from dispo.reconciler.probes import WorkerProber
from dispo.reconciler.settings import ReconcilerSettings, RecoveryConfig
from sqlalchemy.ext.asyncio import AsyncEngine


@dataclass
class Context:
    # SQLAlchemy: only the reads of the auth context's signing secrets (dispo.auth.store).
    engine: AsyncEngine
    db: Database  # the driver port: every statement of the reconciler's stores
    clock: Clock
    config: RecoveryConfig
    settings: ReconcilerSettings
    http: httpx.AsyncClient
    relay: OutboxRelay | None = None
    bus: Bus | None = None
    rng: random.Random = field(default_factory=random.Random)
    # Where callbacks may go (DISPO_EGRESS_ALLOW), checked again before each delivery.
    egress: AllowList = field(default_factory=lambda: AllowList.parse(DEMO_DOWNSTREAM_ORIGIN))
    # The reconciler's own token, on its calls to the gateway (DISPO_SERVICE_TOKEN).
    service_token: str = ""
    # What webhook callbacks' signing secrets are derived with (DISPO_SIGNING_KEY); None:
    # webhooks are not sent (never unsigned).
    signing_key: SigningKey | None = None
    # Where a SUCCEEDED task's result is read for its callback (ExecutorService.GetOutputs);
    # None: only a task without outputs can be notified of its success.
    outputs: OutputsReader | None = None
    # What the executor says of what demoted work waits for: whether a worker queue has a
    # live worker (ListQueues; None: such work is not released) and which downstreams its
    # breaker holds OPEN (ListDownstreams; None: the health URL alone decides).
    executor_health: ExecutorHealth | None = None
    # Where UNKNOWN worker nodes are probed (ExecutorService.ProbeWorkerNode, ADR-0100);
    # None: they are not (an operator decides).
    worker_probes: WorkerProber | None = None
    # Runs a sweep now rather than at its next interval (set by the sweeps' parts when they
    # run as such; a no-op otherwise, where sweeps are run by hand).
    kick_sweep: Callable[[str], None] = lambda name: None
    # The callback deliveries under way (the notify sweep starts them; each ends alone).
    deliveries: InFlight = field(default_factory=InFlight)

    def call_lease(self, now: datetime) -> datetime:
        """Until when a sweep holds the rows it claimed while it calls out for them (two
        HTTP timeouts and a margin); after that another replica may claim them again."""
        return now + timedelta(seconds=self.settings.http_timeout_seconds * 2 + 5)

    def kick(self) -> None:
        """Publish what was just committed to the outbox without waiting for the next poll."""
        if self.relay is not None:
            self.relay.kick()
