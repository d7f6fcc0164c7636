"""Pausing a business (ADR-0109): an operator's pause is a ``business_pauses`` row; every
executor reads the rows on a timer (and the one that took the call at once) and its intake
starts none of a paused business's tasks until the row is gone."""

from __future__ import annotations

from dataclasses import dataclass

from dispo.executor.runner import Executor
from dispo.executor.store import pauses
from dispo.libs.errors import InvalidArgument
from dispo.libs.validation import business_name


@dataclass(frozen=True)
class BusinessState:
    business: str
    weight: int
    paused: pauses.Pause | None
    waiting_here: int


async def read_pauses(ex: Executor) -> list[pauses.Pause]:
    """The pauses as recorded, applied to this executor's intake."""
    async with ex.db.connection() as conn:
        held = await pauses.business_pauses_all(conn)
    ex.intake.set_paused({p.business for p in held})
    return held


# The longest reason a pause keeps.
MAX_REASON = 500


async def pause(ex: Executor, business: str, by: str, reason: str) -> BusinessState:
    business = business_name(business)
    if len(reason) > MAX_REASON:
        raise InvalidArgument("reason", f"at most {MAX_REASON} characters, got {len(reason)}")
    async with ex.db.transaction() as conn:
        await pauses.business_pauses_insert_if_absent_many(
            conn, [business], ex.clock.now(), by, reason
        )
    return await state(ex, business)


async def resume(ex: Executor, business: str) -> BusinessState:
    business = business_name(business)
    async with ex.db.transaction() as conn:
        await pauses.business_pauses_delete_many(conn, [business])
    return await state(ex, business)


async def state(ex: Executor, business: str) -> BusinessState:
    return next(s for s in await states(ex, [business]) if s.business == business)


async def states(ex: Executor, also: list[str] | None = None) -> list[BusinessState]:
    """Every business paused, weighted in the policy, waiting here, or in ``also``."""
    held = {p.business: p for p in await read_pauses(ex)}
    waiting = ex.intake.depths()
    names = set(held) | set(waiting) | set(ex.policy_businesses) | set(also or ())
    return [BusinessState(b, ex.weight(b), held.get(b), waiting.get(b, 0)) for b in sorted(names)]
