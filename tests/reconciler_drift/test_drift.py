"""Each drift kind seeded into a real pool service (local driver) and repaired by the check,
which talks to the pool only over gRPC and records every repair in the reconciler's schema."""

from __future__ import annotations

import json

import grpc
import pytest
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.pool.v1 import pool_pb2 as pool_pb
from dispo.libs.api.pool.v1 import pool_pb2_grpc
from dispo.libs.api.reconciler.v1 import drift_pb2 as pb
from dispo.libs.api.reconciler.v1 import drift_pb2_grpc
from dispo.libs.clock import FileClock, ManualClock
from dispo.libs.db import create_engine
from dispo.libs.errors import Unavailable
from dispo.libs.grpcserver import create_server
from dispo.pool.drivers.local import Registry
from dispo.reconciler.drift import MIGRATIONS, SERVICE_NAME, DriftChecker, register
from sqlalchemy import text
from support import eventually
from support.auth import admin_channel

REQUEST = dict(
    series="s",
    line=common_pb2.LINE_TRIAL,
    period="p",
    target_url="http://127.0.0.1:9",
    window_seconds=3600,
    slot_count=1,
    runs_per_slot=5,
    cases=[pool_pb.TestCase(id="c1", path="/")],
)


@pytest.fixture
async def drift_env(
    start_service, service_engine, service_db, database_url, file_clock, tmp_path, authorizer
):
    registry_path = tmp_path / "registry.sqlite"
    pool = await start_service(
        "pool",
        env={
            **file_clock.env,
            "DISPO_POOL_LOCAL_REGISTRY": str(registry_path),
            "DISPO_POOL_SPAWN_WORKER": "false",
            "DISPO_EGRESS_ALLOW": "http://127.0.0.1:9",  # the evaluations' target, never called
        },
    )
    reconciler_engine = await service_engine("reconciler", MIGRATIONS)
    pool_db = create_engine(database_url, "pool")
    channel = admin_channel(pool.address)
    checker = DriftChecker(
        await service_db("reconciler", MIGRATIONS),
        pool_pb2_grpc.PoolServiceStub(channel),
        FileClock(file_clock.path),
    )
    server = create_server(
        "127.0.0.1:0", [lambda s: register(s, checker)], [SERVICE_NAME], authorizer()
    )
    await server.start()
    await server.set_serving(True)
    drift_channel = admin_channel(f"127.0.0.1:{server.port}")
    yield (
        pool_pb2_grpc.PoolServiceStub(channel),
        drift_pb2_grpc.DriftServiceStub(drift_channel),
        Registry(registry_path),
        pool_db,
        reconciler_engine,
    )
    await drift_channel.close()
    await server.stop(0)
    await channel.close()
    await pool_db.dispose()


async def _crons(stub, n: int):
    """The pool's ``n`` crons, once its driver has every one of them too: a cron is recorded
    before the driver creates it, and a check in between would see it missing."""
    await eventually(
        lambda: stub.GetDriftView(pool_pb.GetDriftViewRequest()),
        lambda v: (
            len(v.db_crons) == n
            and {c.cron_id for c in v.driver_crons} == {c.id for c in v.db_crons}
        ),
        timeout=20,
        wanted=f"{n} crons in the pool and in its driver",
        describe=lambda v: f"{len(v.db_crons)} crons, {len(v.driver_crons)} in the driver",
    )
    return (await stub.ListCrons(pool_pb.ListCronsRequest())).crons


async def test_each_drift_kind_is_repaired_and_recorded(drift_env):
    pool, drift, registry, pool_db, reconciler_db = drift_env
    crons = [c.id for c in await _crons(pool, 5)]
    a, b, c, d, e = crons
    assert (
        await drift.RunDriftCheck(pb.RunDriftCheckRequest())
    ).repairs == []  # consistent to begin with

    # Equal waiting times: the queue breaks the tie by id, so b, c, d take them in this order.
    for name in ("ev-1-finished", "ev-2-idle-held", "ev-3-driver-forgot"):
        await pool.CreateEvaluation(pool_pb.CreateEvaluationRequest(evaluation_id=name, **REQUEST))
    assert (
        await pool.WakeCron(pool_pb.WakeCronRequest(cron_id=b))
    ).evaluation.id == "ev-1-finished"
    assert (
        await pool.WakeCron(pool_pb.WakeCronRequest(cron_id=c))
    ).evaluation.id == "ev-2-idle-held"
    assert (
        await pool.WakeCron(pool_pb.WakeCronRequest(cron_id=d))
    ).evaluation.id == "ev-3-driver-forgot"

    # 1. an orphan only the driver has; 2. a cron the driver lost
    registry.create("cron-orphan", json.dumps({"status": "idle", "eval_id": ""}))
    registry.remove(a)
    async with pool_db.begin() as conn:
        # 3. a busy cron whose evaluation finished (completed behind the cron's back)
        await conn.execute(
            text(
                "UPDATE evaluations SET assigned_cron_id = NULL, assigned_at = NULL, "
                "status = 'completed' WHERE id = 'ev-1-finished'"
            )
        )
        # 4a. an evaluation assigned to a cron the DB has as idle
        await conn.execute(
            text(f"UPDATE crons SET status = 'idle', evaluation_id = NULL WHERE id = '{c}'")
        )
    # 4b. an evaluation whose cron's driver state says idle (the driver lost its context)
    registry.write_state(d, json.dumps({"status": "idle", "eval_id": ""}))
    # 5. an idle cron whose driver state claims an evaluation
    registry.write_state(e, json.dumps({"status": "busy", "eval_id": "ghost"}))

    result = await drift.RunDriftCheck(pb.RunDriftCheckRequest())
    got = sorted((r.kind, r.cron_id, r.evaluation_id, r.outcome) for r in result.repairs)
    assert got == sorted(
        [
            (pool_pb.REPAIR_KIND_REMOVE_ORPHAN, "cron-orphan", "", pb.REPAIR_OUTCOME_APPLIED),
            (pool_pb.REPAIR_KIND_RECREATE_MISSING, a, "", pb.REPAIR_OUTCOME_APPLIED),
            (pool_pb.REPAIR_KIND_RELEASE_FINISHED, b, "ev-1-finished", pb.REPAIR_OUTCOME_APPLIED),
            (
                pool_pb.REPAIR_KIND_REQUEUE_EVALUATION,
                c,
                "ev-2-idle-held",
                pb.REPAIR_OUTCOME_APPLIED,
            ),
            (
                pool_pb.REPAIR_KIND_REQUEUE_EVALUATION,
                d,
                "ev-3-driver-forgot",
                pb.REPAIR_OUTCOME_APPLIED,
            ),
            (pool_pb.REPAIR_KIND_REWRITE_STATE, e, "", pb.REPAIR_OUTCOME_APPLIED),
        ]
    )
    assert all(r.reason for r in result.repairs)

    # The repairs took effect: the driver and the DB agree again.
    states = {cron.id: cron.state for cron in registry.list()}
    assert set(states) == set(crons)
    assert all(state == {"status": "idle", "eval_id": ""} for state in states.values())
    for evaluation_id in ("ev-2-idle-held", "ev-3-driver-forgot"):
        ev = await pool.GetEvaluation(pool_pb.GetEvaluationRequest(evaluation_id=evaluation_id))
        assert ev.assigned_cron_id == "" and ev.status == pool_pb.EVALUATION_STATUS_EXECUTING
    queue = await pool.ListQueue(pool_pb.ListQueueRequest())
    assert {i.evaluation_id for i in queue.items} == {"ev-2-idle-held", "ev-3-driver-forgot"}
    assert all(
        c.status == pool_pb.CRON_STATUS_IDLE
        for c in (await pool.ListCrons(pool_pb.ListCronsRequest())).crons
    )

    # Converged: a second check finds nothing; every repair is listable with its reason.
    assert list((await drift.RunDriftCheck(pb.RunDriftCheckRequest())).repairs) == []
    listed = (await drift.ListRepairs(pb.ListRepairsRequest())).repairs
    assert len(listed) == 6
    requeues = (
        await drift.ListRepairs(pb.ListRepairsRequest(kind=pool_pb.REPAIR_KIND_REQUEUE_EVALUATION))
    ).repairs
    assert {r.evaluation_id for r in requeues} == {"ev-2-idle-held", "ev-3-driver-forgot"}
    assert "idle in the database" in {r.cron_id: r.reason for r in requeues}[c]
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await drift.ListRepairs(pb.ListRepairsRequest(kind=42))
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad.value.details().startswith("kind: must be REPAIR_KIND_REMOVE_ORPHAN, ")
    for kind in (pool_pb.REPAIR_KIND_UNSPECIFIED, 42):  # unset, and a number no kind has
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await pool.ApplyRepair(pool_pb.ApplyRepairRequest(kind=kind, cron_id=e))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad.value.details().startswith("kind: must be REPAIR_KIND_REMOVE_ORPHAN, ")
    async with reconciler_db.connect() as conn:  # recorded in the reconciler's own tables
        assert (await conn.execute(text("SELECT count(*) FROM drift_repairs"))).scalar_one() == 6
        assert (await conn.execute(text("SELECT count(*) FROM drift_checks"))).scalar_one() == 3


async def test_check_against_an_unreachable_pool_is_unavailable_and_records_nothing(
    service_engine, service_db
):
    engine = await service_engine("reconciler", MIGRATIONS)
    async with admin_channel("127.0.0.1:1") as channel:
        checker = DriftChecker(
            await service_db("reconciler", MIGRATIONS),
            pool_pb2_grpc.PoolServiceStub(channel),
            ManualClock(),
            timeout_seconds=1,
        )
        with pytest.raises(Unavailable):
            await checker.check_once()
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM drift_checks"))).scalar_one() == 0


async def test_reconciler_process_serves_drift_checks_against_the_pool(
    start_service, file_clock, tmp_path
):
    registry = tmp_path / "registry.sqlite"
    pool = await start_service(
        "pool",
        env={
            **file_clock.env,
            "DISPO_POOL_LOCAL_REGISTRY": str(registry),
            "DISPO_POOL_SPAWN_WORKER": "false",
            "DISPO_EGRESS_ALLOW": "http://127.0.0.1:9",  # the evaluations' target, never called
        },
    )
    reconciler = await start_service(
        "reconciler", env={**file_clock.env, "DISPO_RECONCILER_DRIFT_POOL_ADDRESS": pool.address}
    )
    async with admin_channel(pool.address) as channel:
        await _crons(pool_pb2_grpc.PoolServiceStub(channel), 5)
    Registry(registry).create("cron-stray", json.dumps({"status": "idle", "eval_id": ""}))
    async with admin_channel(reconciler.address) as channel:
        drift = drift_pb2_grpc.DriftServiceStub(channel)
        result = await drift.RunDriftCheck(pb.RunDriftCheckRequest())
        assert [(r.kind, r.cron_id, r.outcome) for r in result.repairs] == [
            (pool_pb.REPAIR_KIND_REMOVE_ORPHAN, "cron-stray", pb.REPAIR_OUTCOME_APPLIED)
        ]
        assert result.crons_in_db == 5 and result.crons_in_driver == 6
        listed = await drift.ListRepairs(pb.ListRepairsRequest())
        assert [r.cron_id for r in listed.repairs] == ["cron-stray"]
    assert "cron-stray" not in {c.id for c in Registry(registry).list()}
