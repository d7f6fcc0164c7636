"""Demoted work: probe the health of downstreams that have demoted tasks waiting, and
release those tasks back to task.create once their downstreams are healthy and not
paused — oldest first, at most ``rate_per_second`` per downstream (a token bucket
holding at most ``burst``), so the recovery does not knock the downstream over again.
"""

from __future__ import annotations

import asyncio
import math
from datetime import datetime

from dispo.libs.contracts.tasks import blocker_queue
from dispo.libs.downstream_health import check_health
from dispo.libs.errors import InvalidArgument, NotFound
from dispo.libs.logging import get_logger
from dispo.reconciler.context import Context
from dispo.reconciler.recovery import store
from dispo.reconciler.recovery.redrive import redrive_row

log = get_logger(__name__)


async def health_sweep(ctx: Context) -> int:
    """Probe everything demoted tasks wait for: a downstream at its health URL, and not
    while the executor's breaker holds it OPEN (ADR-0115: a release would be demoted again
    at once and spend a redrive), a worker queue by asking the executor whether it has a
    live worker (ADR-0101); returns how many were probed."""
    async with ctx.db.connection() as conn:
        names = await store.downstreams_demoted(conn)
    queues = [(n, q) for n in names if (q := blocker_queue(n)) is not None]
    downstreams = [n for n in names if blocker_queue(n) is None]
    results = await asyncio.gather(
        *(
            check_health(
                ctx.http,
                ctx.config.downstreams[n].health_url if n in ctx.config.downstreams else "",
                ctx.settings.http_timeout_seconds,
            )
            for n in downstreams
        )
    )
    executor = ctx.executor_health
    if executor is not None and any(healthy for healthy, _ in results):
        results = held_by_breakers(downstreams, results, await executor.open_breakers())
    checked = list(zip(downstreams, results, strict=True))
    if queues:
        if executor is None:
            answers = [(False, "the reconciler has no executor address")] * len(queues)
        else:
            answers = await executor.check([q for _, q in queues])
        checked += list(zip([n for n, _ in queues], answers, strict=True))
    now = ctx.clock.now()
    async with ctx.db.transaction() as conn:
        for name, (healthy, error) in checked:
            if await store.downstream_record_probe(conn, name, healthy, error, now):
                log.info("downstream health changed", downstream=name, healthy=healthy, error=error)
    return len(names)


def held_by_breakers(
    downstreams: list[str],
    results: list[tuple[bool, str]],
    open_breakers: dict[str, datetime | None],
) -> list[tuple[bool, str]]:
    """Each downstream's ``(healthy, why not)`` from its health URL, unhealthy while the
    executor's breaker holds it OPEN (``open_breakers``: name → end of its cooldown)."""
    held: list[tuple[bool, str]] = []
    for name, (healthy, error) in zip(downstreams, results, strict=True):
        if healthy and name in open_breakers:
            until = open_breakers[name]
            when = f" until {until.isoformat()}" if until is not None else ""
            held.append((False, f"the executor's breaker is open{when}"))
        else:
            held.append((healthy, error))
    return held


async def release_sweep(ctx: Context) -> int:
    """Release demoted tasks of healthy, unpaused downstreams within their rate."""
    now = ctx.clock.now()
    released = 0
    async with ctx.db.connection() as conn:
        names = await store.downstreams_demoted(conn)
    for name in names:
        async with ctx.db.transaction() as conn:
            state = await store.downstream_get(conn, name, for_update=True)
            if state.healthy is not True or state.paused:
                continue
            rate = ctx.config.release_rate(name)
            tokens = rate.refill(state.tokens, state.tokens_at, now)
            allowed = min(ctx.settings.batch, math.floor(tokens + 1e-9))
            rows = await store.tasks_releasable(conn, name, allowed) if allowed > 0 else []
            for row in rows:
                if await redrive_row(ctx, conn, row, "release", now, downstream=name):
                    tokens -= 1
                    released += 1
            await store.downstream_set_tokens(conn, name, max(0.0, tokens), now)
    if released:
        ctx.kick()
    return released


def _name(ctx: Context, name: str) -> str:
    if not name.strip():
        raise InvalidArgument("name", "required: the downstream's name")
    if name.strip() not in ctx.config.downstreams and not blocker_queue(name.strip()):
        raise NotFound(
            f"downstream {name.strip()!r} is not in the registry ({', '.join(sorted(ctx.config.downstreams))})"
        )
    return name.strip()


async def pause(ctx: Context, name: str, actor: str, reason: str) -> None:
    async with ctx.db.transaction() as conn:
        await store.downstream_set_paused(conn, _name(ctx, name), True, actor, reason)
    log.info("downstream paused", downstream=name, actor=actor, reason=reason)


async def resume(ctx: Context, name: str, actor: str) -> None:
    async with ctx.db.transaction() as conn:
        await store.downstream_set_paused(conn, _name(ctx, name), False, actor, "")
    log.info("downstream resumed", downstream=name, actor=actor)
