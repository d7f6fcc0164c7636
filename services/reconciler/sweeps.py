"""The periodic sweeps, each a small batch-limited function callable once (from a test or
the RunSweep RPC), and the loop that runs them all on the injectable clock."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from dispo.libs.clock import sleep_until_stopped
from dispo.libs.errors import InvalidArgument
from dispo.libs.logging import get_logger
from dispo.reconciler.arbitration import arbitrate_sweep
from dispo.reconciler.compensation import compensate_sweep
from dispo.reconciler.completion import notify_sweep, reconcile_sweep
from dispo.reconciler.context import Context
from dispo.reconciler.recovery import redrive_sweep
from dispo.reconciler.release import health_sweep, release_sweep
from dispo.reconciler.settlement import settle_sweep

log = get_logger(__name__)

# In the order one round runs them: settlement before redrive, health before release.
SWEEPS: dict[str, Callable[[Context], Awaitable[int]]] = {
    "arbitrate": arbitrate_sweep,
    "compensate": compensate_sweep,
    "settle": settle_sweep,
    "redrive": redrive_sweep,
    "health": health_sweep,
    "release": release_sweep,
    "notify": notify_sweep,
    "reconcile": reconcile_sweep,
}


async def run_sweeps(ctx: Context, name: str = "all") -> dict[str, int]:
    if name != "all" and name not in SWEEPS:
        raise InvalidArgument("sweep", f"one of {', '.join(SWEEPS)} or all")
    names = list(SWEEPS) if name == "all" else [name]
    return {n: await SWEEPS[n](ctx) for n in names}


class SweepLoop:
    """Runs every sweep once per ``interval`` of the context's clock until stopped."""

    def __init__(self, ctx: Context, interval: float) -> None:
        self.ctx = ctx
        self.interval = interval
        self._stopping = asyncio.Event()

    async def run(self) -> None:
        while not self._stopping.is_set():
            for name, sweep in SWEEPS.items():
                try:
                    await sweep(self.ctx)
                except Exception:  # PostgreSQL or NATS down: the next round tries again
                    log.exception("sweep failed", sweep=name)
            await sleep_until_stopped(self.ctx.clock, self.interval, self._stopping)

    def stop(self) -> None:
        self._stopping.set()
