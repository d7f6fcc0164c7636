"""Submit: refusals with nothing written (an envelope the bus could not carry included),
idempotency under concurrent duplicates."""

import asyncio

import grpc
import pytest
from dispo.gateway.expand import CellRequest, Submission
from dispo.libs.api.auth.v1 import auth_pb2, auth_pb2_grpc
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from dispo.libs.bus import Bus
from dispo.libs.contracts import tasks
from dispo.libs.errors import ResourceExhausted
from dispo.sdk import DispoError, cell
from outbox_subjects import rows_written
from sqlalchemy import text
from support.auth import admin_channel
from support.nats import nats_with_max_payload


async def counts(service_engine):
    """Tasks, and outbox rows ever written (:func:`rows_written`)."""
    engine = await service_engine("gateway")
    async with engine.connect() as conn:
        tasks = (await conn.execute(text("SELECT count(*) FROM tasks"))).scalar()
        outbox = (await conn.execute(text(rows_written()))).scalar()
    return tasks, outbox


BAD_SUBMISSIONS = {
    "unknown-cell": ([cell("no_such_cell")], grpc.StatusCode.INVALID_ARGUMENT, "cells[0].cell"),
    "cycle": (
        [cell("step", ref="a", name="a").after("b"), cell("step", ref="b", name="b").after("a")],
        grpc.StatusCode.INVALID_ARGUMENT,
        "cells",
    ),
    "self-dependency": (
        [cell("step", ref="a", name="a").after("a")],
        grpc.StatusCode.INVALID_ARGUMENT,
        "cells[0].depends_on[0]",
    ),
    "unknown-ref": (
        [cell("step", ref="a", name="a").after("zzz")],
        grpc.StatusCode.INVALID_ARGUMENT,
        "cells[0].depends_on[0]",
    ),
    "missing-field": ([cell("step")], grpc.StatusCode.INVALID_ARGUMENT, "cells[0].payload.name"),
    "wrong-type": (
        [cell("step", name=7)],
        grpc.StatusCode.INVALID_ARGUMENT,
        "cells[0].payload.name",
    ),
    "unknown-field": (
        [cell("step", name="a", extra=1)],
        grpc.StatusCode.INVALID_ARGUMENT,
        "cells[0].payload.extra",
    ),
    "duplicate-ref": (
        [cell("step", name="a"), cell("step", name="b")],
        grpc.StatusCode.INVALID_ARGUMENT,
        "cells[1].ref",
    ),
    "oversized-payload": (
        [cell("step", name="x" * 70_000)],
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "cells[0].payload",
    ),
    "too-many-cells": (
        [cell("noop", ref=f"n{i}") for i in range(51)],
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "cells",
    ),
    "no-cells": ([], grpc.StatusCode.INVALID_ARGUMENT, "cells"),
    # a NUL inside a payload would fail every later consumer that stores it as text
    "nul-in-payload": (
        [cell("step", name="a\x00b")],
        grpc.StatusCode.INVALID_ARGUMENT,
        "cells[0].payload_json.name",
    ),
}


async def test_bad_submissions_are_refused_with_the_field_and_nothing_written(
    gateway_client, service_engine
):
    """Cycle, unknown cell, oversized payload and the other refusals: one gateway, every case."""
    client = gateway_client
    for case, (cells, code, field) in BAD_SUBMISSIONS.items():
        with pytest.raises(DispoError) as refused:
            await client.submit("tests", cells, idempotency_key=f"k-{case}")
        assert refused.value.code == code, case
        assert field in refused.value.violations, (case, refused.value.violations)

    assert await counts(service_engine) == (0, 0)


async def test_a_submit_the_catalogue_refuses_leases_no_share_of_the_rate(
    gateway_only, service_engine
):
    """The cells are checked against the catalogue before the business's Submit rate is
    counted (ADR-0108): a refused Submit, SubmitEach or SubmitMany of a business the gateway
    holds no share of leaves limit_shares as it was, empty."""
    bad = gateway_pb2.SubmitRequest(
        business="fresh", cells=[gateway_pb2.CellRequest(cell="no_such_cell")]
    )
    async with admin_channel(gateway_only.gateway.address) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Submit(bad)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert set(DispoError.from_rpc(refused.value).violations) == {"cells[0].cell"}
        each = await stub.SubmitEach(gateway_pb2.SubmitEachRequest(requests=[bad, bad]))
        assert [o.WhichOneof("outcome") for o in each.outcomes] == ["refused", "refused"]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.SubmitMany(gateway_pb2.SubmitManyRequest(requests=[bad]))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    engine = await service_engine("gateway")
    async with engine.connect() as conn:
        shares = (await conn.execute(text("SELECT count(*) FROM limit_shares"))).scalar()
    assert shares == 0
    assert await counts(service_engine) == (0, 0)


async def test_bad_business_and_callback_are_refused(gateway_client, service_engine):
    client = gateway_client
    with pytest.raises(DispoError) as refused:
        await client.submit("", [cell("noop")], callback_url="ftp://x")
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert set(refused.value.violations) == {"business", "callback_url"}
    assert await counts(service_engine) == (0, 0)


async def test_submit_and_create_token_share_one_business_name_rule(
    gateway_only, gateway_client, service_engine
):
    # Longer than Submit allowed, or dotted: tenant-a.evil's callback subjects
    # (callbacks.tenant-a.evil.…) would lie inside tenant-a's.
    refused_names = ["b" * 65, "b" * 128, "tenant-a.evil", "a.b", "-lead", ""]
    async with admin_channel(gateway_only.gateway.address) as channel:
        tokens = auth_pb2_grpc.TokenServiceStub(channel)
        for name in refused_names:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await tokens.CreateToken(
                    auth_pb2.CreateTokenRequest(kind=auth_pb2.TOKEN_KIND_BUSINESS, business=name)
                )
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            assert set(DispoError.from_rpc(refused.value).violations) == {"business"}, name
            with pytest.raises(DispoError) as refused_submit:
                await gateway_client.submit(name, [cell("noop")])
            assert refused_submit.value.code == grpc.StatusCode.INVALID_ARGUMENT, name
            assert set(refused_submit.value.violations) == {"business"}, name
        listed = await tokens.ListTokens(auth_pb2.ListTokensRequest(include_revoked=True))
        assert not [t for t in listed.tokens if t.kind == auth_pb2.TOKEN_KIND_BUSINESS]
        assert await counts(service_engine) == (0, 0)

        longest = "b" * 64  # what both accept
        made = await tokens.CreateToken(
            auth_pb2.CreateTokenRequest(kind=auth_pb2.TOKEN_KIND_BUSINESS, business=longest)
        )
        assert made.token.business == longest
    assert not (await gateway_client.submit(longest, [cell("noop")])).duplicate


async def test_hostile_strings_are_refused_before_the_database(gateway_client, service_engine):
    client = gateway_client
    with pytest.raises(DispoError) as refused:
        await client.submit("tests\n", [cell("noop")], idempotency_key="k\x00")
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert set(refused.value.violations) == {"business", "idempotency_key"}
    with pytest.raises(DispoError) as refused:
        await client.get("t\x00")
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert set(refused.value.violations) == {"task_id"}
    assert await counts(service_engine) == (0, 0)


async def test_twenty_concurrent_duplicates_get_one_task(client, service_engine, bus):
    cells = [cell("step", name="dup")]

    results = await asyncio.gather(
        *(client.submit("tests", cells, idempotency_key="same-key") for _ in range(20))
    )

    assert len({r.task_id for r in results}) == 1
    assert sum(not r.duplicate for r in results) == 1
    assert await counts(service_engine) == (1, 1)
    done = await client.wait(results[0].task_id, timeout=30)
    assert done.status == "SUCCEEDED"
    again = await client.submit("tests", cells, idempotency_key="same-key")
    assert (again.task_id, again.duplicate, again.status) == (results[0].task_id, True, "SUCCEEDED")


async def test_same_key_other_business_is_another_task_and_other_request_is_refused(
    gateway_client, service_engine
):
    client = gateway_client
    first = await client.submit("tests", [cell("step", name="a")], idempotency_key="k1")
    other_business = await client.submit("other", [cell("step", name="a")], idempotency_key="k1")
    assert other_business.task_id != first.task_id
    with pytest.raises(DispoError) as refused:
        await client.submit("tests", [cell("step", name="b")], idempotency_key="k1")
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert await counts(service_engine) == (2, 2)


async def test_accepted_task_is_expanded_into_the_dag(gateway_client):
    client = gateway_client
    task = await client.submit(
        "tests", [cell("pair", name="p"), cell("step", name="s").after("pair")]
    )

    view = await client.get(task.task_id)

    assert [n.node_id for n in view.nodes] == ["pair.first", "pair.second", "step.call"]
    assert view.node("pair.second").depends_on == ("pair.first",)
    assert view.node("step.call").depends_on == ("pair.second",)  # after the pair's last action
    spec = view.raw.nodes[2].spec
    assert (spec.kind, spec.downstream, spec.path, spec.idempotent) == (
        "http",
        "demo",
        "/step/s",
        True,
    )
    assert view.raw.nodes[2].idempotency_key == f"{task.task_id}/step.call"


# ---- the envelope must fit the bus ----------------------------------------------------

CELL_BYTES = 63_000  # under the 64 KB limit of one cell's payload


def notes(count: int, size: int = CELL_BYTES) -> list:
    return [cell("note", ref=f"n{i}", text="x" * size) for i in range(count)]


async def test_seventeen_cells_of_63_kb_are_refused_with_the_size_and_the_limit(
    gateway_client, service_engine
):
    with pytest.raises(DispoError) as refused:
        await gateway_client.submit("tests", notes(17), idempotency_key="too-large")
    error = refused.value
    assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "cells" in error.violations
    assert "at most 1048576 bytes per message" in error.message
    assert "the task's envelope is 107" in error.message  # 17 x 63 000 bytes and the rest
    assert await counts(service_engine) == (0, 0)


async def test_a_large_envelope_that_fits_is_accepted_and_runs(client, service_engine):
    task = await client.submit("tests", notes(15), idempotency_key="fits")
    done = await client.wait(task.task_id, timeout=60)
    assert done.status == "SUCCEEDED"
    assert await counts(service_engine) == (1, 1)


async def test_the_limit_is_the_one_the_server_announces(make_gateway, tmp_path, service_engine):
    """The same task fits a default server and is refused by one carrying 64 KB messages."""
    sub = Submission(
        "tests", [CellRequest("note", f"n{i}", {"text": "x" * 20_000}) for i in range(3)]
    )
    accepted = await make_gateway().submit(sub)
    assert not accepted.duplicate
    with nats_with_max_payload(tmp_path / "nats", 64 * 1024) as server:
        small = await Bus.connect([server.url], name="test-small", credentials=server.credentials())
        try:
            assert small.max_payload == 64 * 1024
            gateway = make_gateway()
            gateway.relay.bus = small
            with pytest.raises(ResourceExhausted, match="at most 65536 bytes per message"):
                await gateway.submit(sub)
        finally:
            await small.close()
    assert await counts(service_engine) == (1, 1)


async def test_a_task_whose_task_create_was_quarantined_can_be_cancelled(
    make_gateway, service_engine
):
    """The operator's way out for a task whose task.create was set aside: a cancel takes
    the row back (it was never published) and the task ends CANCELLED."""
    gateway = make_gateway()  # its relay is not running: the row stays unsent
    accepted = await gateway.submit(Submission("tests", [CellRequest("noop")]))
    engine = await service_engine("gateway")
    async with engine.begin() as conn:
        marked = await conn.execute(
            text(
                "UPDATE outbox SET quarantined_at = now(), attempts = 8, last_error = 'x'"
                " WHERE msg_id = :id"
            ),
            {"id": accepted.task_id},
        )
        assert marked.rowcount == 1
    view = await gateway.cancel(accepted.task_id)
    assert view.status == common_pb2.TASK_STATUS_CANCELLED
    async with engine.connect() as conn:
        left = (await conn.execute(text("SELECT subject FROM outbox"))).scalars().all()
    assert left == [tasks.TASK_CANCEL]


async def test_priority_outside_1_to_5_is_refused_naming_priority(gateway_client, service_engine):
    for priority in (-1, 6):
        with pytest.raises(DispoError) as refused:
            await gateway_client.submit("tests", [cell("noop")], priority=priority)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT, priority
        assert set(refused.value.violations) == {"priority"}, priority
    assert await counts(service_engine) == (0, 0)


async def test_a_business_token_submits_at_most_its_max_priority_and_lists_show_it(
    gateway_only, service_engine
):
    from dispo.sdk import AsyncClient

    address = gateway_only.gateway.address
    async with admin_channel(address) as channel:
        tokens = auth_pb2_grpc.TokenServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await tokens.CreateToken(
                auth_pb2.CreateTokenRequest(kind=auth_pb2.TOKEN_KIND_ADMIN, max_priority=2)
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert set(DispoError.from_rpc(refused.value).violations) == {"max_priority"}
        made = await tokens.CreateToken(
            auth_pb2.CreateTokenRequest(
                kind=auth_pb2.TOKEN_KIND_BUSINESS, business="bulk", max_priority=3
            )
        )
        assert made.token.max_priority == 3
    async with AsyncClient(address, token=made.secret) as bulk:
        for priority in (1, 2):
            with pytest.raises(DispoError) as denied:
                await bulk.submit("bulk", [cell("noop")], priority=priority)
            assert denied.value.code == grpc.StatusCode.PERMISSION_DENIED, priority
            assert set(denied.value.violations) == {"priority"}, priority
        assert await counts(service_engine) == (0, 0)
        low = await bulk.submit("bulk", [cell("noop")], priority=5)
        usual = await bulk.submit("bulk", [cell("noop")])  # 3, its maximum
        listed = {t.task_id: t.priority async for t in bulk.list()}
        assert listed == {low.task_id: 5, usual.task_id: 3}
        assert (await bulk.get(low.task_id)).priority == 5
