"""Labels (ADR-0110) through the real gateway: given on Submit or by a cell's label fields,
shown on GetTask and ListTasks, filtered on by ListTasks and CountTasks, confined to a
business token's own tasks, and refused precisely when malformed."""

import grpc
import pytest
from dispo.gateway import store
from dispo.gateway.expand import CellRequest, Submission
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.clock import ManualClock
from dispo.libs.contracts import tasks
from dispo.libs.db.driver import Statement
from dispo.sdk import DispoError, cell
from support import eventually
from support.auth import business_token
from support.plans import hot_updates, plan_nodes


def status_counts(**given: int) -> dict[str, int]:
    """CountTasks' answer: every status, ``given`` ones as given, the others 0."""
    names = [common_pb2.TaskStatus.Name(v).removeprefix("TASK_STATUS_") for v in range(1, 8)]
    return {name: given.get(name, 0) for name in names}


async def test_labels_are_kept_shown_and_filtered_on_within_the_callers_business(
    gateway_only, database_url
):
    async with gateway_only.client() as admin:
        campaign = [
            await admin.submit("lab-a", [cell("noop")], labels={"campaign": "import-7"})
            for _ in range(3)
        ]
        other = await admin.submit("lab-a", [cell("noop")], labels={"campaign": "import-8"})
        plain = await admin.submit("lab-a", [cell("noop")])
        about = await admin.submit(
            "lab-a",
            [cell("tagged", content_id="content-42", rank=3)],
            labels={"campaign": "import-7"},
        )
        theirs = await admin.submit("lab-b", [cell("tagged", content_id="content-42")])

        view = await admin.get(about.task_id)
        assert view.labels == {"campaign": "import-7", "content_id": "content-42", "rank": "3"}
        assert (await admin.get(plain.task_id)).labels == {}

        def ids(tasks):
            return {t.task_id for t in tasks}

        listed = [t async for t in admin.list(labels={"campaign": "import-7"})]
        assert ids(listed) == {t.task_id for t in [*campaign, about]}
        assert {t.task_id: dict(t.labels) for t in listed}[about.task_id] == view.labels
        assert ids([t async for t in admin.list(labels={"content_id": "content-42"})]) == {
            about.task_id,
            theirs.task_id,
        }
        both = {"content_id": "content-42", "campaign": "import-7"}
        assert ids([t async for t in admin.list(labels=both)]) == {about.task_id}
        assert [t async for t in admin.list(labels={"campaign": "import-9"})] == []
        assert ids([t async for t in admin.list(business="lab-a")]) == {
            t.task_id for t in [*campaign, other, plain, about]
        }
        assert await admin.count(labels={"campaign": "import-7"}) == status_counts(ACCEPTED=4)
        assert await admin.count(
            business="lab-b", labels={"content_id": "content-42"}
        ) == status_counts(ACCEPTED=1)

    # A business token finds its own labelled tasks only.
    _, secret = await business_token(database_url, "lab-b")
    async with gateway_only.client(secret) as own:
        assert [t.task_id async for t in own.list(labels={"content_id": "content-42"})] == [
            theirs.task_id
        ]
        assert await own.count(labels={"campaign": "import-7"}) == status_counts()
        with pytest.raises(DispoError) as denied:
            await own.list_page(business="lab-a", labels={"campaign": "import-7"})
        assert denied.value.code == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize(
    ("labels", "cells", "field"),
    [
        ({"Campaign": "x"}, [cell("noop")], "labels.Campaign"),
        ({"-x": "x"}, [cell("noop")], "labels.-x"),
        ({"k" * 64: "x"}, [cell("noop")], f"labels.{'k' * 64}"),
        ({"campaign": "v" * 129}, [cell("noop")], "labels.campaign"),
        ({"campaign": "tab\there"}, [cell("noop")], "labels.campaign"),
        ({f"k{i}": "v" for i in range(17)}, [cell("noop")], "labels"),
        ({"content_id": "c-1"}, [cell("tagged", content_id="c-2")], "labels.content_id"),
        ({}, [cell("tagged", content_id="x" * 129)], "cells[0].payload.content_id"),
    ],
)
async def test_a_malformed_label_is_refused_naming_it_and_nothing_is_written(
    gateway_client, labels, cells, field
):
    with pytest.raises(DispoError) as refused:
        await gateway_client.submit("lab-bad", cells, labels=labels)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert set(refused.value.violations) == {field}, refused.value.violations
    assert [t async for t in gateway_client.list(business="lab-bad")] == []


async def test_a_malformed_label_filter_is_refused_naming_it(gateway_client):
    for call in (gateway_client.list_page, gateway_client.count):
        with pytest.raises(DispoError) as refused:
            await call(labels={"Bad Key": "x"})
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert set(refused.value.violations) == {"labels.Bad Key"}


async def test_labels_are_part_of_the_request_an_idempotency_key_stands_for(gateway_client):
    first = await gateway_client.submit(
        "lab-key", [cell("noop")], idempotency_key="k", labels={"campaign": "a"}
    )
    again = await gateway_client.submit(
        "lab-key", [cell("noop")], idempotency_key="k", labels={"campaign": "a"}
    )
    assert again.duplicate and again.task_id == first.task_id
    with pytest.raises(DispoError) as refused:
        await gateway_client.submit(
            "lab-key", [cell("noop")], idempotency_key="k", labels={"campaign": "b"}
        )
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION


async def test_a_label_filter_reads_the_labels_index_and_a_status_update_stays_in_place(
    make_gateway, bus
):
    """ListTasks by label plans on ix_tasks_labels (the partial GIN index), not a scan of
    every task; a labelled task's status update is HOT (ADR-0061): labels never change."""
    await tasks.TASKS.ensure(bus)
    gateway = make_gateway(clock=ManualClock())
    subs = [
        Submission(
            "tests",
            [CellRequest("noop")],
            labels={"campaign": f"c-{i // 10 % 50}"} if i % 10 == 0 else {},
        )
        for i in range(2000)
    ]
    await gateway.submit_all(subs, [await gateway.prepare(s) for s in subs])
    params: dict = {}
    where = store.TaskFilter(labels=(("campaign", "c-0"),)).where(params)
    explain = Statement(
        f"EXPLAIN (FORMAT JSON) SELECT task_id FROM tasks WHERE {' AND '.join(where)}"
    )
    async with gateway.db.connection() as conn:
        await conn.fetch("ANALYZE tasks")
        [[plan]] = await explain.fetch(conn, params)
        found = await gateway.list(
            store.TaskFilter(labels=(("campaign", "c-0"),)), statuses=[], after=None, limit=100
        )
        assert len(found) == 4 and all(t.labels == {"campaign": "c-0"} for t in found)
        labelled = found[0].task_id
        before = await hot_updates(conn, "tasks")
        await store.task_set_view(
            conn, labelled, task_pb2.Task(task_id=labelled), "running", gateway.clock.now()
        )
    nodes = plan_nodes(plan)
    assert "ix_tasks_labels" in [n.get("Index Name") for n in nodes], nodes
    assert not any(n["Node Type"] == "Seq Scan" for n in nodes), nodes

    async def counted() -> int:
        async with gateway.db.connection() as conn:
            return await hot_updates(conn, "tasks")

    await eventually(counted, lambda after: after == before + 1, timeout=10)
