"""GetTask, ListTaskEvents, ListTasks, CountTasks, CancelTask, WatchTask and ListCells
through the real gateway."""

import asyncio
from datetime import timedelta

import grpc
import pytest
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from dispo.libs.grpcserver import ECHO_LIMIT_BYTES
from dispo.sdk import AsyncClient, Client, DispoError, cell
from pipeline_fixtures import dump
from support import eventually
from support.auth import admin_channel, business_token


async def test_get_task_and_its_events_show_every_node_with_attempts_errors_and_times(
    pipeline, client, downstream, database_url, bus
):
    await downstream.control(fail={"status": 503, "times": 1, "path": "/step/g"})
    task = await client.submit(
        "tests", [cell("step", name="g"), cell("noop")], callback_url="nats:callbacks.tests.done"
    )

    await client.wait(task.task_id, timeout=30)
    done = await client.get(task.task_id)
    await check_events(pipeline, client, database_url, bus, done)

    node = done.node("step.call")
    assert (node.status, node.attempts) == ("SUCCEEDED", 2)
    assert (
        node.started_at is not None
        and node.finished_at is not None
        and node.finished_at >= node.started_at
    )
    assert done.version > 0
    # "finished" is the gateway's completion fact; notifying the caller is the reconciler's
    assert done.completion.finished_at >= node.finished_at
    assert done.completion.callback_url == "nats:callbacks.tests.done"


async def check_events(pipeline, client, database_url, bus, done):
    """ListTaskEvents of a finished task whose step.call failed once with a 503: every
    snapshot in order, the retry visible as node transitions, pages that join up; another
    business's token is NOT_FOUND, bad input names its field."""
    task_id = done.task_id
    events = await client.events(task_id)
    # Each read's consumer is gone after it (the gateway's bus user may delete it).
    assert [c.name for c in await bus.js.consumers_info("TASK_STATUS")] == ["gateway-status"]
    assert [e.sequence for e in events] == sorted({e.sequence for e in events})
    assert [e.version for e in events] == sorted({e.version for e in events})
    assert events[-1].version == done.version
    assert events[0].previous_status == ""
    assert events[-1].status == "SUCCEEDED"
    assert {e.publisher for e in events} == {"executor"}
    for before, after in zip(events, events[1:], strict=False):
        assert after.previous_status == before.status
    assert all(e.time is not None for e in events)
    # Each node's changes, chained: each starts where the one before ended.
    call = [c for e in events for c in e.changes if c.node_id == "step.call"]
    # (How many snapshots a run takes is the executor's business: it may publish several
    # of a node's steps at once. What they say must join up.)
    assert call[0].old_status == ""
    for before, after in zip(call, call[1:], strict=False):
        assert (after.old_status, after.old_attempts) == (before.new_status, before.new_attempts)
    assert (call[-1].new_status, call[-1].new_attempts) == ("SUCCEEDED", 2), call
    # The 503 is said once, with the first attempt; the retry is the second.
    errors = [c for c in call if c.last_error]
    assert len(errors) == 1 and "HTTP 503" in errors[0].last_error, call
    assert errors[0].new_attempts == 1 and errors[0].new_status != "SUCCEEDED", call
    assert any((c.old_attempts, c.new_attempts) == (1, 2) for c in call), call
    noop = [c for e in events for c in e.changes if c.node_id == "noop.noop"]
    assert [(c.old_status, c.new_status) for c in noop] == [("", "SUCCEEDED")]

    # Pages of one event join up into the same history.
    paged, token = [], ""
    while True:
        page = await client.events_page(task_id, page_size=1, page_token=token)
        paged.extend(page.events)
        assert len(page.events) <= 1
        token = page.next_page_token
        if not page.more:
            break
    assert tuple(paged) == events
    assert token  # the last page's token continues after its event
    later = await client.events_page(task_id, page_token=token)
    assert (later.events, later.more, later.next_page_token) == ((), False, "")

    _, secret = await business_token(database_url, "events-other")
    async with pipeline.client(secret) as other:
        for missing in (task_id, "0" * 32):
            with pytest.raises(DispoError) as hidden:
                await other.events(missing)
            assert hidden.value.code == grpc.StatusCode.NOT_FOUND
            with pytest.raises(DispoError) as as_get:
                await other.get(missing)
            assert as_get.value.message == hidden.value.message
    for task, page_size, bad_token, field in (
        ("", 1, "", "task_id"),
        ("a" * 65, 1, "", "task_id"),
        ("a.b", 1, "", "task_id"),
        ("a*", 1, "", "task_id"),
        (task_id, -1, "", "page.page_size"),
        (task_id, 1, "garbage!", "page.page_token"),
        ("0" * 32, 1, token, "page.page_token"),  # another task's token
    ):
        with pytest.raises(DispoError) as refused:
            await client.events_page(task, page_size=page_size, page_token=bad_token)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert set(refused.value.violations) == {field}


async def test_unknown_task_is_not_found(gateway_client):
    client = gateway_client
    for call in (client.get, client.cancel):
        with pytest.raises(DispoError) as missing:
            await call("nope")
        assert missing.value.code == grpc.StatusCode.NOT_FOUND


async def test_a_very_long_task_id_is_not_found_naming_it_cut_short(gateway_client):
    # Echoed whole, a 7,000-character id overflows the status's metadata and the caller
    # sees RESOURCE_EXHAUSTED instead of the answer.
    long_id = "t" * 7_000
    for call in (gateway_client.get, gateway_client.cancel):
        with pytest.raises(DispoError) as missing:
            await call(long_id)
        assert missing.value.code == grpc.StatusCode.NOT_FOUND
        assert missing.value.message.startswith("no task 'ttt")
        assert missing.value.message.endswith("…")
        assert len(missing.value.message.encode()) <= ECHO_LIMIT_BYTES


async def test_list_tasks_filters_and_pages(client):
    ids = {}
    for business in ("a", "b"):
        ids[business] = [
            (await client.submit(business, [cell("noop", ref=f"n{i}")])).task_id for i in range(5)
        ]
    for task_id in ids["a"] + ids["b"]:
        await client.wait(task_id, timeout=30)

    listed = [t async for t in client.list(business="a", page_size=2)]
    assert [t.task_id for t in listed] == ids["a"][::-1]  # newest first
    assert {(t.status, t.node_count, t.terminal) for t in listed} == {("SUCCEEDED", 1, True)}
    oldest = [t async for t in client.list(business="a", page_size=2, order="oldest")]
    assert [t.task_id for t in oldest] == ids["a"]
    assert [t async for t in client.list(statuses=["FAILED"])] == []
    assert len([t async for t in client.list(statuses=["SUCCEEDED"], page_size=3)]) == 10
    page = await client.list_page(business="a", page_size=4)
    assert ([t.task_id for t in page.tasks], page.more) == (ids["a"][:0:-1], True)
    last_page = await client.list_page(business="a", page_size=4, page_token=page.next_page_token)
    assert ([t.task_id for t in last_page.tasks], last_page.more) == ([ids["a"][0]], False)
    assert last_page.next_page_token == ""
    exact = await client.list_page(business="a", page_size=5)
    assert (len(exact.tasks), exact.more) == (5, False)
    with pytest.raises(DispoError) as other_order:  # a cursor belongs to its order
        await client.list_page(business="a", page_token=page.next_page_token, order="oldest")
    assert other_order.value.violations == {
        "page.page_token": "not a token from a previous response"
    }
    first, last = oldest[0].created_at, oldest[-1].created_at
    assert first is not None and last is not None
    window = [
        t.task_id
        async for t in client.list(
            business="a", created_after=first, created_before=last, order="oldest"
        )
    ]
    assert window == ids["a"][:-1]  # [after, before)
    assert [t async for t in client.list(created_after=last + timedelta(days=1))] == []


async def test_list_tasks_refuses_a_forged_cursor(gateway_only):
    pipeline = gateway_only
    async with admin_channel(pipeline.gateway.address) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ListTasks(gateway_pb2.ListTasksRequest(page={"page_token": "garbage!"}))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as bad_order:
            await stub.ListTasks(gateway_pb2.ListTasksRequest(order=7))  # type: ignore[arg-type]
    assert bad_order.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert DispoError.from_rpc(bad_order.value).violations == {
        "order": "must be TASK_ORDER_NEWEST_FIRST or TASK_ORDER_OLDEST_FIRST"
    }


def status_counts(**given: int) -> dict[str, int]:
    """CountTasks' answer: every status, ``given`` ones as given, the others 0."""
    names = [common_pb2.TaskStatus.Name(v).removeprefix("TASK_STATUS_") for v in range(1, 8)]
    return {name: given.get(name, 0) for name in names}


async def test_tasks_are_found_by_idempotency_key_and_counted_exactly_by_status(
    pipeline, downstream, database_url
):
    await downstream.control(
        fail={"status": 400, "times": 2, "path": "/step/bad-"}, hold={"path": "/step/held"}
    )
    async with pipeline.client() as admin:
        ok = [
            await admin.submit("count-a", [cell("noop")], idempotency_key=f"k-{i}")
            for i in range(3)
        ]
        failing = [await admin.submit("count-a", [cell("step", name=f"bad-{i}")]) for i in range(2)]
        held = await admin.submit(
            "count-a",
            [
                cell("step", ref="first", name="held"),
                cell("step", ref="second", name="after").after("first"),
            ],
        )
        theirs = await admin.submit("count-b", [cell("noop")], idempotency_key="k-0")
        for task in [*ok, *failing, theirs]:
            await admin.wait(task.task_id, timeout=30)
        await downstream.wait_held()
        await admin.cancel(held.task_id)
        await wait_for_cancel_flag(admin, held.task_id)
        assert await admin.count(business="count-a") == status_counts(
            SUCCEEDED=3, FAILED=2, RUNNING=1
        )
        await downstream.control(release=True)
        assert (await admin.wait(held.task_id, timeout=30)).status == "CANCELLED"

        assert await admin.count(business="count-a") == status_counts(
            SUCCEEDED=3, FAILED=2, CANCELLED=1
        )
        assert await admin.count() == status_counts(SUCCEEDED=4, FAILED=2, CANCELLED=1)
        assert await admin.count(idempotency_key="k-0") == status_counts(SUCCEEDED=2)
        created = {t.task_id: t.created_at async for t in admin.list(business="count-a")}
        first, later = created[ok[0].task_id], created[ok[1].task_id]
        assert first is not None and later is not None
        assert await admin.count(
            business="count-a", created_after=first, created_before=later
        ) == status_counts(SUCCEEDED=1)  # [after, before)

        by_key = [t.task_id async for t in admin.list(idempotency_key="k-1")]
        assert by_key == [ok[1].task_id]
        assert [t.task_id async for t in admin.list(idempotency_key="k-0")] == [
            theirs.task_id,
            ok[0].task_id,
        ]  # the key is unique per business: one task of each, newest first
        assert [t.task_id async for t in admin.list(business="count-a", idempotency_key="k-0")] == [
            ok[0].task_id
        ]
        assert [t async for t in admin.list(idempotency_key="k-0", statuses=["FAILED"])] == []
        assert [t async for t in admin.list(idempotency_key="no-such-key")] == []

        too_long = "k" * 129
        for call in (admin.list_page, admin.count):
            with pytest.raises(DispoError) as refused:
                await call(idempotency_key=too_long)
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.violations == {"idempotency_key": "longer than 128 characters"}

    # A business token lists and counts its own business only, the key included.
    _, secret = await business_token(database_url, "count-b")
    async with pipeline.client(secret) as own:
        assert [t.task_id async for t in own.list(idempotency_key="k-0")] == [theirs.task_id]
        assert [t async for t in own.list(idempotency_key="k-1")] == []
        assert await own.count() == status_counts(SUCCEEDED=1)
        assert await own.count(idempotency_key="k-1") == status_counts()
        for call in (own.list_page, own.count):
            with pytest.raises(DispoError) as denied:
                await call(business="count-a", idempotency_key="k-1")
            assert denied.value.code == grpc.StatusCode.PERMISSION_DENIED
            assert set(denied.value.violations) == {"business"}


async def test_cancel_cancels_pending_nodes_and_lets_the_running_one_finish(client, downstream):
    await downstream.control(hold={"path": "/step/first"})
    task = await client.submit(
        "tests",
        [
            cell("step", ref="first", name="first"),
            cell("step", ref="second", name="second").after("first"),
        ],
    )
    await downstream.wait_held()

    cancelled = await client.cancel(task.task_id)
    assert cancelled.cancel_requested
    await wait_for_cancel_flag(client, task.task_id)
    await downstream.control(release=True)  # the running call now finishes (with a 503)
    done = await client.wait(task.task_id, timeout=30)

    assert done.status == "CANCELLED", dump(done)
    assert done.node("second.call").status == "CANCELLED"
    assert f"{task.task_id}/second.call" not in await downstream.calls()
    with pytest.raises(DispoError) as refused:
        await client.cancel(task.task_id)
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION


async def wait_for_cancel_flag(client, task_id):
    """Until the executor has recorded the cancel: while the first call is held nothing else
    changes, so its status event (version 2, after the claim's version 1) is that record."""
    view = await eventually(
        lambda: client.get(task_id),
        lambda view: view.version >= 2,
        timeout=20,
        wanted="the executor recording the cancel",
        describe=dump,
    )
    assert view.raw.cancel_requested and view.node("first.call").status == "RUNNING", dump(view)


async def test_cancel_before_publication_withdraws_the_task(pipeline, downstream, infra, bus):
    async with pipeline.client() as client:
        infra.nats.stop()  # the outbox cannot publish: the task.create is still ours
        task = await client.submit("tests", [cell("step", name="never")])
        cancelled = await client.cancel(task.task_id)
        infra.restart_nats()
        settled = await client.submit("tests", [cell("noop")])  # flushes the outbox behind it
        await client.wait(settled.task_id, timeout=60)

        done = await client.get(task.task_id)

    assert cancelled.status == "CANCELLED" and done.status == "CANCELLED"
    assert done.node_statuses == {"step.call": "CANCELLED"}
    assert await downstream.calls() == {}


async def test_watch_streams_changes_until_terminal(client):
    task = await client.submit("tests", [cell("pair", name="w")])

    seen = [view async for view in client.watch(task.task_id)]

    assert seen[-1].status == "SUCCEEDED"
    assert [v.version for v in seen] == sorted(
        {v.version for v in seen}
    )  # each change once, in order
    assert len(seen) >= 2


async def test_list_cells_reads_the_catalogue(gateway_only):
    pipeline = gateway_only
    async with admin_channel(pipeline.gateway.address) as channel:
        reply = await gateway_pb2_grpc.GatewayServiceStub(channel).ListCells(
            gateway_pb2.ListCellsRequest()
        )
    cells = {c.name: c for c in reply.cells}
    assert set(cells) == {
        "ticket",
        "tell",
        "review_and_close",
        "sized",
        "step",
        "step_once",
        "quick_step",
        "quick_once",
        "late_once",
        "pair",
        "narrow_step",
        "set_level",
        "noop",
        "note",
        "review",
        "lenient_review",
        "tagged",
    }
    assert list(cells["tagged"].labels) == ["content_id", "rank"]
    assert list(cells["step"].labels) == []
    assert [a.name for a in cells["pair"].actions] == ["first", "second"]
    assert list(cells["pair"].actions[1].depends_on) == ["first"]
    assert cells["step"].fields[0].required
    assert cells["step"].fields[0].type == gateway_pb2.FIELD_TYPE_STRING
    assert cells["step"].actions[0].kind == gateway_pb2.ACTION_KIND_HTTP
    assert cells["noop"].actions[0].kind == gateway_pb2.ACTION_KIND_NOOP
    # How long an effect may land after its request: declared, or ten times the call's
    # timeout and at least 30 s (the demo downstream's 5 s; quick_once's own 2 s).
    assert cells["late_once"].actions[0].max_effect_seconds == 10
    assert cells["step_once"].actions[0].max_effect_seconds == 50
    assert cells["quick_once"].actions[0].max_effect_seconds == 30
    assert cells["noop"].actions[0].max_effect_seconds == 0
    # What an action returns: its declared output fields and its limit (declared, else the
    # catalogue's default of 64 KiB); the actions whose outputs make the cell's result.
    [opened] = cells["ticket"].actions
    assert [(f.name, f.type, f.required) for f in opened.output] == [
        ("ticket_id", "string", True),
        ("ok", "boolean", False),
    ]
    assert opened.max_output_bytes == 65536 and cells["sized"].actions[0].max_output_bytes == 100
    assert list(cells["step"].actions[0].output) == []
    assert list(cells["review_and_close"].result_actions) == ["open"]  # named
    assert list(cells["pair"].result_actions) == ["second"]  # its sink


async def test_every_page_of_a_listing_has_a_deadline(gateway_only, gateway_client):
    """Following the cursor, each page's call gives up after ``page_timeout`` seconds: a
    listing never waits forever on a gateway that does not answer (here, a listener that
    takes the connection and never speaks), in the async and the blocking client."""
    await gateway_client.submit("tests", [cell("noop")])
    assert len([t async for t in gateway_client.list(business="tests")]) == 1

    held: list[asyncio.StreamWriter] = []  # connections kept open, never answered
    silent = await asyncio.start_server(lambda _, writer: held.append(writer), "127.0.0.1", 0)
    address = f"127.0.0.1:{silent.sockets[0].getsockname()[1]}"
    try:
        # Bounded well under the clients' default page deadline (10 s): the one given is used.
        async with AsyncClient(address, token=gateway_only.token) as mute:
            with pytest.raises(DispoError) as late:
                async with asyncio.timeout(5):
                    [t async for t in mute.list(business="tests", page_timeout=0.3)]
        assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED

        def blocking() -> DispoError:
            with Client(address, token=gateway_only.token) as client:
                with pytest.raises(DispoError) as raised:
                    list(client.list(business="tests", page_timeout=0.3))
                return raised.value

        late_too = await asyncio.wait_for(asyncio.to_thread(blocking), 5)
        assert late_too.code == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        for writer in held:
            writer.close()
        silent.close()
