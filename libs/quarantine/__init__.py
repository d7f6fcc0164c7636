"""Poison containment: the messages a service's consumers give up on, kept in the service's
own schema and acted on over gRPC.

    quarantine = Quarantine(db, bus, clock, RetryBound(max_failures=5))  # rt.db
    consumer = bus.consumer(STREAM, durable=name, subject=s, handler=quarantine.wrap(handle))
    server: add_to_server(quarantine.servicer, server)   # dispo.quarantine.v1.QuarantineService

:mod:`.guard` bounds a message's failures (backoff between them) and writes it to the
quarantine when they run out; :mod:`.store` is the table and its statements (on the service's
:class:`~dispo.libs.db.driver.Database`); :mod:`.servicer` the gRPC API;
:mod:`.schema` the DDL a service's migration runs. ``dispo.libs.service.Runtime.consumer``
wires all of it for a service.
"""

from __future__ import annotations

from dispo.libs.bus import Bus, Handler
from dispo.libs.clock import Clock
from dispo.libs.db.driver import Database
from dispo.libs.quarantine.guard import Guard, RetryBound
from dispo.libs.quarantine.servicer import SERVICE_NAME, QuarantineServicer, add_to_server
from dispo.libs.quarantine.store import Held, Poisoned, QuarantineStore


class Quarantine:
    """One service's quarantine: its store, the guard its consumers share, its servicer."""

    def __init__(
        self,
        db: Database,
        bus: Bus,
        clock: Clock,
        bound: RetryBound,
        service: str | None = None,
    ) -> None:
        self.store = QuarantineStore(db, clock)
        self.guard = Guard(self.store, bound)
        # Replays publish as ``service``'s bus user (None: one allowed every subject).
        self.servicer = QuarantineServicer(self.store, bus, service)

    def wrap(self, handler: Handler) -> Handler:
        return self.guard.wrap(handler)


__all__ = [
    "SERVICE_NAME",
    "Guard",
    "Held",
    "Poisoned",
    "Quarantine",
    "QuarantineServicer",
    "QuarantineStore",
    "RetryBound",
    "add_to_server",
]
