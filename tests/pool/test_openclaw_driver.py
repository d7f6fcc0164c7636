"""The OpenClaw driver against the fake `openclaw` executable (SQLite state, 16 KB limit)."""

from __future__ import annotations

import json
import subprocess

import pytest

from dispo.pool.domain import PoolPolicy
from dispo.pool.drivers import DriverError
from dispo.pool.drivers.openclaw import OpenClawDriver
from dispo.pool.operations import Pool
from dispo.pool.sweeps import scale_sweep

from .conftest import FAKE_OPENCLAW, evaluation


@pytest.fixture
def fake_db(tmp_path, monkeypatch):
    path = tmp_path / "openclaw.sqlite"
    monkeypatch.setenv("OPENCLAW_FAKE_DB", str(path))
    return path


@pytest.fixture
def driver(fake_db) -> OpenClawDriver:
    return OpenClawDriver(str(FAKE_OPENCLAW), tick_seconds=60)


async def test_driver_creates_lists_updates_triggers_and_removes(driver, fake_db):
    await driver.create("cron-a", {"status": "idle", "eval_id": ""})
    await driver.create("cron-a", {"status": "idle", "eval_id": ""})  # exists: left as is
    await driver.write_state("cron-a", {"status": "busy", "eval_id": "ev-1"})
    await driver.trigger("cron-a")
    [cron] = await driver.list()
    assert (cron.id, cron.state) == ("cron-a", {"status": "busy", "eval_id": "ev-1"})
    listed = json.loads(subprocess.run([str(FAKE_OPENCLAW), "automations", "list", "--json"],
                                       capture_output=True, check=True).stdout)
    assert listed[0]["runs"] == 1 and listed[0]["every"] == "60s"
    await driver.remove("cron-a")
    await driver.remove("cron-a")  # absent: not an error
    assert await driver.list() == []
    with pytest.raises(DriverError):
        await driver.trigger("cron-a")


async def test_state_over_16_kb_is_refused_by_openclaw_and_by_the_driver(driver, fake_db):
    await driver.create("cron-b", {"status": "idle", "eval_id": ""})
    big = json.dumps({"status": "busy", "blob": "x" * 16_400})
    refused = subprocess.run([str(FAKE_OPENCLAW), "automations", "state", "set", "cron-b", big],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "at most 16384" in refused.stderr
    with pytest.raises(DriverError):
        await driver.write_state("cron-b", {"status": "busy", "blob": "x" * 16_400})
    [cron] = await driver.list()
    assert cron.state == {"status": "idle", "eval_id": ""}


async def test_pool_on_openclaw_scales_and_keeps_cron_state_small(pool_engine, manual_clock, driver):
    pool = Pool(pool_engine, driver, manual_clock, PoolPolicy())
    assert await scale_sweep(pool) == 5
    crons = await driver.list()
    assert len(crons) == 5 and all(c.state == {"status": "idle", "eval_id": ""} for c in crons)
    await pool.create_evaluation(evaluation("oc-1"))
    woke = await pool.wake_cron(crons[0].id)
    assert woke.evaluation.id == "oc-1"
    state = {c.id: c.state for c in await driver.list()}[crons[0].id]
    assert state == {"status": "busy", "eval_id": "oc-1"}
    assert len(json.dumps(state)) < 100
