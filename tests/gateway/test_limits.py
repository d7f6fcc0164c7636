"""Caller limits of one gateway process, through the real gRPC API: a business over its
Submit rate is refused with RESOURCE_EXHAUSTED and a RetryInfo saying when to come back,
nothing written (time is a file clock the test moves); WatchTask streams are capped per
business."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import grpc
import pytest
from dispo.libs.api.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from support import eventually
from support.auth import admin_channel

from .test_submit import counts


def submit(business: str, key: str) -> gateway_pb2.SubmitRequest:
    return gateway_pb2.SubmitRequest(
        business=business, idempotency_key=key, cells=[gateway_pb2.CellRequest(cell="noop")]
    )


def retry_delay(error: grpc.aio.AioRpcError) -> timedelta:
    status = rpc_status.from_call(error)
    assert status is not None
    delays = []
    for detail in status.details:
        info = error_details_pb2.RetryInfo()
        if detail.Unpack(info):
            delays.append(info.retry_delay.ToTimedelta())
    [delay] = delays
    return delay


@pytest.fixture
async def start_gateway(start_service, catalogue_file):
    async def start(**env: str):
        return await start_service("gateway", {"DISPO_CATALOGUE": str(catalogue_file), **env})

    return start


async def test_submits_over_the_rate_are_refused_with_when_to_retry(
    start_gateway, file_clock, service_engine
):
    gateway = await start_gateway(
        **file_clock.env,
        DISPO_GATEWAY_SUBMIT_RATE_PER_SECOND="2",
        DISPO_GATEWAY_SUBMIT_BURST="3",
    )
    async with admin_channel(gateway.address) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        for i in range(3):  # the burst
            await stub.Submit(submit("shop", f"k{i}"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Submit(submit("shop", "k3"))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "'shop'" in refused.value.details() and "2 a second" in refused.value.details()
        assert retry_delay(refused.value) == timedelta(seconds=0.5)
        assert await counts(service_engine) == (3, 3)

        await stub.Submit(submit("other", "k0"))  # its own bucket
        file_clock.advance(seconds=0.25)  # half a token: still refused, sooner
        with pytest.raises(grpc.aio.AioRpcError) as again:
            await stub.Submit(submit("shop", "k3"))
        assert retry_delay(again.value) == timedelta(seconds=0.25)
        file_clock.advance(seconds=0.25)
        await stub.Submit(submit("shop", "k3"))
        assert await counts(service_engine) == (5, 5)


async def test_watch_streams_are_capped_per_business(start_gateway):
    gateway = await start_gateway(DISPO_GATEWAY_MAX_WATCHES_PER_BUSINESS="2")
    async with admin_channel(gateway.address) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        shop = [(await stub.Submit(submit("shop", f"w{i}"))).task_id for i in range(2)]
        other = (await stub.Submit(submit("other", "w0"))).task_id

        def watch(task_id: str):
            return stub.WatchTask(gateway_pb2.WatchTaskRequest(task_id=task_id))

        # No executor: the tasks stay ACCEPTED and their streams open.
        streams = [watch(task_id) for task_id in shop]
        for stream in streams:
            assert (await stream.read()).task.task_id in shop
        third = watch(shop[0])
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await third.read()
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "2 WatchTask streams" in refused.value.details()
        theirs = watch(other)
        assert (await theirs.read()).task.task_id == other

        streams[0].cancel()  # the stream's slot is free once the gateway sees it ended

        async def opened():
            stream = watch(shop[1])
            try:
                await stream.read()
            except grpc.aio.AioRpcError:
                return None
            return stream

        again = await eventually(opened, wanted="a WatchTask stream once one ended")
        for stream in (streams[1], theirs, again):
            stream.cancel()


async def test_two_gateways_hold_a_business_to_its_submit_rate_together(
    start_gateway, file_clock, service_engine
):
    """The rate is the business's across the gateways (ADR-0108): submitting through two
    gateways at once gets no more than one bucket's worth (its burst, then its rate), and
    both gateways end up accepting part of it."""
    env = {
        **file_clock.env,
        "DISPO_GATEWAY_SUBMIT_RATE_PER_SECOND": "4",
        "DISPO_GATEWAY_SUBMIT_BURST": "4",
        "DISPO_GATEWAY_SHARE_LEASE_SECONDS": "3",
    }
    gateways = [await start_gateway(**env) for _ in range(2)]
    accepted = [0, 0]
    refused: list[grpc.aio.AioRpcError] = []
    async with admin_channel(gateways[0].address) as one, admin_channel(gateways[1].address) as two:
        stubs = [gateway_pb2_grpc.GatewayServiceStub(one), gateway_pb2_grpc.GatewayServiceStub(two)]

        async def hammer(step: int) -> None:
            for i in range(6):
                for g, stub in enumerate(stubs):
                    try:
                        await stub.Submit(submit("shop", f"s{step}-{g}-{i}"))
                        accepted[g] += 1
                    except grpc.aio.AioRpcError as error:
                        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                        assert retry_delay(error) > timedelta(0)
                        refused.append(error)

        await hammer(0)
        assert sum(accepted) == 4  # the burst, once, whichever gateway took it
        seconds = 0.0
        for step in range(1, 9):  # then half a second at a time, each gateway renewing
            file_clock.advance(seconds=0.5)
            seconds += 0.5
            await asyncio.sleep(0.5)
            await hammer(step)
            assert sum(accepted) <= 4 + 4 * seconds, (accepted, seconds)
        assert all(accepted), f"one gateway accepted nothing: {accepted}"
        assert await counts(service_engine) == (sum(accepted), sum(accepted))
