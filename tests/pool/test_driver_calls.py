"""Slow driver calls do not hold the sweeps: a sweep commits its decision and returns; the
crons' creations and removals follow beside it, a bounded number at once, each within its
deadline. A drift repair is judged by what the driver holds after it. (The openclaw driver
on a stand-in CLI whose calls the test holds.)"""

from __future__ import annotations

import asyncio

import pytest
from dispo.libs.errors import Unavailable
from dispo.libs.repairs import RepairKind
from dispo.pool.domain import CronStatus, PoolPolicy
from dispo.pool.drift import apply_repair
from dispo.pool.driver_calls import DriverCalls
from dispo.pool.drivers.openclaw import OpenClawDriver
from dispo.pool.operations import Pool
from dispo.pool.sweeps import hold_sweep, scale_sweep, stuck_sweep
from support import eventually

from .conftest import add_crons

# A sweep that waited for a held call would never return; this only bounds the test.
HANG = 30.0


def openclaw_pool(db, clock, fake, calls: DriverCalls) -> Pool:
    driver = OpenClawDriver(
        fake.cli(), namespace="t", tick_seconds=3600, command=lambda cron_id: "true"
    )
    pool = Pool(db, driver, clock, PoolPolicy(), driver_calls=calls)
    driver.state_of = pool.cron_driver_state
    return pool


async def test_a_sweep_replacing_crons_through_slow_calls_returns_at_once(
    pool_db, manual_clock, fake_openclaw
):
    pool = openclaw_pool(pool_db, manual_clock, fake_openclaw, DriverCalls(2, 600))
    silent = await add_crons(pool, 7)
    assert len(fake_openclaw.automations()) == 7
    fake_openclaw.behave(hold=["cron add", "cron rm"])  # every creation and removal hangs

    manual_clock.advance(minutes=10)
    report = await asyncio.wait_for(stuck_sweep(pool), HANG)
    assert sorted(report.stuck_crons) == sorted(silent) and len(report.replacements) == 7
    # The other sweeps are not held either.
    assert await asyncio.wait_for(hold_sweep(pool), HANG) == []
    assert await asyncio.wait_for(scale_sweep(pool), HANG) == 0
    crons = await pool.crons()
    assert {c.id for c in crons} == set(report.replacements.values())
    assert {c.status for c in crons} == {CronStatus.IDLE}

    # Two calls at once, the rest wait their turn.
    await eventually(lambda: len(fake_openclaw.in_flight()) == 2)
    assert pool.driver_calls.in_flight == 14
    fake_openclaw.release()
    await pool.settle()
    assert sorted(k.rsplit(":", 1)[1] for k in fake_openclaw.automations()) == sorted(
        report.replacements.values()
    )
    assert fake_openclaw.in_flight() == []


async def test_a_driver_call_past_its_deadline_is_abandoned(pool_db, manual_clock, fake_openclaw):
    pool = openclaw_pool(pool_db, manual_clock, fake_openclaw, DriverCalls(4, 0.5))
    fake_openclaw.behave(hold=["cron add"])  # and never released
    [cron] = await add_crons(pool, 1)  # returns once the call is abandoned
    assert fake_openclaw.in_flight() == []  # its CLI process ended with it
    assert fake_openclaw.automations() == {}  # left to the drift check
    assert [c.id for c in await pool.crons()] == [cron]


async def test_a_repair_is_what_the_driver_holds_after_it_not_its_calls_deadline(
    pool_db, manual_clock, fake_openclaw
):
    """OpenClaw creates the automation but the CLI call overruns its timeout: the repair is
    applied (read back). One it never creates is refused UNAVAILABLE, and the next try does it."""
    driver = OpenClawDriver(
        fake_openclaw.cli(timeout=1), namespace="t", tick_seconds=3600, command=lambda c: "true"
    )
    pool = Pool(pool_db, driver, manual_clock, PoolPolicy(), driver_calls=DriverCalls(4, 600))
    driver.state_of = pool.cron_driver_state
    fake_openclaw.behave(skip=["cron add"])  # the crons' creation never reaches OpenClaw
    late, lost = await add_crons(pool, 2)
    assert fake_openclaw.automations() == {}

    fake_openclaw.behave(hold=["cron add"], apply_then_hold=True)  # created, then the CLI hangs
    applied, detail = await apply_repair(pool, RepairKind.RECREATE_MISSING, late, time_left=30)
    assert applied and "read back" in detail and "took over 1 s" in detail
    assert set(fake_openclaw.automations()) == {f"dispo-pool:t:{late}"}

    fake_openclaw.behave(hold=["cron add"], skip=["cron add"])  # hangs, creates nothing
    with pytest.raises(Unavailable) as refused:
        await apply_repair(pool, RepairKind.RECREATE_MISSING, lost, time_left=30)
    assert "not in the driver when read back" in refused.value.message
    fake_openclaw.release()
    fake_openclaw.behave()  # OpenClaw answers again: the next check's repair does it
    applied, detail = await apply_repair(pool, RepairKind.RECREATE_MISSING, lost, time_left=30)
    assert applied and detail == "recreated in the driver (read back)"
    assert set(fake_openclaw.automations()) == {f"dispo-pool:t:{late}", f"dispo-pool:t:{lost}"}
    await pool.settle()
    fake_openclaw.release()
