"""The driver port: where crons actually live (local worker registry or OpenClaw)."""

from __future__ import annotations

import json
from typing import Protocol

from dispo.pool.domain import DriverCron

# OpenClaw keeps at most 16 KB of custom JSON state per cron; every driver enforces it.
MAX_STATE_BYTES = 16 * 1024


class DriverError(Exception):
    """The driver refused or failed; the pool's DB stays the authority and drift repairs the rest."""


def encode_state(state: dict) -> str:
    raw = json.dumps(state, separators=(",", ":"), sort_keys=True)
    if len(raw.encode()) > MAX_STATE_BYTES:
        raise DriverError(
            f"cron state is {len(raw.encode())} bytes; the limit is {MAX_STATE_BYTES}"
        )
    return raw


class Driver(Protocol):
    name: str

    async def create(self, cron_id: str, state: dict) -> None:
        """Create a cron waking every tick with ``state``; an existing one is left as is."""
        ...

    async def remove(self, cron_id: str) -> None:
        """Remove a cron; removing an absent cron is not an error."""
        ...

    async def list(self) -> list[DriverCron]: ...

    async def find(self, cron_id: str) -> DriverCron | None:
        """The one cron as :meth:`list` would have it (None: the driver has no live one)."""
        ...

    async def write_state(self, cron_id: str, state: dict) -> None: ...

    async def trigger(self, cron_id: str) -> None:
        """Wake the cron now instead of at its next tick."""
        ...

    async def drain(self) -> None:
        """Until the state writes and wake-ups asked for so far are done (a driver may run
        them in the background)."""
        ...
