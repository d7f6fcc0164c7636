"""A NATS server of a test's own, started with settings the shared one does not have."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dispo.libs.stack.nats import NatsServer


@contextmanager
def nats_with_max_payload(folder: Path, max_payload: int) -> Iterator[NatsServer]:
    """A JetStream server in ``folder`` whose largest message is ``max_payload`` bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "nats.conf"
    config.write_text(f"max_payload: {max_payload}\n")
    server = NatsServer(folder / "store", log_file=folder / "nats.log", args=["-c", str(config)])
    server.start()
    try:
        yield server
    finally:
        server.stop()
