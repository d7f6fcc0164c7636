"""The outbox never jams: a row that cannot be published (here a task.create of 2 MiB,
written straight into the gateway's outbox, over the server's max_payload) is quarantined
after its attempts, and the tasks accepted after it are published and complete."""

from __future__ import annotations

import asyncio

from dispo.libs.bus import Bus
from dispo.sdk import cell
from pipeline_fixtures import Pipeline, dump
from sqlalchemy import text
from support import eventually

POISON = 2 * 1024 * 1024


async def test_an_unpublishable_row_is_quarantined_and_the_tasks_after_it_complete(
    start_service, catalogue_file, service_engine
):
    engine = await service_engine("gateway")
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO outbox (subject, msg_id, payload, created_at)"
                " VALUES ('task.create', 'poison', :payload, now())"
            ),
            {"payload": b"x" * POISON},
        )
    pipeline = Pipeline(start_service, catalogue_file)
    gateway = await pipeline.start_gateway(DISPO_OUTBOX_MAX_ATTEMPTS="2")
    await pipeline.start_executor()
    async with pipeline.client() as client:
        accepted = await asyncio.gather(
            *(client.submit("tests", [cell("noop")], idempotency_key=f"k{i}") for i in range(30))
        )
        done = [await client.wait(task.task_id, timeout=60) for task in accepted]
    assert all(view.status == "SUCCEEDED" for view in done), [dump(v) for v in done]

    async def poison() -> tuple:
        async with engine.connect() as conn:
            return (
                await conn.execute(
                    text(
                        "SELECT sent_at IS NULL, attempts, quarantined_at IS NOT NULL, last_error"
                        " FROM outbox WHERE msg_id = 'poison'"
                    )
                )
            ).one()

    unsent, attempts, quarantined, error = await eventually(
        poison, lambda row: row[2], timeout=60, wanted="the poison row quarantined"
    )
    assert (unsent, attempts) == (True, 2)
    assert "MessageTooLarge" in error
    assert f"{Bus.message_size(POISON, msg_id='poison')} bytes" in error  # headers counted

    async def unsent_others() -> int:
        async with engine.connect() as conn:
            return (
                await conn.execute(
                    text("SELECT count(*) FROM outbox WHERE sent_at IS NULL AND msg_id <> 'poison'")
                )
            ).scalar()

    # The direct publisher deletes what it sent a moment after the send (ADR-0062), so a
    # task can finish before its row is gone.
    await eventually(
        unsent_others, lambda n: n == 0, timeout=30, wanted="the other rows published, deleted"
    )
    log = gateway.log_path.read_text()
    assert '"event": "outbox row quarantined"' in log and '"msg_id": "poison"' in log
