"""What the reconciler's drift check sees of the pool, and the repairs it may ask for.

The reconciler never reads the pool's tables: it gets :func:`drift_view` over gRPC,
decides, and calls :func:`apply_repair`, which re-checks the drift under the pool's own
guards before changing anything (a drift that has gone away is reported as not applied).

A repair of the driver is judged by what the driver holds after it, read back, not by its
call: a call that failed or overran whose effect is there is applied; one whose effect is
missing is ``UNAVAILABLE`` (recorded failed; the next check plans it again). The call runs
beside the request (the pool's driver calls) and is waited for at most half the time the
caller has left, the other half being the read-back's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from dispo.libs.errors import InvalidArgument, Unavailable
from dispo.libs.logging import get_logger
from dispo.libs.repairs import RepairKind
from dispo.pool import store
from dispo.pool.domain import (
    TERMINAL,
    AssignmentEnd,
    Cron,
    CronStatus,
    DriverCron,
    EvaluationStatus,
)
from dispo.pool.operations import Pool

log = get_logger(__name__)


@dataclass(frozen=True)
class DriftView:
    driver: str
    db_crons: list[Cron]
    driver_crons: list[DriverCron]
    evaluations: list[tuple[str, str, str | None]]  # id, status, assigned cron
    observed_at: datetime


async def drift_view(pool: Pool) -> DriftView:
    await pool.driver.drain()  # state writes still in flight would look like drift
    driver_crons = await pool.driver.list()
    async with pool.db.connection() as conn:
        crons = await store.crons_list(conn)
        evaluations = await store.evaluations_assigned_or_named(conn)
    return DriftView(pool.driver.name, crons, driver_crons, evaluations, pool.clock.now())


async def _driver_repair(
    pool: Pool,
    what: str,
    cron_id: str,
    call: Callable[[], Awaitable[object]],
    holds: Callable[[DriverCron | None], bool],
    time_left: float | None,
) -> BaseException | None:
    """Run ``call`` (beside the request) and read the cron back; returns what the call
    failed with, if anything, when ``holds(read back)``, else raises ``Unavailable``."""
    task = pool.driver_calls.submit(what, cron_id, call)
    wait = pool.driver_calls.deadline if time_left is None else time_left / 2
    finished, _ = await asyncio.wait([task], timeout=wait)
    failed = task.result() if finished else None
    try:
        found = await pool.driver.find(cron_id)
    except Exception as error:
        raise Unavailable(
            f"{what} of cron {cron_id}: cannot read the driver back ({error}); the next"
            " check looks again"
        ) from None
    if holds(found):
        return failed
    how = f"its call failed: {_said(failed)}" if failed else "its call is still running"
    if finished and failed is None:
        how = "its call succeeded"
    raise Unavailable(
        f"{what} of cron {cron_id}: not in the driver when read back ({how}); the next check"
        " tries again"
    )


def _said(error: BaseException) -> str:
    return str(error) or type(error).__name__


def _read_back(failed: BaseException | None) -> str:
    return f" (read back; its call failed: {_said(failed)})" if failed else " (read back)"


async def apply_repair(
    pool: Pool,
    kind: RepairKind,
    cron_id: str,
    evaluation_id: str = "",
    time_left: float | None = None,
) -> tuple[bool, str]:
    """``time_left``: seconds the caller still waits (None: no deadline)."""
    if not cron_id:
        raise InvalidArgument("cron_id", "required")
    now = pool.clock.now()
    await pool.driver.drain()
    found = await pool.driver.find(cron_id)  # one cron, not the whole listing
    async with pool.db.connection() as conn:
        cron = await store.cron_get(conn, cron_id)
    if kind is RepairKind.REMOVE_ORPHAN:
        if cron is not None or found is None:
            return False, "not an orphan any more"
        failed = await _driver_repair(
            pool,
            "removal",
            cron_id,
            lambda: pool.driver.remove(cron_id),
            lambda back: back is None,
            time_left,
        )
        return True, "removed from the driver" + _read_back(failed)
    if cron is None:
        return False, "the pool has no such cron"
    state = cron.driver_state()
    if kind is RepairKind.RECREATE_MISSING:
        if found is not None or cron.status is CronStatus.STUCK:
            return False, "the driver has it (or it is being replaced)"
        failed = await _driver_repair(
            pool,
            "re-creation",
            cron_id,
            lambda: pool.driver.create(cron_id, state),
            lambda back: back is not None,
            time_left,
        )
        if failed is not None:  # there, maybe without its state: written after it
            await pool.write_driver_state(cron_id)
        return True, "recreated in the driver" + _read_back(failed)
    if kind is RepairKind.REWRITE_STATE:
        if found is None or found.state == state:
            return False, "states agree"

        async def rewrite() -> None:
            await pool.driver.write_state(cron_id, state)
            await pool.driver.drain()

        failed = await _driver_repair(
            pool,
            "state rewrite",
            cron_id,
            rewrite,
            lambda back: back is not None and back.state == state,
            time_left,
        )
        return True, f"driver state set to {state}" + _read_back(failed)
    if not evaluation_id:
        raise InvalidArgument("evaluation_id", "required for this repair")
    async with pool.db.transaction() as conn:
        ev = await store.evaluation_get(conn, evaluation_id, lock=True)
        if ev is None:
            return False, "no such evaluation"
        if kind is RepairKind.RELEASE_FINISHED:
            if not (
                cron.status is CronStatus.BUSY
                and cron.evaluation_id == ev.id
                and ev.status in TERMINAL
            ):
                return False, "the cron no longer holds a finished evaluation"
            applied = await store.cron_release_if_holding(
                conn, cron_id, ev.id, AssignmentEnd.DRIFT, now, touch=False
            )
            detail = f"cron released from {ev.status.value} evaluation"
        elif kind is RepairKind.REQUEUE_EVALUATION:
            state = found.state if found is not None else {}
            cron_holds = cron.status is CronStatus.BUSY and cron.evaluation_id == ev.id
            driver_holds = state.get("status") == "busy" and state.get("eval_id") == ev.id
            if ev.assigned_cron_id != cron_id or (cron_holds and driver_holds):
                return False, "the assignment is consistent"
            if cron_holds:
                applied = await store.cron_release_if_holding(
                    conn, cron_id, ev.id, AssignmentEnd.DRIFT, now, touch=False
                )
            else:
                applied = await store.evaluation_unassign_if(conn, ev.id, cron_id, now)
                await store.assignment_end(conn, cron_id, ev.id, AssignmentEnd.DRIFT, now)
            detail = "evaluation back in the queue"
        else:
            raise InvalidArgument("kind", f"unknown repair {kind!r}")
    if applied:
        await pool.write_driver_state(cron_id)
        if ev.status is EvaluationStatus.EXECUTING:
            await pool.wake_idle_crons()
        log.info("drift repaired", kind=kind.value, cron_id=cron_id, evaluation_id=evaluation_id)
    return applied, detail if applied else "changed concurrently"
