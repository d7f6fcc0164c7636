"""The pool's periodic work as small, batch-limited sweeps, each callable once from a test.

- :func:`stuck_sweep`: a cron silent for ``stuck_seconds`` is marked stuck, removed and
  replaced; its evaluation is marked stuck and handed to the replacement.
- :func:`hold_sweep`: an evaluation holding a cron for ``hold_seconds`` is force-released.
- :func:`scale_sweep`: resize within the bounds by the busy ratio / idle surplus rules.

A sweep changes the pool's database and returns; the driver calls that follow (creating
and removing crons) run beside it through the pool's :class:`~dispo.pool.driver_calls.
DriverCalls`, so a slow driver never holds a sweep's cadence (``Pool.settle`` waits for them).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

from dispo.libs import metrics
from dispo.libs.logging import get_logger
from dispo.pool import store
from dispo.pool.domain import AssignmentEnd, CronStatus, EvaluationStatus, plan_resize
from dispo.pool.operations import Pool, new_cron_id

log = get_logger(__name__)


@dataclass
class StuckReport:
    stuck_crons: list[str] = field(default_factory=list)
    stuck_evaluations: list[str] = field(default_factory=list)
    replacements: dict[str, str] = field(default_factory=dict)  # stuck cron -> new cron
    handed_over: dict[str, str] = field(default_factory=dict)  # evaluation -> new cron


async def create_cron(pool: Pool) -> str:
    """A new idle cron: the DB row now (so the drift check never sees it as an orphan), the
    driver's cron beside the caller (:func:`bring_up`)."""
    cron_id = await _cron_row(pool)
    pool.driver_calls.submit("create", cron_id, lambda: bring_up(pool, cron_id))
    return cron_id


async def _cron_row(pool: Pool) -> str:
    cron_id = new_cron_id()
    async with pool.db.transaction() as conn:
        await store.cron_insert(conn, cron_id, pool.clock.now())
    return cron_id


async def bring_up(pool: Pool, cron_id: str) -> None:
    """Create the cron in the driver with the state the database holds by then, and wake it
    when it holds an evaluation or work is waiting (a failure: the drift check recreates it)."""
    state = await pool.cron_driver_state(cron_id)
    if state is None:  # removed meanwhile
        return
    await pool.driver.create(cron_id, state)
    if state.get("status") == "busy" or (await pool.load()).queue_depth:
        await pool.driver.trigger(cron_id)


async def remove_cron(pool: Pool, cron_id: str, expected: CronStatus) -> bool:
    """Delete a cron in the expected status from the DB now, from the driver beside the
    caller (a failure: the drift check removes the orphan)."""
    async with pool.db.transaction() as conn:
        if not await store.cron_delete_if(conn, cron_id, expected):
            return False
    pool.driver_calls.submit("remove", cron_id, lambda: pool.driver.remove(cron_id))
    return True


async def stuck_sweep(pool: Pool, batch: int = 100) -> StuckReport:
    now = pool.clock.now()
    cutoff = now - pool.policy.stuck_after
    report = StuckReport()
    async with pool.db.transaction() as conn:
        for cron in await store.crons_silent_before(conn, cutoff, batch):
            if cron.evaluation_id:  # lock order: the evaluation, then the cron
                await store.evaluation_get(conn, cron.evaluation_id, lock=True)
            if not await store.cron_mark_stuck_if_silent(conn, cron, cutoff):
                continue  # it woke up meanwhile
            report.stuck_crons.append(cron.id)
            metrics.cron_stuck()
            if cron.evaluation_id:
                await store.evaluation_unassign_if(
                    conn, cron.evaluation_id, cron.id, now, EvaluationStatus.STUCK
                )
                await store.assignment_end(
                    conn, cron.id, cron.evaluation_id, AssignmentEnd.STUCK, now
                )
                report.stuck_evaluations.append(cron.evaluation_id)
            log.warning(
                "cron stuck",
                cron_id=cron.id,
                evaluation_id=cron.evaluation_id,
                last_activity=cron.last_activity.isoformat(),
            )
        stuck_left = await store.cron_ids_with_status(conn, CronStatus.STUCK)
    # Remove every stuck cron (also ones a crash left behind) and replace it.
    for cron_id in stuck_left:
        if await remove_cron(pool, cron_id, CronStatus.STUCK):
            report.replacements[cron_id] = await _cron_row(pool)
    if report.replacements:
        async with pool.db.transaction() as conn:
            size = sum((await store.cron_counts(conn)).values())
            await store.resize_record(
                conn, size, size, f"replaced {len(report.replacements)} stuck", now
            )
    # Hand each stuck evaluation to a fresh cron at once; the driver creates the
    # replacements afterwards, each with its state then (busy: woken at once).
    spare = list(report.replacements.values())
    for evaluation_id in report.stuck_evaluations:
        if not spare:
            break
        cron_id = spare.pop(0)
        async with pool.db.transaction() as conn:
            claim = await store.evaluation_claim_top_for_cron(conn, cron_id, now, evaluation_id)
        if claim is not None:
            report.handed_over[evaluation_id] = cron_id
    for cron_id in report.replacements.values():
        pool.driver_calls.submit("create", cron_id, functools.partial(bring_up, pool, cron_id))
    return report


async def hold_sweep(pool: Pool, batch: int = 100) -> list[str]:
    """Force-release evaluations that have held a cron too long; returns their ids."""
    now = pool.clock.now()
    released = []
    async with pool.db.transaction() as conn:
        held = await store.evaluations_held_longer_than(conn, now - pool.policy.hold_limit, batch)
        for evaluation_id, cron_id in held:
            if await store.cron_release_if_holding(
                conn, cron_id, evaluation_id, AssignmentEnd.FORCE_RELEASED, now, touch=False
            ):
                released.append(evaluation_id)
                log.warning(
                    "evaluation force-released", evaluation_id=evaluation_id, cron_id=cron_id
                )
    for _evaluation_id, cron_id in held:
        await pool.write_driver_state(cron_id)
    if released:
        await pool.wake_idle_crons()
    return released


async def scale_sweep(pool: Pool) -> int:
    """Apply one resize decision; returns the change in live crons."""
    now = pool.clock.now()
    async with pool.db.connection() as conn:
        counts = await store.cron_counts(conn)
        lo, hi = await pool.bounds(conn)
    policy = replace(pool.policy, min_size=lo, max_size=hi)
    busy, idle = counts[CronStatus.BUSY], counts[CronStatus.IDLE]
    plan = plan_resize(busy + idle, busy, idle, policy)
    if plan.delta == 0:
        return 0
    changed = 0
    if plan.delta > 0:  # the rows now, the driver's crons beside this sweep
        for _ in range(plan.delta):
            await create_cron(pool)
        changed = plan.delta
    else:
        async with pool.db.connection() as conn:
            victims = await store.crons_idle_for_removal(conn, -plan.delta)
        for cron_id in victims:
            if await remove_cron(pool, cron_id, CronStatus.IDLE):
                changed -= 1
    if changed:
        async with pool.db.transaction() as conn:
            await store.resize_record(conn, busy + idle, busy + idle + changed, plan.reason, now)
        log.info(
            "pool resized", from_size=busy + idle, to_size=busy + idle + changed, reason=plan.reason
        )
    return changed


async def grace_after_restart(pool: Pool) -> int:
    """Called once when the pool service starts: crons could not wake while it was down, so
    their silence is not held against them (a dead worker is still caught 10 minutes later)."""
    async with pool.db.transaction() as conn:
        return await store.crons_touch_all_live(conn, pool.clock.now())
