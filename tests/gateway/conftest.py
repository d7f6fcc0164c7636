"""The gateway's use cases in the test's process, on the real database and bus."""

from __future__ import annotations

import pytest
from dispo.gateway import store
from dispo.gateway.expand import Limits
from dispo.gateway.operations import Gateway
from dispo.libs.catalogue import load_catalogue
from dispo.libs.clock import SystemClock
from dispo.libs.outbox import OutboxRelay


@pytest.fixture
async def make_gateway(service_db, bus, catalogue_file):
    db = await service_db("gateway")
    catalogue = load_catalogue(catalogue_file)

    def make(
        watch_poll_interval: float = 0.5, relay_options=None, clock=None, **options
    ) -> Gateway:
        # Kicked, not run (unless the test runs it): rows stay unsent. The relay runs on the
        # gateway's clock, as the service's does.
        clock = clock or SystemClock()
        relay = OutboxRelay(db, store.outbox, bus, clock=clock, **(relay_options or {}))
        return Gateway(db, relay, catalogue, Limits(), clock, watch_poll_interval, **options)

    return make
