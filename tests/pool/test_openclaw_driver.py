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
    listed = json.loads(
        subprocess.run(
            [str(FAKE_OPENCLAW), "automations", "list", "--json"], capture_output=True, check=True
        ).stdout
    )
    assert listed[0]["runs"] == 1 and listed[0]["every"] == "60s"
    await driver.remove("cron-a")
    await driver.remove("cron-a")  # absent: not an error
    assert await driver.list() == []
    with pytest.raises(DriverError):
        await driver.trigger("cron-a")


async def test_state_over_16_kb_is_refused_by_openclaw_and_by_the_driver(driver, fake_db):
    await driver.create("cron-b", {"status": "idle", "eval_id": ""})
    big = json.dumps({"status": "busy", "blob": "x" * 16_400})
    refused = subprocess.run(
        [str(FAKE_OPENCLAW), "automations", "state", "set", "cron-b", big],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "at most 16384" in refused.stderr
    with pytest.raises(DriverError):
        await driver.write_state("cron-b", {"status": "busy", "blob": "x" * 16_400})
    [cron] = await driver.list()
    assert cron.state == {"status": "idle", "eval_id": ""}


async def test_pool_on_openclaw_scales_and_keeps_cron_state_small(
    pool_engine, manual_clock, driver
):
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


async def test_pool_service_drives_openclaw_automations(start_service, fake_db, file_clock):
    """The pool process on the openclaw driver: creates the automations, wakes one for new
    work, and an automation serving the cron protocol finishes the evaluation."""
    import grpc
    from dispo.libs.api.common.v1 import common_pb2
    from dispo.libs.api.pool.v1 import pool_pb2 as pb
    from dispo.libs.api.pool.v1 import pool_pb2_grpc
    from support import eventually

    pool = await start_service(
        "pool",
        env={
            **file_clock.env,
            "DISPO_POOL_DRIVER": "openclaw",
            "DISPO_POOL_OPENCLAW_PATH": str(FAKE_OPENCLAW),
            "OPENCLAW_FAKE_DB": str(fake_db),
        },
    )

    def automations() -> list[dict]:
        out = subprocess.run(
            [str(FAKE_OPENCLAW), "automations", "list", "--json"],
            capture_output=True,
            check=True,
            env={"OPENCLAW_FAKE_DB": str(fake_db)},
        )
        return json.loads(out.stdout)

    await eventually(lambda: len(automations()) == 5)
    async with grpc.aio.insecure_channel(pool.address) as channel:
        stub = pool_pb2_grpc.PoolServiceStub(channel)
        assert (await stub.GetPoolStatus(pb.GetPoolStatusRequest())).driver == pb.DRIVER_OPENCLAW
        await stub.CreateEvaluation(
            pb.CreateEvaluationRequest(
                evaluation_id="claw-1",
                series="s",
                line=common_pb2.LINE_TRIAL,
                period="p",
                target_url="http://127.0.0.1:9",
                window_seconds=60,
                slot_count=1,
                runs_per_slot=2,
                cases=[pb.TestCase(id="c1", path="/")],
            )
        )
        woken = await eventually(lambda: [a for a in automations() if a["runs"] > 0])
        assert len(woken) == 1  # one queue item: one automation triggered at once
        cron_id = woken[0]["id"]
        # The automation, woken, follows the cron protocol.
        woke = await stub.WakeCron(pb.WakeCronRequest(cron_id=cron_id))
        assert woke.evaluation.id == "claw-1" and woke.runs_owed == 2
        assert {a["id"]: a["state"] for a in automations()}[cron_id] == {
            "status": "busy",
            "eval_id": "claw-1",
        }
        for index in range(2):
            await stub.RecordRun(
                pb.RecordRunRequest(
                    cron_id=cron_id,
                    evaluation_id="claw-1",
                    run_index=index,
                    case_id="c1",
                    verdict=common_pb2.VERDICT_PASS,
                    score=1.0,
                    latency_ms=3,
                )
            )
        ev = await stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id="claw-1"))
        assert ev.status == pb.EVALUATION_STATUS_COMPLETED
        assert {a["id"]: a["state"] for a in automations()}[cron_id] == {
            "status": "idle",
            "eval_id": "",
        }
        view = await stub.GetDriftView(pb.GetDriftViewRequest())
        assert view.driver == pb.DRIVER_OPENCLAW and len(view.driver_crons) == 5
