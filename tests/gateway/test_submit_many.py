"""SubmitMany through the real gateway: each task recorded as its own Submit would record it,
repeated keys answered as duplicates inside a call and across calls, and a call with one
bad item refused whole, naming the item, with nothing written."""

import grpc
import pytest
from dispo.gateway.limits import MAX_SUBMIT_MANY
from dispo.sdk import DispoError, TaskRequest, cell
from support.auth import business_token


def step(name: str, key: str = "", business: str = "tests") -> TaskRequest:
    return TaskRequest(business, [cell("step", name=name)], idempotency_key=key)


async def total(client) -> int:
    return sum((await client.count()).values())


async def test_a_call_records_each_task_answers_repeated_keys_as_duplicates_and_they_run(client):
    first = await client.submit_many(
        [step("a", "k-a"), step("b"), step("a", "k-a"), step("c", "k-c")]
    )

    assert [s.duplicate for s in first] == [False, False, True, False]
    assert first[2].task_id == first[0].task_id  # one task for the key, the first item's
    assert len({s.task_id for s in first}) == 3
    assert {s.status for s in first} == {"ACCEPTED"}
    for s, name in [(first[0], "a"), (first[1], "b"), (first[3], "c")]:
        view = await client.get(s.task_id)
        assert view.raw.nodes[0].spec.path == f"/step/{name}"

    again = await client.submit_many([step("c", "k-c"), step("d", "k-d")])
    assert (again[0].task_id, again[0].duplicate) == (first[3].task_id, True)
    assert not again[1].duplicate
    single = await client.submit("tests", [cell("step", name="a")], idempotency_key="k-a")
    assert (single.task_id, single.duplicate) == (first[0].task_id, True)
    assert await total(client) == 4

    for s in [*first, again[1]]:
        assert (await client.wait(s.task_id, timeout=60)).status == "SUCCEEDED"

    # A key used for another request: that item is refused by name (the rest is recorded).
    with pytest.raises(DispoError) as refused:
        await client.submit_many([step("e", "k-e"), step("other", "k-a")])
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert set(refused.value.violations) == {"requests[1].idempotency_key"}


async def test_a_call_with_one_bad_item_is_refused_whole_and_writes_nothing(
    gateway_only, gateway_client, database_url
):
    client = gateway_client
    cases = {
        "unknown cell": (
            [step("a"), TaskRequest("tests", [cell("no_such_cell")])],
            grpc.StatusCode.INVALID_ARGUMENT,
            {"requests[1].cells[0].cell"},
        ),
        "two bad items": (
            [TaskRequest("tests", []), step("b"), TaskRequest("", [cell("step", name="c")])],
            grpc.StatusCode.INVALID_ARGUMENT,
            {"requests[0].cells", "requests[2].business"},
        ),
        "oversized payload": (
            [step("a"), step("x" * 70_000)],
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            {"requests[1].cells[0].payload"},
        ),
        "empty": ([], grpc.StatusCode.INVALID_ARGUMENT, {"requests"}),
        "over the bound": (
            [step(f"n{i}") for i in range(MAX_SUBMIT_MANY + 1)],
            grpc.StatusCode.INVALID_ARGUMENT,
            {"requests"},
        ),
        # The gateway's default burst is 200 Submits: a call of more could never pass.
        "over the rate": (
            [step(f"n{i}") for i in range(201)],
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            {"requests"},
        ),
    }
    for case, (requests, code, fields) in cases.items():
        with pytest.raises(DispoError) as refused:
            await client.submit_many(requests)
        assert refused.value.code == code, case
        assert set(refused.value.violations) == fields, (case, refused.value.violations)
    assert await total(client) == 0

    _, secret = await business_token(database_url, "tests")
    async with gateway_only.client(secret) as own:
        with pytest.raises(DispoError) as denied:
            await own.submit_many([step("a"), step("b", business="other")])
        assert denied.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert set(denied.value.violations) == {"requests[1].business"}
        assert await total(client) == 0
        accepted = await own.submit_many([step("a"), step("b", business="")])
        assert [s.duplicate for s in accepted] == [False, False]
        # Submit too: an empty business is the token's.
        assert not (await own.submit("", [cell("step", name="c")])).duplicate
    assert await client.count(business="tests") == {**await client.count(), "ACCEPTED": 3}
