"""ReconcilerService: thin — validate and convert at the edge, call the domain, which
raises dispo.libs.errors for the interceptor to map to status codes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.libs.api.reconciler.v1 import reconciler_pb2_grpc
from dispo.libs.auth import business_filter, business_scope, caller, require_visible
from dispo.libs.errors import InvalidArgument, NotFound
from dispo.reconciler import convert as cv
from dispo.reconciler.arbitration import store as arb
from dispo.reconciler.completion import store as cs
from dispo.reconciler.context import Context
from dispo.reconciler.erasure import seal
from dispo.reconciler.recovery import operations, release, settlement, store
from dispo.reconciler.sweeps import run_sweeps

# The longest task id a seal takes (the gateway's are far shorter).
MAX_ID_LENGTH = 64


def _required(value: str, field: str) -> str:
    if not value.strip():
        raise InvalidArgument(field, "required")
    return value


def _not_held(task_id: str) -> str:
    return f"task {task_id!r} is not held by the reconciler"


def _scoped(f: store.Filter, requested: str) -> store.Filter:
    """A list filter as the caller may ask it: a business token's own business only."""
    business = business_filter(requested, "filter.business")
    return f if business == f.business else replace(f, business=business)


class ReconcilerServicer(reconciler_pb2_grpc.ReconcilerServiceServicer):
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    async def _visible(self, task_id: str) -> str:
        """``task_id`` if the caller may see it: another business's task is NOT_FOUND, as
        one the reconciler does not hold (dispo.libs.auth.scope)."""
        if business_scope() is not None:
            async with self.ctx.db.connection() as conn:
                row = await store.task_get(conn, task_id)
            require_visible(row.business if row else "", _not_held(task_id))
        return task_id

    async def ListRecoveryTasks(
        self, request: pb.ListRecoveryTasksRequest, context: Any
    ) -> pb.ListRecoveryTasksResponse:
        f = _scoped(cv.filter_from_proto(request.filter), request.filter.business)
        limit, offset = cv.page(request.page)
        async with self.ctx.db.connection() as conn:
            rows = await store.task_list(conn, f, self.ctx.clock.now(), limit=limit, offset=offset)
        return pb.ListRecoveryTasksResponse(
            tasks=[cv.task_to_proto(r) for r in rows], page=cv.next_page(limit, offset, len(rows))
        )

    async def ListFailedWork(
        self, request: pb.ListFailedWorkRequest, context: Any
    ) -> pb.ListFailedWorkResponse:
        f = _scoped(cv.work_filter_from_proto(request.filter), request.filter.business)
        limit, after = cv.work_page(request.page)
        now = self.ctx.clock.now()
        async with self.ctx.db.connection() as conn:
            rows = await store.task_list(conn, f, now, limit=limit, after=after)
        return pb.ListFailedWorkResponse(
            work=[cv.work_to_proto(r, now) for r in rows], page=cv.work_next_page(rows, limit)
        )

    async def GetRecoveryTask(
        self, request: pb.GetRecoveryTaskRequest, context: Any
    ) -> pb.GetRecoveryTaskResponse:
        task_id = _required(request.task_id, "task_id")
        async with self.ctx.db.connection() as conn:
            row = await store.task_get(conn, task_id)
            if row is None:
                raise NotFound(_not_held(task_id))
            require_visible(row.business, _not_held(task_id))
            history = await store.history_get(conn, task_id)
            redrives = await store.redrive_log_get(conn, task_id)
            settlements = await store.settlements_get(conn, task_id)
        return pb.GetRecoveryTaskResponse(
            task=cv.task_to_proto(row),
            envelope=row.envelope,
            history=[cv.history_to_proto(h) for h in history],
            redrives=[cv.redrive_to_proto(r) for r in redrives],
            settlements=[cv.settlement_to_proto(s) for s in settlements],
        )

    async def RedriveTask(
        self, request: pb.RedriveTaskRequest, context: Any
    ) -> pb.RedriveTaskResponse:
        row = await operations.redrive_one(
            self.ctx,
            await self._visible(_required(request.task_id, "task_id")),
            request.actor,
            request.reason,
            request.include_permanent,
        )
        return pb.RedriveTaskResponse(task=cv.task_to_proto(row))

    async def RedriveByFilter(
        self, request: pb.RedriveByFilterRequest, context: Any
    ) -> pb.RedriveByFilterResponse:
        ids, last = await operations.redrive_by_filter(
            self.ctx,
            cv.filter_from_proto(request.filter),
            request.rate_per_second,
            request.limit,
            request.actor,
            request.reason,
        )
        out = pb.RedriveByFilterResponse(scheduled=len(ids), task_ids=ids)
        cv.set_ts(out, "last_due_at", last)
        return out

    async def AbandonTask(
        self, request: pb.AbandonTaskRequest, context: Any
    ) -> pb.AbandonTaskResponse:
        row = await operations.abandon(
            self.ctx, _required(request.task_id, "task_id"), request.actor, request.reason
        )
        return pb.AbandonTaskResponse(task=cv.task_to_proto(row))

    async def AbandonByFilter(
        self, request: pb.AbandonByFilterRequest, context: Any
    ) -> pb.AbandonByFilterResponse:
        principal = caller()
        matched, ids = await operations.abandon_by_filter(
            self.ctx,
            cv.filter_from_proto(request.filter),
            request.limit,
            request.dry_run,
            request.rate_per_second,
            principal.token_id if principal else "",
            request.reason,
        )
        return pb.AbandonByFilterResponse(matched=matched, task_ids=ids)

    async def ResolveNode(
        self, request: pb.ResolveNodeRequest, context: Any
    ) -> pb.ResolveNodeResponse:
        if request.resolution not in (pb.RESOLUTION_DONE, pb.RESOLUTION_RETRY):
            raise InvalidArgument("resolution", "RESOLUTION_DONE or RESOLUTION_RETRY")
        row, redriven = await settlement.resolve_node(
            self.ctx,
            _required(request.task_id, "task_id"),
            _required(request.node_id, "node_id"),
            request.resolution == pb.RESOLUTION_DONE,
            request.actor,
            request.reason,
        )
        return pb.ResolveNodeResponse(task=cv.task_to_proto(row), redriven=redriven)

    async def _downstreams(self, only: str = "") -> list[pb.DownstreamState]:
        now = self.ctx.clock.now()
        async with self.ctx.db.connection() as conn:
            states = await store.downstream_all(conn)
            depths = await store.downstreams_queue_depths(conn)
        names = sorted(set(self.ctx.config.downstreams) | set(states) | set(depths))
        return [
            cv.downstream_to_proto(
                n,
                states.get(n),
                depths.get(n),
                self.ctx.config.release_rate(n).rate_per_second,
                now,
            )
            for n in names
            if not only or n == only
        ]

    async def ListDownstreams(
        self, request: pb.ListDownstreamsRequest, context: Any
    ) -> pb.ListDownstreamsResponse:
        return pb.ListDownstreamsResponse(downstreams=await self._downstreams())

    async def PauseDownstream(
        self, request: pb.PauseDownstreamRequest, context: Any
    ) -> pb.PauseDownstreamResponse:
        await release.pause(self.ctx, request.name, request.actor, request.reason)
        return pb.PauseDownstreamResponse(
            downstream=(await self._downstreams(request.name.strip()))[0]
        )

    async def ResumeDownstream(
        self, request: pb.ResumeDownstreamRequest, context: Any
    ) -> pb.ResumeDownstreamResponse:
        await release.resume(self.ctx, request.name, request.actor)
        return pb.ResumeDownstreamResponse(
            downstream=(await self._downstreams(request.name.strip()))[0]
        )

    async def GetCompletion(
        self, request: pb.GetCompletionRequest, context: Any
    ) -> pb.GetCompletionResponse:
        task_id = _required(request.task_id, "task_id")
        async with self.ctx.db.connection() as conn:
            row = await cs.completion_get(conn, task_id)
            missing = f"no completion recorded for task {task_id!r} (not finished, or not seen yet)"
            if row is None:
                raise NotFound(missing)
            require_visible(row.business, missing)
            deliveries = await cs.deliveries_get(conn, task_id)
            findings = await cs.findings_list(conn, task_id, cv.MAX_PAGE, 0)
        return pb.GetCompletionResponse(
            completion=cv.completion_to_proto(row),
            deliveries=[cv.delivery_to_proto(d) for d in deliveries],
            findings=[cv.finding_to_proto(f) for f in findings],
        )

    async def ListFindings(
        self, request: pb.ListFindingsRequest, context: Any
    ) -> pb.ListFindingsResponse:
        limit, offset = cv.page(request.page)
        async with self.ctx.db.connection() as conn:
            rows = await cs.findings_list(conn, request.task_id, limit, offset)
        return pb.ListFindingsResponse(
            findings=[cv.finding_to_proto(r) for r in rows],
            page=cv.next_page(limit, offset, len(rows)),
        )

    async def ListVerdicts(
        self, request: pb.ListVerdictsRequest, context: Any
    ) -> pb.ListVerdictsResponse:
        limit, offset = cv.page(request.page)
        async with self.ctx.db.connection() as conn:
            rows = await arb.verdicts_list(conn, request.target, request.task_id, limit, offset)
            compensations = await arb.compensations_of(conn, [r.id for r in rows])
        return pb.ListVerdictsResponse(
            verdicts=[cv.verdict_to_proto(r, compensations) for r in rows],
            page=cv.next_page(limit, offset, len(rows)),
        )

    async def RunSweep(self, request: pb.RunSweepRequest, context: Any) -> pb.RunSweepResponse:
        handled = await run_sweeps(self.ctx, cv.sweep_name(request.sweep))
        return pb.RunSweepResponse(handled=handled)

    async def SealTask(self, request: pb.SealTaskRequest, context: Any) -> pb.SealTaskResponse:
        task_id = _required(request.task_id, "task_id")
        if len(task_id) > MAX_ID_LENGTH:
            raise InvalidArgument("task_id", f"longer than {MAX_ID_LENGTH} characters")
        if len(request.erased_by) > MAX_ID_LENGTH * 4:
            raise InvalidArgument("erased_by", f"longer than {MAX_ID_LENGTH * 4} characters")
        sealed = await seal(self.ctx, task_id, request.erased_by)
        out = pb.SealTaskResponse(erased_by=sealed.erased_by)
        cv.set_ts(out, "sealed_at", sealed.sealed_at)
        return out
