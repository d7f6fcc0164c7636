"""An evaluation may name only an analysis model the intelligence service has registered:
CreateEvaluation asks it (real pool and intelligence processes, the pool calling with its own
service token) and refuses any other name, naming the field, with nothing queued."""

from __future__ import annotations

import grpc
import pytest
from dispo.libs.api.pool.v1 import pool_pb2 as pb
from dispo.libs.api.pool.v1 import pool_pb2_grpc
from dispo.libs.process import free_port
from support.auth import admin_channel

from .test_egress import request, violations


async def _queue_depth(stub) -> int:
    return (await stub.GetPoolStatus(pb.GetPoolStatusRequest())).queue_depth


async def test_an_unregistered_analysis_model_is_refused(pool_stack, start_service, target):
    intelligence = await start_service("intelligence")
    pool, _ = await pool_stack(DISPO_POOL_INTELLIGENCE_ADDRESS=intelligence.address)
    async with admin_channel(pool.address) as channel:
        stub = pool_pb2_grpc.PoolServiceStub(channel)
        ghost = request(target.url, evaluation_id="ghost-model")
        ghost.analysis_model = "ghost"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.CreateEvaluation(ghost)
        assert "'ghost' is not registered" in refused.value.details()
        assert "stats" in refused.value.details()  # what may be named instead
        assert await violations(stub.CreateEvaluation(ghost)) == ["analysis_model"]
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id="ghost-model"))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        assert await _queue_depth(stub) == 0

        stats = request(target.url, evaluation_id="stats-model")
        stats.analysis_model = "stats"
        created = await stub.CreateEvaluation(stats)
        assert created.analysis_model == "stats"
        assert await _queue_depth(stub) == 1


async def test_no_intelligence_service_to_ask_is_unavailable(pool_stack, target):
    nowhere = f"127.0.0.1:{free_port()}"
    pool, _ = await pool_stack(DISPO_POOL_INTELLIGENCE_ADDRESS=nowhere)
    async with admin_channel(pool.address) as channel:
        stub = pool_pb2_grpc.PoolServiceStub(channel)
        named = request(target.url, evaluation_id="named-model")
        named.analysis_model = "stats"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.CreateEvaluation(named)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "analysis_model" in refused.value.details()
        assert await _queue_depth(stub) == 0
        # The default model needs no asking.
        await stub.CreateEvaluation(request(target.url, evaluation_id="default-model"))
        assert await _queue_depth(stub) == 1
