"""DriftService over gRPC: run a check now, list recorded repairs."""

from __future__ import annotations

from dispo.libs.api.reconciler.v1 import drift_pb2 as pb
from dispo.libs.api.reconciler.v1 import drift_pb2_grpc
from dispo.libs.errors import InvalidArgument
from dispo.libs.proto_enums import from_short_name
from dispo.libs.repairs import REPAIR_KIND_TO_PB, RepairKind, repair_kind_from_pb
from dispo.libs.timestamps import to_timestamp
from dispo.reconciler.drift import store
from dispo.reconciler.drift.checker import DriftChecker
from dispo.reconciler.drift.planner import RepairOutcome


def repair_to_pb(row: dict) -> pb.Repair:
    return pb.Repair(
        id=row["id"],
        check_id=row["check_id"],
        kind=REPAIR_KIND_TO_PB[RepairKind(row["kind"])],
        cron_id=row["cron_id"],
        evaluation_id=row["evaluation_id"],
        reason=row["reason"],
        outcome=from_short_name(pb.RepairOutcome, RepairOutcome(row["outcome"]).name),
        detail=row["detail"],
        at=to_timestamp(row["at"]),
    )


class DriftServicer(drift_pb2_grpc.DriftServiceServicer):
    def __init__(self, checker: DriftChecker) -> None:
        self.checker = checker

    async def RunDriftCheck(self, request, context) -> pb.DriftCheckResult:
        result = await self.checker.check_once()
        return pb.DriftCheckResult(
            check_id=result.check_id,
            crons_in_db=result.crons_in_db,
            crons_in_driver=result.crons_in_driver,
            repairs=[repair_to_pb(r) for r in result.repairs],
            at=to_timestamp(result.at),
        )

    async def ListRepairs(self, request, context) -> pb.ListRepairsResponse:
        kind = repair_kind_from_pb(request.kind).value if request.kind else ""
        if request.limit < 0:
            raise InvalidArgument("limit", "must be >= 0")
        async with self.checker.db.connection() as conn:
            rows = await store.repairs_list(conn, kind, min(request.limit or 100, 1000))
        return pb.ListRepairsResponse(repairs=[repair_to_pb(r) for r in rows])
