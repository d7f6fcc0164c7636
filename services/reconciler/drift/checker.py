"""The drift check sweep: ask the pool for its DB view and its driver's crons, plan the
repairs, ask the pool to apply each, and record each with its reason and outcome."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import grpc
from dispo.libs.api.pool.v1 import pool_pb2 as pool_pb
from dispo.libs.api.pool.v1 import pool_pb2_grpc
from dispo.libs.clock import Clock
from dispo.libs.db.driver import Database
from dispo.libs.errors import Unavailable
from dispo.libs.logging import get_logger
from dispo.libs.proto_enums import short_name
from dispo.libs.repairs import REPAIR_KIND_TO_PB
from dispo.reconciler.drift import store
from dispo.reconciler.drift.planner import DbCron, PlannedRepair, RepairOutcome, View, plan_repairs

log = get_logger(__name__)


@dataclass(frozen=True)
class CheckResult:
    check_id: str
    crons_in_db: int
    crons_in_driver: int
    repairs: list[dict]
    at: datetime


def _lower(enum_type: Any, value: int) -> str:
    return short_name(enum_type, value).lower()


def view_from_pb(view: pool_pb.DriftView) -> View:
    crons = {
        c.id: DbCron(c.id, _lower(pool_pb.CronStatus, c.status), c.evaluation_id)
        for c in view.db_crons
    }
    states = {c.cron_id: json.loads(c.state_json or "{}") for c in view.driver_crons}
    evaluations = {
        e.evaluation_id: (
            _lower(pool_pb.EvaluationStatus, e.status),
            e.assigned_cron_id,
        )
        for e in view.evaluations
    }
    return View(_lower(pool_pb.Driver, view.driver), crons, states, evaluations)


# How long one call to the pool may take.
TIMEOUT_SECONDS = 30.0


class DriftChecker:
    def __init__(
        self,
        db: Database,
        pool: pool_pb2_grpc.PoolServiceAsyncStub,
        clock: Clock,
        timeout_seconds: float = TIMEOUT_SECONDS,
    ) -> None:
        self.db = db
        self.pool = pool
        self.clock = clock
        self.timeout_seconds = timeout_seconds
        self._lock = asyncio.Lock()  # one check at a time per process

    async def check_once(self) -> CheckResult:
        async with self._lock:
            try:
                view_pb = await self.pool.GetDriftView(
                    pool_pb.GetDriftViewRequest(), timeout=self.timeout_seconds
                )
            except grpc.aio.AioRpcError as error:
                raise Unavailable(
                    f"pool unreachable: {error.code().name} {error.details()}"
                ) from None
            view = view_from_pb(view_pb)
            check_id = f"drift-{uuid.uuid4().hex[:12]}"
            now = self.clock.now()
            async with self.db.connection() as conn:  # one statement: it commits alone
                await store.check_add(
                    conn, check_id, now, len(view.db_crons), len(view.driver_states), view.driver
                )
            repairs = [await self._apply(check_id, planned) for planned in plan_repairs(view)]
            if repairs:
                log.info("drift check repaired", check_id=check_id, repairs=len(repairs))
            return CheckResult(check_id, len(view.db_crons), len(view.driver_states), repairs, now)

    async def _apply(self, check_id: str, planned: PlannedRepair) -> dict[str, Any]:
        request = pool_pb.ApplyRepairRequest(
            kind=REPAIR_KIND_TO_PB[planned.kind],
            cron_id=planned.cron_id,
            evaluation_id=planned.evaluation_id,
        )
        try:
            reply = await self.pool.ApplyRepair(request, timeout=self.timeout_seconds)
            outcome, detail = (
                (RepairOutcome.APPLIED if reply.applied else RepairOutcome.SKIPPED),
                reply.detail,
            )
        except grpc.aio.AioRpcError as error:
            outcome, detail = RepairOutcome.FAILED, f"{error.code().name}: {error.details()}"
        log.info(
            "drift repair",
            check_id=check_id,
            kind=planned.kind.value,
            cron_id=planned.cron_id,
            evaluation_id=planned.evaluation_id,
            outcome=outcome.value,
            reason=planned.reason,
        )
        async with self.db.connection() as conn:
            return await store.repair_add(
                conn,
                check_id,
                planned.kind.value,
                planned.cron_id,
                planned.evaluation_id,
                planned.reason,
                outcome.value,
                detail,
                self.clock.now(),
            )
