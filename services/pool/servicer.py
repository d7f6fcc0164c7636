"""PoolService over gRPC: converts protos to domain values and back; the logic is in
:mod:`dispo.pool.operations`, :mod:`dispo.pool.drift` and the sweeps."""

from __future__ import annotations

import json
from datetime import datetime

from dispo.libs.api.pool.v1 import pool_pb2 as pb
from dispo.libs.api.pool.v1 import pool_pb2_grpc
from dispo.libs.error_text import truncate_error
from dispo.libs.errors import InvalidArgument
from dispo.libs.evaluation import LINE_FROM_PB, LINE_TO_PB, verdict_from_pb
from dispo.libs.proto_enums import from_short_name
from dispo.libs.repairs import repair_kind_from_pb
from dispo.libs.timestamps import to_timestamp
from dispo.pool import drift, store
from dispo.pool.convert import RULE_KIND_TO_PB, assignment_end, rule_kind
from dispo.pool.domain import (
    Cron,
    CronStatus,
    Evaluation,
    EvaluationStatus,
    Rule,
    RunResult,
    Schedule,
    TestCase,
)
from dispo.pool.operations import Pool
from dispo.pool.sweeps import scale_sweep

DEFAULT_WINDOW = 86400
DEFAULT_SLOTS = 24


def evaluation_status_pb(status: EvaluationStatus) -> pb.EvaluationStatus.ValueType:
    return from_short_name(pb.EvaluationStatus, status.name)


def cron_status_pb(status: CronStatus) -> pb.CronStatus.ValueType:
    return from_short_name(pb.CronStatus, status.name)


def evaluation_to_pb(ev: Evaluation, now: datetime) -> pb.Evaluation:
    s = ev.schedule
    return pb.Evaluation(
        id=ev.id,
        series=ev.series,
        line=LINE_TO_PB[ev.line],
        period=ev.period,
        configuration_json=ev.configuration_json,
        analysis_model=ev.analysis_model,
        target_url=ev.target_url,
        cases=[
            pb.TestCase(
                id=c.id,
                method=c.method,
                path=c.path,
                body=c.body,
                rules=[
                    pb.Rule(kind=RULE_KIND_TO_PB[r.kind], path=r.path, value=r.value)
                    for r in c.rules
                ],
            )
            for c in ev.cases
        ],
        window_seconds=s.window_seconds,
        slot_count=s.slot_count,
        runs_per_slot=s.runs_per_slot,
        status=evaluation_status_pb(ev.status),
        priority_boost=ev.priority_boost,
        runs_done=ev.runs_done,
        runs_total=s.runs_total,
        debt=s.debt(now, ev.runs_done),
        assigned_cron_id=ev.assigned_cron_id or "",
        created_at=to_timestamp(ev.created_at),
        started_at=to_timestamp(ev.started_at),
        completed_at=to_timestamp(ev.completed_at),
        waiting_since=to_timestamp(ev.waiting_since),
    )


def cron_to_pb(cron: Cron) -> pb.Cron:
    return pb.Cron(
        id=cron.id,
        status=cron_status_pb(cron.status),
        evaluation_id=cron.evaluation_id or "",
        last_activity=to_timestamp(cron.last_activity),
        created_at=to_timestamp(cron.created_at),
    )


def evaluation_from_request(request: pb.CreateEvaluationRequest) -> Evaluation:
    # An unspecified or unknown line stays the raw number, so validation reports it with
    # every other bad field.
    line = LINE_FROM_PB.get(request.line, request.line)
    cases = tuple(
        TestCase(
            c.id,
            (c.method or "GET").upper(),
            c.path or "/",
            c.body,
            tuple(Rule(rule_kind(r.kind), r.value, r.path) for r in c.rules),
        )
        for c in request.cases
    )
    return Evaluation(
        id=request.evaluation_id,
        series=request.series,
        line=line,  # type: ignore[arg-type]  # an unknown line stays the raw number for validate() to name
        period=request.period,
        configuration_json=request.configuration_json or "{}",
        analysis_model=request.analysis_model,
        target_url=request.target_url,
        cases=cases,
        schedule=Schedule(
            datetime.min,
            request.window_seconds or DEFAULT_WINDOW,
            request.slot_count or DEFAULT_SLOTS,
            request.runs_per_slot or 1,
        ),
        status=EvaluationStatus.QUEUED,
    )


class PoolServicer(pool_pb2_grpc.PoolServiceServicer):
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def _ev(self, ev: Evaluation) -> pb.Evaluation:
        return evaluation_to_pb(ev, self.pool.clock.now())

    async def GetPoolStatus(self, request, context) -> pb.PoolStatus:
        return await self._status()

    async def _status(self) -> pb.PoolStatus:
        s = await self.pool.status()
        busy, idle, stuck = (
            s.counts[CronStatus.BUSY],
            s.counts[CronStatus.IDLE],
            s.counts[CronStatus.STUCK],
        )
        return pb.PoolStatus(
            driver=from_short_name(pb.Driver, s.driver.upper()),
            size=busy + idle,
            busy=busy,
            idle=idle,
            stuck=stuck,
            min_size=s.min_size,
            max_size=s.max_size,
            queue_depth=s.queue_depth,
            oldest_wait_seconds=s.oldest_wait_seconds,
            stuck_evaluations=s.stuck_evaluations,
        )

    async def ListCrons(self, request, context) -> pb.ListCronsResponse:
        return pb.ListCronsResponse(crons=[cron_to_pb(c) for c in await self.pool.crons()])

    async def ListAssignments(self, request, context) -> pb.ListAssignmentsResponse:
        async with self.pool.db.connection() as conn:
            rows = await store.assignments_list(
                conn, request.cron_id, request.evaluation_id, min(request.limit or 100, 1000)
            )
        return pb.ListAssignmentsResponse(
            assignments=[
                pb.Assignment(
                    id=a.id,
                    cron_id=a.cron_id,
                    evaluation_id=a.evaluation_id,
                    started_at=to_timestamp(a.started_at),
                    ended_at=to_timestamp(a.ended_at),
                    end_reason=assignment_end(a.end_reason),
                )
                for a in rows
            ]
        )

    async def ListQueue(self, request, context) -> pb.ListQueueResponse:
        now = self.pool.clock.now()
        async with self.pool.db.connection() as conn:
            keys = await store.queue_list(conn, now, min(request.limit or 100, 1000))
        return pb.ListQueueResponse(
            items=[
                pb.QueueItem(
                    evaluation_id=k.evaluation_id,
                    status=evaluation_status_pb(EvaluationStatus(k.status)),
                    priority_boost=k.boost,
                    slot_due=k.slot_due,
                    debt=k.debt,
                    waiting_since=to_timestamp(k.waiting_since),
                )
                for k in keys
            ]
        )

    async def ListResizes(self, request, context) -> pb.ListResizesResponse:
        async with self.pool.db.connection() as conn:
            rows = await store.resizes_list(conn, min(request.limit or 100, 1000))
        return pb.ListResizesResponse(
            resizes=[
                pb.Resize(
                    id=r["id"],
                    from_size=r["from_size"],
                    to_size=r["to_size"],
                    reason=r["reason"],
                    at=to_timestamp(r["at"]),
                )
                for r in rows
            ]
        )

    async def CreateEvaluation(self, request, context) -> pb.Evaluation:
        return self._ev(await self.pool.create_evaluation(evaluation_from_request(request)))

    async def GetEvaluation(self, request, context) -> pb.Evaluation:
        if not request.evaluation_id:
            raise InvalidArgument("evaluation_id", "required")
        return self._ev(await self.pool.get_evaluation(request.evaluation_id))

    async def PauseEvaluation(self, request, context) -> pb.Evaluation:
        return self._ev(await self.pool.pause(request.evaluation_id))

    async def ResumeEvaluation(self, request, context) -> pb.Evaluation:
        return self._ev(await self.pool.resume(request.evaluation_id))

    async def CancelEvaluation(self, request, context) -> pb.Evaluation:
        return self._ev(await self.pool.cancel(request.evaluation_id))

    async def BoostEvaluation(self, request, context) -> pb.Evaluation:
        return self._ev(await self.pool.boost(request.evaluation_id, request.priority_boost))

    async def SetPoolBounds(self, request, context) -> pb.PoolStatus:
        await self.pool.set_bounds(request.min_size, request.max_size)
        await scale_sweep(self.pool)
        return await self._status()

    async def ForceRelease(self, request, context) -> pb.ForceReleaseResponse:
        cron_id, evaluation_id = await self.pool.force_release(
            request.cron_id, request.evaluation_id
        )
        return pb.ForceReleaseResponse(cron_id=cron_id, evaluation_id=evaluation_id)

    async def WakeCron(self, request, context) -> pb.WakeCronResponse:
        result = await self.pool.wake_cron(request.cron_id)
        if result.evaluation is None:
            return pb.WakeCronResponse(assigned=False)
        return pb.WakeCronResponse(
            assigned=True,
            evaluation=self._ev(result.evaluation),
            next_run_index=result.next_run_index,
            runs_owed=result.runs_owed,
        )

    async def RecordRun(self, request, context) -> pb.RecordRunResponse:
        verdict = verdict_from_pb(request.verdict)
        if not 0.0 <= request.score <= 1.0:
            raise InvalidArgument("score", "must be in 0..1")
        result = RunResult(
            verdict,
            request.score,
            max(0, request.latency_ms),
            truncate_error(request.failure_reason),
        )
        out = await self.pool.record_run(
            request.cron_id, request.evaluation_id, request.run_index, request.case_id, result
        )
        return pb.RecordRunResponse(
            run_id=out.run_id,
            duplicate=out.duplicate,
            continue_evaluation=out.continue_evaluation,
            next_run_index=out.next_run_index,
            evaluation_status=evaluation_status_pb(out.evaluation_status),
        )

    async def GetDriftView(self, request, context) -> pb.DriftView:
        view = await drift.drift_view(self.pool)
        return pb.DriftView(
            driver=from_short_name(pb.Driver, view.driver.upper()),
            db_crons=[cron_to_pb(c) for c in view.db_crons],
            driver_crons=[
                pb.DriverCronState(cron_id=c.id, state_json=json.dumps(c.state, sort_keys=True))
                for c in view.driver_crons
            ],
            evaluations=[
                pb.EvaluationAssignment(
                    evaluation_id=e,
                    status=evaluation_status_pb(EvaluationStatus(s)),
                    assigned_cron_id=c or "",
                )
                for e, s, c in view.evaluations
            ],
            observed_at=to_timestamp(view.observed_at),
        )

    async def ApplyRepair(self, request, context) -> pb.ApplyRepairResponse:
        kind = repair_kind_from_pb(request.kind)
        applied, detail = await drift.apply_repair(
            self.pool, kind, request.cron_id, request.evaluation_id, context.time_remaining()
        )
        return pb.ApplyRepairResponse(applied=applied, detail=detail)
