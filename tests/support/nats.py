"""A NATS server of a test's own, started with settings the shared one does not have, and
protected as every server of the platform is (its own users, no anonymous client)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dispo.tools.stack.nats import NatsServer
from dispo.tools.stack.nats_auth import NatsUsers


@contextmanager
def nats_with_max_payload(folder: Path, max_payload: int) -> Iterator[NatsServer]:
    """A JetStream server in ``folder`` whose largest message is ``max_payload`` bytes
    (connect as ``server.credentials()``)."""
    server = NatsServer(
        folder / "store",
        log_file=folder / "nats.log",
        users=NatsUsers.kept(folder / "users.json"),
        config=f"max_payload: {max_payload}",
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
