"""``dispo.retention.v1.RetentionService``: a service's retention over gRPC (a dry run of
what it will delete), served by the gateway, the executor and the reconciler beside their
own API (ADR-0105)."""

from __future__ import annotations

from typing import Any

import grpc
from dispo.libs.api.retention.v1 import retention_pb2 as pb
from dispo.libs.api.retention.v1 import retention_pb2_grpc
from dispo.libs.retention import Retention
from dispo.libs.timestamps import to_timestamp
from dispo.libs.validation import business_name

SERVICE_NAME = "dispo.retention.v1.RetentionService"
Context = grpc.aio.ServicerContext[Any, Any]


class RetentionServicer(retention_pb2_grpc.RetentionServiceServicer):
    def __init__(self, retention: Retention) -> None:
        self.retention = retention

    async def GetRetention(
        self, request: pb.GetRetentionRequest, context: Context
    ) -> pb.GetRetentionResponse:
        business = business_name(request.business) if request.business else ""
        now = self.retention.clock.now()
        report = await self.retention.report(business)
        records = await self.retention.records_report()
        settings = self.retention.settings
        longest = self.retention.policy.longest_retention.days
        return pb.GetRetentionResponse(
            service=self.retention.service,
            enabled=settings.enabled,
            default_retention_days=self.retention.policy.default.retention_days,
            businesses=[
                pb.BusinessRetention(
                    business=r.business,
                    retention_days=r.retention_days,
                    cutoff=to_timestamp(r.cutoff),
                    due=r.due,
                )
                for r in report
            ],
            now=to_timestamp(now),
            batch=settings.batch,
            interval_seconds=settings.interval_seconds,
            records=[
                pb.RecordRetention(
                    table=r.table,
                    due=r.counts.due,
                    held=r.counts.held,
                    retention_days=longest,
                    rule=r.rule,
                )
                for r in records
            ],
        )
