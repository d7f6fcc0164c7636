"""A formal evaluation runs through the pool and worker against a real HTTP target, completes,
and its analysis appears in the intelligence service (all real processes, real NATS)."""

from __future__ import annotations

import grpc
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.intelligence.v1 import intelligence_pb2 as ipb
from dispo.libs.api.intelligence.v1 import intelligence_pb2_grpc
from dispo.libs.api.pool.v1 import pool_pb2 as pb
from dispo.libs.api.pool.v1 import pool_pb2_grpc
from outbox_subjects import assert_outbox_subjects_declared
from support import eventually
from support.auth import admin_channel


async def test_formal_evaluation_completes_and_is_analysed(
    pool_stack, start_service, target, file_clock, database_url
):
    intelligence = await start_service("intelligence", env=file_clock.env)
    pool, _ = await pool_stack()
    target.answers["/broken"] = (500, {"error": "boom"})
    async with (
        admin_channel(pool.address) as channel,
        admin_channel(intelligence.address) as ichannel,
    ):
        stub = pool_pb2_grpc.PoolServiceStub(channel)
        istub = intelligence_pb2_grpc.IntelligenceServiceStub(ichannel)
        await eventually(lambda: _pool_size(stub, 5))
        await stub.CreateEvaluation(
            pb.CreateEvaluationRequest(
                evaluation_id="formal-1",
                series="checkout-assistant",
                line=common_pb2.LINE_FORMAL,
                period="2026-01",
                configuration_json='{"prompt": "v3"}',
                target_url=target.url,
                window_seconds=120,
                slot_count=2,
                runs_per_slot=2,
                cases=[
                    pb.TestCase(
                        id="ok",
                        path="/answer",
                        rules=[
                            pb.Rule(kind=pb.RULE_KIND_STATUS, value="200"),
                            pb.Rule(
                                kind=pb.RULE_KIND_JSON_EQUALS, path="$.answer", value='"paris"'
                            ),
                        ],
                    ),
                    pb.TestCase(
                        id="broken",
                        path="/broken",
                        rules=[pb.Rule(kind=pb.RULE_KIND_STATUS, value="200")],
                    ),
                ],
            )
        )
        await eventually(lambda: _runs(stub, "formal-1", 2))
        file_clock.advance(seconds=60)  # slot 1 falls due on the tick
        done = await eventually(lambda: _completed(stub, "formal-1"), timeout=60)
        assert done.runs_done == 4

        analysis = await eventually(lambda: _analysis(istub, "formal-1"), timeout=60)
        assert analysis.stats.run_count == 4
        assert analysis.stats.pass_rate == 0.5 and analysis.stats.fail_rate == 0.5
        evaluation = await istub.GetEvaluation(ipb.GetEvaluationRequest(evaluation_id="formal-1"))
        assert evaluation.series == "checkout-assistant"
    await assert_outbox_subjects_declared(database_url, schemas={"pool"})


async def _pool_size(stub, n):
    return (await stub.GetPoolStatus(pb.GetPoolStatusRequest())).size == n


async def _runs(stub, evaluation_id, n):
    ev = await stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id=evaluation_id))
    return ev.runs_done >= n


async def _completed(stub, evaluation_id):
    ev = await stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id=evaluation_id))
    return ev if ev.status == pb.EVALUATION_STATUS_COMPLETED else None


async def _analysis(istub, evaluation_id):
    try:
        analysis = await istub.GetAnalysis(ipb.GetJobRequest(evaluation_id=evaluation_id))
    except grpc.aio.AioRpcError:
        return None
    return analysis if analysis.job.status == ipb.JOB_STATUS_COMPLETED else None
