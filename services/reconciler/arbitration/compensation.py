"""Compensating cells for arbitration losers: submitted to the gateway like any caller
would, with an idempotency key per (verdict, loser) so a retry never makes a second task.
Refusals (bad payload, unknown cell) end FAILED with the gateway's reason; an unreachable
gateway is retried with backoff."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import grpc
from dispo.libs.api.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from dispo.libs.auth import open_channel
from dispo.libs.backoff import backoff
from dispo.libs.logging import get_logger
from dispo.libs.payload import canonical_json
from dispo.reconciler.arbitration import store as arb
from dispo.reconciler.context import Context
from dispo.reconciler.states import CompensationState

log = get_logger(__name__)
REFUSED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
}


def idempotency_key(verdict_id: int, task_id: str) -> str:
    return f"compensation:{verdict_id}:{task_id}"


async def _submit(
    stub: gateway_pb2_grpc.GatewayServiceAsyncStub, row: Any, timeout: float
) -> tuple[str, str, bool]:
    """(task id, error, final)."""
    request = gateway_pb2.SubmitRequest(
        business=row.business,
        idempotency_key=idempotency_key(row.verdict_id, row.task_id),
        cells=[gateway_pb2.CellRequest(cell=row.cell, payload_json=canonical_json(row.payload))],
    )
    try:
        reply = await stub.Submit(request, timeout=timeout)
    except grpc.aio.AioRpcError as error:
        return "", f"{error.code().name}: {error.details()}", error.code() in REFUSED
    return reply.task_id, "", True


async def compensate_sweep(ctx: Context) -> int:
    """Submit due compensating cells (one batch); returns how many were attempted."""
    policy = ctx.config.compensation
    now = ctx.clock.now()
    async with ctx.db.connection() as conn:  # one statement: it commits alone
        rows = await arb.compensations_claim(conn, now, ctx.call_lease(now), ctx.settings.batch)
    if not rows:
        return 0
    async with open_channel(ctx.settings.gateway_address, ctx.service_token) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        results = [await _submit(stub, row, ctx.settings.http_timeout_seconds) for row in rows]
    now = ctx.clock.now()
    async with ctx.db.transaction() as conn:
        for row, (task_id, error, final) in zip(rows, results, strict=False):
            attempt = row.attempts + 1
            if task_id:
                new, next_at = CompensationState.SUBMITTED, None
            elif final or attempt >= policy.max_attempts:
                new, next_at = CompensationState.FAILED, None
            else:
                delay = backoff(policy.base_delay, policy.max_delay, 0.5, attempt, ctx.rng)
                new, next_at = CompensationState.PENDING, now + timedelta(seconds=delay)
            if await arb.compensation_set_if(
                conn, row.verdict_id, row.task_id, row.attempts, new, next_at, task_id, error
            ):
                log.info(
                    "compensation",
                    verdict=row.verdict_id,
                    task_id=row.task_id,
                    cell=row.cell,
                    outcome=new.value,
                    submitted_task_id=task_id,
                    error=error,
                )
    return len(rows)
