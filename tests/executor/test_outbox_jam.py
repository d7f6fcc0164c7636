"""The outbox never jams: a row that cannot be published (here a task.create of 2 MiB,
written straight into the gateway's outbox, over the server's max_payload) is quarantined
after its attempts, and the tasks accepted after it are published and complete."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from dispo.libs.api.quarantine.v1 import quarantine_pb2, quarantine_pb2_grpc
from dispo.libs.bus import Bus
from dispo.sdk import cell
from pipeline_fixtures import Pipeline, dump
from sqlalchemy import text
from support import eventually
from support.auth import admin_channel, session_tokens

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

    # The operator's side (QuarantineService on the gateway's port): the row is listed,
    # bad ids are refused naming the field, a replay gives it back to the relay with a fresh
    # count (it is set aside again after its attempts: still too large), a discard deletes it.
    async with admin_channel(gateway.address) as channel:
        quarantine = quarantine_pb2_grpc.QuarantineServiceStub(channel)
        listed = await quarantine.ListOutboxRows(quarantine_pb2.ListOutboxRowsRequest())
        [row] = [r for r in listed.rows if r.msg_id == "poison"]
        assert (row.subject, row.attempts, row.size) == ("task.create", 2, POISON), row
        assert "MessageTooLarge" in row.last_error
        for ids, field in (([], "ids"), ([row.id, -1], "ids[1]"), ([1] * 101, "ids")):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await quarantine.ReplayOutboxRows(quarantine_pb2.OutboxRowsRequest(ids=ids))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ids
            assert field in refused.value.details(), refused.value.details()
        assert (await poison())[1:3] == (2, True)  # the refusals changed nothing
        replayed = await quarantine.ReplayOutboxRows(quarantine_pb2.OutboxRowsRequest(ids=[row.id]))
        assert replayed.changed == 1
    await eventually(
        poison,
        lambda r: r[2] and r[1] == 2,
        timeout=60,
        wanted="set aside again after its attempts",
    )
    host, port = gateway.address.rsplit(":", 1)
    discarded = subprocess.run(
        [str(Path(sys.executable).parent / "dispo"), "--token", session_tokens().admin,
         "quarantine", "outbox", "discard", str(row.id), "--service", "gateway", "--json"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "DISPO_GATEWAY_HOST": host, "DISPO_GATEWAY_PORT": port},
    )  # fmt: skip
    assert discarded.returncode == 0, discarded.stderr
    assert json.loads(discarded.stdout)["changed"] == "1"
    async with engine.connect() as conn:
        left = (await conn.execute(text("SELECT count(*) FROM outbox"))).scalar()
    assert left == 0
