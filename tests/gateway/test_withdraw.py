"""A cancel takes back a task.create only if it was provably never published (ADR-0090):
raced against the relay's publication, on the real database and bus, a cancel that comes
after the event left is sent to the executor as task.cancel, never reported as a cancel
before publication."""

from __future__ import annotations

import asyncio

import pytest
from dispo.gateway.expand import CellRequest, Submission
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.contracts import tasks
from dispo.libs.db import create_engine
from sqlalchemy import text
from support import eventually


async def on_the_bus(bus, subject: str) -> list[str]:
    """The message ids the TASKS stream holds on ``subject``."""
    return [m.msg_id for m in await bus.read_subject("TASKS", subject, limit=100)]


async def outbox_subjects(gateway) -> list[str]:
    async with gateway.db.connection() as conn:
        return await conn.scalars("SELECT subject FROM outbox ORDER BY id")


def assert_sent_to_the_executor(view) -> None:
    """The cancel was not taken as one before publication: the task is the executor's to
    cancel (its task.cancel is in the outbox or on the bus)."""
    assert view.status == common_pb2.TASK_STATUS_ACCEPTED, view
    assert view.cancel_requested and view.status_reason != "cancelled before publication"


async def test_a_cancel_after_the_direct_publisher_sent_the_task_create_goes_to_the_executor(
    make_gateway, bus
):
    """The direct publisher sends a task.create right after its commit and deletes the row
    later, with the next outbox write or after ``mark_delay`` (stretched here, so the row
    stays while the cancel runs). The row is still there, but the event is on the bus: the
    cancel must not take it back."""
    await tasks.TASKS.ensure(bus)
    gateway = make_gateway(relay_options={"poll_interval": 3600, "mark_delay": 3600})
    relay = gateway.relay
    running = asyncio.create_task(relay.run())
    try:
        await eventually(lambda: relay._direct_running, timeout=10, wanted="the relay running")
        task_id = (await gateway.submit(Submission("tests", [CellRequest("noop")]))).task_id
        await eventually(
            lambda: relay.published_directly == 1, timeout=10, interval=0.01, wanted="sent"
        )
        assert await outbox_subjects(gateway) == [tasks.TASK_CREATE]  # not deleted yet

        view = await gateway.cancel(task_id)

        assert await on_the_bus(bus, tasks.TASK_CREATE) == [tasks.create_id(task_id, 0)]
        assert_sent_to_the_executor(view)
        relay.kick()  # the task.cancel, written with outbox_add, goes out with a pass
        await eventually(
            lambda: on_the_bus(bus, tasks.TASK_CANCEL),
            lambda ids: ids == [tasks.cancel_id(task_id)],
            timeout=10,
            wanted="the task.cancel published",
        )
    finally:
        relay.stop()
        await asyncio.wait_for(running, 10)


async def test_a_cancel_after_a_pass_published_and_lost_its_transaction_goes_to_the_executor(
    make_gateway, bus, database_url, monkeypatch
):
    """A pass publishes a task.create and loses its database connection before it deletes
    the row: its transaction is gone, the event is on the bus. The row was claimed, and
    committed so, before the publish: the cancel must not take it back."""
    await tasks.TASKS.ensure(bus)
    gateway = make_gateway()  # its relay is not running: the row waits for a pass
    task_id = (await gateway.submit(Submission("tests", [CellRequest("noop")]))).task_id
    admin = create_engine(database_url, "public")
    publish_many = bus.publish_many

    async def publish_then_lose_the_connection(*args, **kwargs):
        await publish_many(*args, **kwargs)
        async with admin.connect() as conn:  # the pass's session, waiting to delete the row
            ended = await conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND state = 'idle in transaction'"
                    " AND pid <> pg_backend_pid()"
                )
            )
            assert ended.scalars().all() == [True]
            await conn.commit()

    monkeypatch.setattr(bus, "publish_many", publish_then_lose_the_connection)
    try:
        with pytest.raises(Exception):  # noqa: B017 - the connection lost, in whatever words
            await gateway.relay.relay_once()
    finally:
        monkeypatch.undo()
        await admin.dispose()
    assert await on_the_bus(bus, tasks.TASK_CREATE) == [tasks.create_id(task_id, 0)]
    assert tasks.TASK_CREATE in await outbox_subjects(gateway)  # not deleted

    view = await gateway.cancel(task_id)

    assert_sent_to_the_executor(view)
    assert await outbox_subjects(gateway) == [tasks.TASK_CREATE, tasks.TASK_CANCEL]
