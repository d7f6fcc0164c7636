"""The periodic sweeps, each a small batch-limited function callable once (from a test or
the RunSweep RPC), and each run as its own periodic part on the injectable clock."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from dispo.libs.errors import InvalidArgument
from dispo.libs.periodic import Pause, Periodic
from dispo.reconciler.arbitration.arbiter import arbitrate_sweep
from dispo.reconciler.arbitration.compensation import compensate_sweep
from dispo.reconciler.completion.facts import notify_sweep, reconcile_sweep
from dispo.reconciler.context import Context
from dispo.reconciler.recovery.age_limits import expire_sweep
from dispo.reconciler.recovery.redrive import redrive_sweep
from dispo.reconciler.recovery.release import health_sweep, release_sweep
from dispo.reconciler.recovery.settlement import settle_sweep

SWEEPS: dict[str, Callable[[Context], Awaitable[int]]] = {
    "arbitrate": arbitrate_sweep,
    "compensate": compensate_sweep,
    "settle": settle_sweep,
    "redrive": redrive_sweep,
    "health": health_sweep,
    "release": release_sweep,
    "notify": notify_sweep,
    "reconcile": reconcile_sweep,
    "expire": expire_sweep,
}
# Follower -> leader: the follower works on what the leader leaves behind (a settled task is
# redriven, a healthy downstream released, a verdict's losers compensated), so it is kicked
# after every pass of its leader instead of waiting for its own next interval.
FOLLOWS: dict[str, str] = {"compensate": "arbitrate", "redrive": "settle", "release": "health"}
# Sweeps whose work comes at the rate tasks finish (one row per finished task): a pass that
# took a full batch runs again at once, so a backlog drains at the sweep's own pace, not one
# batch per interval. (The notify sweep's deliveries run on their own: one that ends while
# more are due asks for the next pass itself.)
DRAINED = frozenset({"reconcile"})


async def run_sweeps(ctx: Context, name: str = "all") -> dict[str, int]:
    if name != "all" and name not in SWEEPS:
        raise InvalidArgument("sweep", f"one of {', '.join(SWEEPS)} or all")
    names = list(SWEEPS) if name == "all" else [name]
    done = {n: await SWEEPS[n](ctx) for n in names}
    await ctx.deliveries.drain()  # a pass run by hand answers once its deliveries ended
    return done


def sweep_parts(ctx: Context, interval: float) -> dict[str, Periodic]:
    """Every sweep as its own periodic part (``sweep <name>``) on the context's clock, so a
    slow or blocked sweep holds up no other. A sweep that follows another also runs right
    after each pass of it (see :data:`FOLLOWS`), as one round used to run them in order; a
    drained sweep (:data:`DRAINED`) runs again at once after a full batch. The context's
    ``kick_sweep`` runs one of these parts now."""
    parts: dict[str, Periodic] = {}

    def one_pass(name: str) -> Callable[[], Awaitable[Pause | None]]:
        async def run() -> Pause | None:
            try:
                done = await SWEEPS[name](ctx)
            finally:
                for follower, leader in FOLLOWS.items():
                    if leader == name:
                        parts[follower].kick()
            return Pause(0) if name in DRAINED and done >= ctx.settings.batch else None

        return run

    for name in SWEEPS:
        parts[name] = Periodic(f"sweep {name}", one_pass(name), interval, ctx.clock)
    ctx.kick_sweep = lambda name: parts[name].kick()
    return parts
