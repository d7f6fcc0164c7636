"""The status view takes the executor's snapshots in batches: per task only the newest of a
flush is applied, with one statement, guarded by the version; the payloads recorded at
acceptance stay visible; watchers are woken."""

from __future__ import annotations

import asyncio

from dispo.gateway.expand import CellRequest, Submission
from dispo.gateway.operations import Gateway
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.contracts import tasks
from dispo.libs.payload import payload_data


async def accepted(gateway: Gateway, name: str = "x") -> task_pb2.Task:
    sub = Submission("tests", [CellRequest("step", "", {"name": name})])
    return await gateway.get((await gateway.submit(sub)).task_id)


def snapshot(view: task_pb2.Task, version: int, status=common_pb2.TASK_STATUS_RUNNING):
    """The executor's event for ``version``: node states, no payloads."""
    env = task_pb2.Task()
    env.CopyFrom(view)
    env.version, env.status, env.status_reason = version, status, f"v{version}"
    for node in env.nodes:
        node.last_error = f"error {version}"
    return tasks.status_snapshot(env)


def payloads(view: task_pb2.Task) -> dict[str, bytes]:
    return {ref: payload_data(p) for ref, p in view.payloads.items()}


async def test_out_of_order_and_duplicate_snapshots_in_one_flush_keep_the_newest(make_gateway):
    gateway = make_gateway(status_linger=0.2)
    first, second = await accepted(gateway, "a"), await accepted(gateway, "b")
    events = [(first, v) for v in (3, 1, 5, 2, 5, 4)] + [(second, v) for v in (2, 1)]

    results = await asyncio.gather(*(gateway.apply_status(snapshot(view, v)) for view, v in events))

    assert (gateway.statuses.flushes, gateway.statuses.flushed_items) == (1, len(events))
    # One snapshot per task applied: the first of the newest version.
    assert results == [False, False, True, False, False, False, True, False]
    for view, newest in ((first, 5), (second, 2)):
        now = await gateway.get(view.task_id)
        assert (now.version, now.status_reason, now.nodes[0].last_error) == (
            newest,
            f"v{newest}",
            f"error {newest}",
        )
        assert now.status == common_pb2.TASK_STATUS_RUNNING
        assert payloads(now) == payloads(view) != {}
    # Older or equal versions in a later flush change nothing.
    assert not await gateway.apply_status(snapshot(first, 4))
    assert not await gateway.apply_status(snapshot(first, 5, common_pb2.TASK_STATUS_FAILED))
    assert (await gateway.get(first.task_id)).status_reason == "v5"


async def test_payloads_recorded_at_acceptance_survive_every_snapshot(make_gateway):
    gateway = make_gateway()
    view = await accepted(gateway, "kept")
    assert payloads(view) == {"step": b'{"name":"kept"}'}
    for version in (1, 2):  # the first snapshot moves them aside, the second keeps them
        assert await gateway.apply_status(snapshot(view, version))
        assert payloads(await gateway.get(view.task_id)) == payloads(view)
    done = snapshot(view, 3, common_pb2.TASK_STATUS_SUCCEEDED)
    assert await gateway.apply_status(done, done.SerializeToString())
    record = await gateway.get_record(view.task_id)
    assert record.status == "succeeded" and record.finished_at is not None
    assert payloads(gateway.view_of(record)) == payloads(view)
    async with gateway.db.connection() as conn:  # the view itself is the snapshot as sent
        stored = (
            await conn.fetch("SELECT view FROM tasks WHERE task_id = :id", {"id": view.task_id})
        )[0][0]
    assert stored == done.SerializeToString()


async def test_a_row_written_before_the_accepted_column_keeps_its_payloads(make_gateway):
    gateway = make_gateway()
    view = await accepted(gateway, "old")
    async with gateway.db.transaction() as conn:  # as rows of revision 0003 were written
        await conn.fetch(
            "UPDATE tasks SET accepted = NULL, view = :view WHERE task_id = :id",
            {"view": view.SerializeToString(), "id": view.task_id},
        )
    assert payloads(await gateway.get(view.task_id)) == payloads(view)
    assert await gateway.apply_status(snapshot(view, 1))
    assert payloads(await gateway.get(view.task_id)) == payloads(view)


async def test_a_watcher_is_woken_by_an_applied_snapshot(make_gateway):
    gateway = make_gateway(watch_poll_interval=3600)  # no polling: only the wake-up
    view = await accepted(gateway)
    watching = gateway.watch(view.task_id)
    assert (await anext(watching)).version == 0
    following = asyncio.ensure_future(anext(watching))
    assert await gateway.apply_status(snapshot(view, 1))
    assert (await asyncio.wait_for(following, 30)).version == 1
    following = asyncio.ensure_future(anext(watching))
    assert await gateway.apply_status(snapshot(view, 2, common_pb2.TASK_STATUS_SUCCEEDED))
    assert (await asyncio.wait_for(following, 30)).status == common_pb2.TASK_STATUS_SUCCEEDED
    assert [v async for v in watching] == []  # terminal: the stream ends


async def test_a_snapshot_updates_its_tasks_row_on_the_rows_own_page(make_gateway):
    """The tasks table keeps room on each page (ADR-0061): the row a snapshot writes stays
    on its page (a HOT update, no entry in any of the table's indexes), though the first
    snapshot also keeps the accepted envelope aside and the row grows. On full pages most
    rows would move."""
    gateway = make_gateway()
    views = [await accepted(gateway, f"page-{i}") for i in range(40)]
    ids = [v.task_id for v in views]

    async def pages() -> dict[str, int]:
        async with gateway.db.connection() as conn:
            rows = await conn.fetch(
                "SELECT task_id, (ctid::text::point)[0]::int AS page FROM tasks"
                " WHERE task_id = ANY(CAST(:ids AS text[]))",
                {"ids": ids},
            )
            return {r.task_id: r.page for r in rows}

    before = await pages()
    applied = await asyncio.gather(
        *(gateway.apply_status(snapshot(v, 1, common_pb2.TASK_STATUS_SUCCEEDED)) for v in views)
    )
    assert all(applied)
    after = await pages()
    stayed = [task_id for task_id in ids if after[task_id] == before[task_id]]
    assert len(stayed) >= 36, (before, after)


async def test_a_terminal_view_is_never_taken_to_another_status(make_gateway):
    """SUCCEEDED and CANCELLED views keep their status whatever a newer snapshot says; a
    FAILED one is left only under a newer generation (an operator's resume)."""
    gateway = make_gateway()
    S = common_pb2
    for end in (S.TASK_STATUS_SUCCEEDED, S.TASK_STATUS_CANCELLED):
        view = await accepted(gateway, f"end-{end}")
        assert await gateway.apply_status(snapshot(view, 2, end))
        for later, generation in ((S.TASK_STATUS_FAILED, 0), (S.TASK_STATUS_RUNNING, 1)):
            forged = snapshot(view, 2**30, later)
            forged.generation = generation
            assert not await gateway.apply_status(forged)
        now = await gateway.get(view.task_id)
        assert (now.status, now.version) == (end, 2)
        assert await gateway.apply_status(snapshot(view, 3, end))  # the same status: taken

    view = await accepted(gateway, "resumed")
    assert await gateway.apply_status(snapshot(view, 2, S.TASK_STATUS_FAILED))
    assert not await gateway.apply_status(snapshot(view, 3, S.TASK_STATUS_SUCCEEDED))
    resumed = snapshot(view, 3, S.TASK_STATUS_RUNNING)
    resumed.generation = 1
    assert await gateway.apply_status(resumed)
    done = snapshot(view, 4, S.TASK_STATUS_SUCCEEDED)
    done.generation = 1
    assert await gateway.apply_status(done)
    assert (await gateway.get(view.task_id)).status == S.TASK_STATUS_SUCCEEDED

    # Cancelled by the gateway before publication: provably never sent (ADR-0090), so the
    # view is kept like any other terminal one, at version 0 too.
    view = await accepted(gateway, "withdrawn")
    assert (await gateway.cancel(view.task_id)).status == S.TASK_STATUS_CANCELLED
    assert not await gateway.apply_status(snapshot(view, 1, S.TASK_STATUS_RUNNING))
    now = await gateway.get(view.task_id)
    assert (now.status, now.version) == (S.TASK_STATUS_CANCELLED, 0)
