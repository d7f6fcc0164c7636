"""The SDK honours a RetryInfo: a submit refused because its business is over its Submit
rate (RESOURCE_EXHAUSTED, nothing written) is sent again after the delay the gateway
names, within the call's timeout; without that room, or with ``retry_limited=False``, the
refusal is raised with its delay."""

import asyncio

import grpc
import pytest
from dispo.sdk import AsyncClient, Client, DispoError, TaskRequest, cell


@pytest.fixture
async def limited(start_service, catalogue_file, tokens):
    return await start_service(
        "gateway",
        {
            "DISPO_CATALOGUE": str(catalogue_file),
            "DISPO_GATEWAY_SUBMIT_RATE_PER_SECOND": "4",
            "DISPO_GATEWAY_SUBMIT_BURST": "1",
        },
    )


async def test_a_submit_over_the_rate_is_sent_again_after_its_retry_delay(limited, tokens):
    async with AsyncClient(limited.address, token=tokens.admin, gather=False) as client:
        # One at once, four a second: five in a row need their retries, and all get in.
        tasks = [
            await client.submit("shop", [cell("noop")], idempotency_key=f"k{i}") for i in range(5)
        ]
        assert len({t.task_id for t in tasks}) == 5 and not any(t.duplicate for t in tasks)
        # Gathered submits (one SubmitEach, its items refused on their own) get in too.
        gathered = await asyncio.gather(
            *(client.submit("shop", [cell("noop")], idempotency_key=f"g{i}") for i in range(3))
        )
        assert len({t.task_id for t in gathered}) == 3
        many = await client.submit_many(
            [TaskRequest("shop", [cell("noop")], idempotency_key=f"m{i}") for i in range(1)]
        )
        assert len(many) == 1


async def test_without_room_or_when_asked_not_to_the_refusal_is_raised(limited, tokens):
    async with AsyncClient(
        limited.address, token=tokens.admin, gather=False, retry_limited=False
    ) as client:
        await client.submit("shop", [cell("noop")], idempotency_key="a")
        with pytest.raises(DispoError) as refused:
            await client.submit("shop", [cell("noop")], idempotency_key="b")
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert 0 < refused.value.retry_after <= 0.25
    async with AsyncClient(limited.address, token=tokens.admin, gather=False) as client:
        await asyncio.sleep(0.3)
        await client.submit("shop", [cell("noop")], idempotency_key="c")
        with pytest.raises(DispoError) as hurried:  # a timeout shorter than the delay
            await client.submit("shop", [cell("noop")], idempotency_key="d", timeout=0.1)
        assert hurried.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_the_blocking_client_waits_as_well(limited, tokens):
    def submits() -> list:
        with Client(limited.address, token=tokens.admin, gather=False) as client:
            return [
                client.submit("shop", [cell("noop")], idempotency_key=f"s{i}") for i in range(3)
            ]

    tasks = await asyncio.to_thread(submits)
    assert len({t.task_id for t in tasks}) == 3
