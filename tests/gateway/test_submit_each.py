"""SubmitEach through the real gateway, and the SDK's gathered submits that use it: every
item is answered in its place exactly as its own Submit would answer it — recorded, found by
its key, or refused with Submit's code and fields — and one item's refusal writes nothing
and refuses no other."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from dispo.gateway.limits import MAX_SUBMIT_MANY
from dispo.libs.api.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from dispo.libs.auth import open_channel
from dispo.sdk import AsyncClient, Client, DispoError, cell
from dispo.sdk._client import _submit_request
from google.rpc import error_details_pb2
from support.auth import business_token


def request(name: str, key: str = "", business: str = "tests") -> gateway_pb2.SubmitRequest:
    return _submit_request(business, [cell("step", name=name)], key, "")


def refusal(code: int, details) -> tuple[grpc.StatusCode, set[str], bool]:
    """A status as (code, the fields its BadRequest names, whether it carries a RetryInfo)."""
    fields, retry = set(), False
    for detail in details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            fields |= {v.field for v in bad.field_violations}
        retry = retry or detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR)
    return next(c for c in grpc.StatusCode if c.value[0] == code), fields, retry


async def total(client: AsyncClient) -> int:
    return sum((await client.count()).values())


@pytest.fixture
async def stub(gateway_only):
    channel = open_channel(gateway_only.gateway.address, gateway_only.token)
    yield gateway_pb2_grpc.GatewayServiceStub(channel)
    await channel.close()


async def test_each_item_is_answered_as_its_own_submit_and_a_refusal_refuses_no_other(
    stub, gateway_client
):
    items = [
        request("a", "k-a"),
        _submit_request("tests", [cell("no_such_cell")], "k-bad", ""),
        request("b"),
        request("a", "k-a"),  # the same key and request: the same task
        request("x" * 70_000, "k-big"),  # a payload over the limit
        request("other", "k-a"),  # the key of another request
        _submit_request("", [cell("step", name="c")], "", ""),  # no business
        request("d", "k-d"),
    ]
    reply = await stub.SubmitEach(gateway_pb2.SubmitEachRequest(requests=items))

    kinds = [o.WhichOneof("outcome") for o in reply.outcomes]
    assert kinds == [
        "accepted",
        "refused",
        "accepted",
        "accepted",
        "refused",
        "refused",
        "refused",
        "accepted",
    ]
    a, b, again, d = (reply.outcomes[i].accepted for i in (0, 2, 3, 7))
    assert (a.duplicate, b.duplicate, again.duplicate, d.duplicate) == (False, False, True, False)
    assert again.task_id == a.task_id
    refused = {i: reply.outcomes[i].refused for i in (1, 4, 5, 6)}
    assert {i: refusal(s.code, s.details) for i, s in refused.items()} == {
        1: (grpc.StatusCode.INVALID_ARGUMENT, {"cells[0].cell"}, False),
        4: (grpc.StatusCode.RESOURCE_EXHAUSTED, {"cells[0].payload"}, False),
        5: (grpc.StatusCode.FAILED_PRECONDITION, {"idempotency_key"}, False),
        6: (grpc.StatusCode.INVALID_ARGUMENT, {"business"}, False),
    }
    # Nothing but the three accepted tasks was written.
    assert await total(gateway_client) == 3
    # Each refusal is the one its own Submit gets, word for word.
    for i, status in refused.items():
        try:
            await stub.Submit(items[i])
        except grpc.aio.AioRpcError as error:
            assert (error.code().value[0], error.details()) == (status.code, status.message)
        else:
            raise AssertionError(f"item {i} was accepted alone")
    assert await total(gateway_client) == 3
    # The recorded tasks hold what their own requests asked for.
    for accepted, name in [(a, "a"), (b, "b"), (d, "d")]:
        view = await gateway_client.get(accepted.task_id)
        assert view.raw.nodes[0].spec.path == f"/step/{name}"


async def test_the_call_as_a_whole_is_refused_only_for_what_concerns_all_of_it(
    stub, gateway_client, gateway_only, database_url
):
    for items, field in [
        ([], "requests"),
        ([request(f"n{i}") for i in range(MAX_SUBMIT_MANY + 1)], "requests"),
        # Request hygiene (every call's, before the servicer): a control character.
        ([request("a", "k-a"), request("b", "k-\n")], "requests[1].idempotency_key"),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as whole:
            await stub.SubmitEach(gateway_pb2.SubmitEachRequest(requests=items))
        assert whole.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in whole.value.details()
    assert await total(gateway_client) == 0

    # A business token: an item naming another business is refused by name, alone.
    _, secret = await business_token(database_url, "tests")
    channel = open_channel(gateway_only.gateway.address, secret)
    own = gateway_pb2_grpc.GatewayServiceStub(channel)
    try:
        reply = await own.SubmitEach(
            gateway_pb2.SubmitEachRequest(
                requests=[request("a"), request("b", business="other"), request("c", business="")]
            )
        )
    finally:
        await channel.close()
    assert [o.WhichOneof("outcome") for o in reply.outcomes] == ["accepted", "refused", "accepted"]
    assert refusal(reply.outcomes[1].refused.code, reply.outcomes[1].refused.details) == (
        grpc.StatusCode.PERMISSION_DENIED,
        {"business"},
        False,
    )
    assert await gateway_client.count(business="tests") == {
        **await gateway_client.count(),
        "ACCEPTED": 2,
    }


async def test_items_past_the_business_rate_are_refused_alone_with_when_to_retry(gateway_only):
    # A bucket of three Submits that does not refill within the test.
    await gateway_only.start_gateway(
        DISPO_GATEWAY_SUBMIT_RATE_PER_SECOND="0.001", DISPO_GATEWAY_SUBMIT_BURST="3"
    )
    channel = open_channel(gateway_only.gateway.address, gateway_only.token)
    stub = gateway_pb2_grpc.GatewayServiceStub(channel)
    try:
        reply = await stub.SubmitEach(
            gateway_pb2.SubmitEachRequest(requests=[request(f"n{i}") for i in range(5)])
        )
    finally:
        await channel.close()
    assert [o.WhichOneof("outcome") for o in reply.outcomes] == ["accepted"] * 3 + ["refused"] * 2
    for outcome in reply.outcomes[3:]:
        assert refusal(outcome.refused.code, outcome.refused.details) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            set(),
            True,
        )
    async with gateway_only.client() as client:
        assert await total(client) == 3


def counting_submits(client: AsyncClient) -> list[int]:
    """Count the client's Submit calls (each one, the tasks it carried: one), leaving them
    to go through as before."""
    sent: list[int] = []
    submit = client._stub.Submit

    async def counted(request, **kwargs):
        sent.append(1)
        return await submit(request, **kwargs)

    client._stub.Submit = counted
    return sent


def each_heard_of_its_own(keys: list[str], answers: list[object], bad: int) -> None:
    """``answers``: first one per submit of ``keys`` (keyed, several callers per key), then
    ``bad`` submits of an unknown cell, then submits without a key. One task per key, and
    exactly one caller told it was first; each bad request refused to its own caller,
    naming its own field; every other submit accepted."""
    by_key: dict[str, set[str]] = {}
    firsts: dict[str, int] = {}
    for key, answer in zip(keys, answers[: len(keys)], strict=True):
        assert not isinstance(answer, BaseException), answer
        by_key.setdefault(key, set()).add(answer.task_id)
        firsts[key] = firsts.get(key, 0) + (not answer.duplicate)
    assert all(len(ids) == 1 for ids in by_key.values())
    assert set(firsts.values()) == {1}
    for answer in answers[len(keys) : len(keys) + bad]:
        assert isinstance(answer, DispoError)
        assert answer.code == grpc.StatusCode.INVALID_ARGUMENT
        assert set(answer.violations) == {"cells[0].cell"}
    assert all(not isinstance(a, BaseException) for a in answers[len(keys) + bad :])


async def test_concurrent_sdk_submits_are_gathered_and_each_caller_hears_only_of_its_own(
    gateway_only, gateway_client
):
    """199 submits at once through one client: carried by SubmitEach calls, not a Submit
    each; one task per key however many callers raced with it; each bad request raised to
    its own caller only, naming its own field."""
    keys = [f"race-{i % 50}" for i in range(150)]  # 50 keys, each sent by three callers
    async with gateway_only.client() as client:
        assert client.gathered is not None
        submits = counting_submits(client)
        calls = [client.submit("tests", [cell("step", name=k)], idempotency_key=k) for k in keys]
        calls += [client.submit("tests", [cell("no_such_cell")]) for _ in range(25)]
        calls += [client.submit("tests", [cell("step", name="n")]) for _ in range(24)]
        answers = await asyncio.gather(*calls, return_exceptions=True)
        flushes, items = client.gathered.flushes, client.gathered.flushed_items

    each_heard_of_its_own(keys, answers, bad=25)
    # 50 keyed tasks and 24 without a key, nothing else.
    assert await total(gateway_client) == 74
    assert items == 199 and flushes < 10, (flushes, items)  # many submits per call
    assert len(submits) <= flushes  # by SubmitEach: a Submit only for a call of one


async def test_a_gathered_call_refused_whole_is_sent_again_one_submit_each(
    gateway_only, gateway_client
):
    """A control character in one key fails the request hygiene of the whole SubmitEach,
    before anything is written: every item is then sent by a Submit of its own, so only
    that caller hears of it."""
    async with gateway_only.client() as client:
        submits = counting_submits(client)
        calls = [client.submit("tests", [cell("step", name=f"n{i}")]) for i in range(9)]
        calls.append(client.submit("tests", [cell("step", name="z")], idempotency_key="k-\n"))
        answers = await asyncio.gather(*calls, return_exceptions=True)
    assert all(not isinstance(a, BaseException) for a in answers[:9]), answers
    assert isinstance(answers[9], DispoError)
    assert answers[9].code == grpc.StatusCode.INVALID_ARGUMENT
    assert set(answers[9].violations) == {"idempotency_key"}
    assert len(submits) >= 10  # every item of the refused call, by a Submit of its own
    assert await total(gateway_client) == 9  # each once: the refused call wrote nothing


async def test_a_gathered_submit_that_runs_out_of_time_raises_deadline_exceeded(gateway_only):
    async with AsyncClient(gateway_only.gateway.address, token=gateway_only.token) as client:
        with pytest.raises(DispoError) as late:
            await client.submit("tests", [cell("step", name="a")], timeout=0)
    assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_the_blocking_client_gathers_the_submits_of_racing_threads(
    gateway_only, gateway_client
):
    """One blocking client shared by 32 threads: their submits are carried by fewer calls
    than submits; one task per key however many threads raced with it; a bad request is
    raised in its own thread only, naming its own field."""
    keys = [f"thread-{i % 40}" for i in range(120)]  # 40 keys, each sent by three threads

    def race() -> tuple[list[object], int, int]:
        with Client(gateway_only.gateway.address, token=gateway_only.token) as client:
            assert client.gathered is not None

            def one(i: int) -> object:
                try:
                    if i < 120:
                        return client.submit(
                            "tests", [cell("step", name=keys[i])], idempotency_key=keys[i]
                        )
                    if i < 140:
                        return client.submit("tests", [cell("no_such_cell")])
                    return client.submit("tests", [cell("step", name="n")])
                except DispoError as error:
                    return error

            with ThreadPoolExecutor(max_workers=32) as pool:
                answers = list(pool.map(one, range(160)))
            return answers, client.gathered.flushes, client.gathered.flushed_items

    answers, flushes, items = await asyncio.to_thread(race)
    each_heard_of_its_own(keys, answers, bad=20)
    assert await total(gateway_client) == 40 + 20  # 40 keyed tasks and 20 without a key
    assert items == 160 and flushes < 160, (flushes, items)  # many submits per call


async def test_a_blocking_submit_that_runs_out_of_time_raises_deadline_exceeded(gateway_only):
    def late() -> DispoError:
        with Client(gateway_only.gateway.address, token=gateway_only.token) as client:
            with pytest.raises(DispoError) as raised:
                client.submit("tests", [cell("step", name="a")], timeout=0)
            return raised.value

    assert (await asyncio.to_thread(late)).code == grpc.StatusCode.DEADLINE_EXCEEDED
