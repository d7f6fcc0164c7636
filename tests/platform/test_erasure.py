"""Erasure with the gateway, the executor and the reconciler as real processes: a finished
task whose payloads, node output, signal and result carry a marker is erased, and no table of any
service's schema holds the marker any more; GetTask answers its skeleton marked erased; a
running task is refused; erasing twice answers the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import pytest
from dispo.libs.contracts import tasks
from dispo.sdk import DispoError, cell
from pipeline_fixtures import Downstream, Pipeline, stream_messages, wait_status
from support import eventually

pytestmark = pytest.mark.long_file

SCHEMAS = ("gateway", "executor", "reconciler")
STATUS = tasks.TASK_STATUS.name


async def holders(database_url: str, marker: str) -> list[str]:
    """Every schema.table.column of the three services holding ``marker``."""
    conn = await asyncpg.connect(database_url)
    try:
        columns = await conn.fetch(
            "SELECT table_schema, table_name, column_name, data_type"
            " FROM information_schema.columns WHERE table_schema = ANY($1::text[])"
            " AND data_type IN ('text', 'character varying', 'jsonb', 'bytea', 'ARRAY')",
            list(SCHEMAS),
        )
        found = []
        for c in columns:
            column = f'{c["table_schema"]}."{c["table_name"]}"."{c["column_name"]}"'
            table = f'{c["table_schema"]}."{c["table_name"]}"'
            if c["data_type"] == "bytea":
                test = f"position(convert_to($1, 'UTF8') IN \"{c['column_name']}\") > 0"
            else:
                test = f"CAST(\"{c['column_name']}\" AS text) LIKE '%' || $1 || '%'"
            if await conn.fetchval(f"SELECT count(*) FROM {table} WHERE {test}", marker):
                found.append(column)
        return found
    finally:
        await conn.close()


class Stack(Pipeline):
    reconciler: Any

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``dispo args`` against these services, as the admin."""
        env = {
            "PATH": os.environ["PATH"],
            "DISPO_DATA_DIR": "/nonexistent",
            "DISPO_TOKEN": self.token,
        }
        for name, process in (
            ("gateway", self.gateway),
            ("executor", self.executors[0]),
            ("reconciler", self.reconciler),
        ):
            host, port = process.address.rsplit(":", 1)
            env[f"DISPO_{name.upper()}_HOST"], env[f"DISPO_{name.upper()}_PORT"] = host, port
        dispo = str(Path(sys.executable).parent / "dispo")
        return subprocess.run([dispo, *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
async def stack(start_service, catalogue_file, downstream: Downstream) -> Stack:
    pipeline = Stack(start_service, catalogue_file, downstream.url)
    await pipeline.start_gateway()
    await pipeline.start_executor()
    pipeline.reconciler = await start_service(
        "reconciler",
        {
            "DISPO_CATALOGUE": str(catalogue_file),
            "DISPO_EGRESS_ALLOW": downstream.url,
            "DISPO_RECONCILER_GATEWAY_ADDRESS": pipeline.gateway.address,
            "DISPO_RECONCILER_EXECUTOR_ADDRESS": pipeline.executor_address,
            "DISPO_RECONCILER_SWEEP_INTERVAL_SECONDS": "1",
        },
    )
    return pipeline


async def test_an_erased_task_leaves_no_payload_byte_in_any_table(
    stack: Stack, downstream: Downstream, database_url: str, bus
) -> None:
    marker = f"owner-{uuid.uuid4().hex}"
    async with stack.client() as client:
        # a node output carrying the marker
        await downstream.control(answer={"path": f"/step/{marker}", "body": {"owner": marker}})
        # and a wait node whose signal's payload carries it
        task = await client.submit("shop", [cell("step", name=marker), cell("review", name=marker)])
        await client.signal(task.task_id, "verdict", {"verdict": "approved", "note": marker})
        await wait_status(client, task.task_id, {"SUCCEEDED"})
        assert (await client.get(task.task_id)).result is not None
        # a running task (its call held) is refused, and keeps its payload
        other = f"other-{uuid.uuid4().hex}"
        await downstream.control(hold={"path": f"/step/{other}", "times": 1})
        running = await client.submit("shop", [cell("step", name=other)])
        await downstream.wait_held()
        with pytest.raises(DispoError) as refused:
            await client.erase(running.task_id)
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "RUNNING" in refused.value.message or "ACCEPTED" in refused.value.message

        # the scan finds the marker before the erasure, in every service, completion included
        async def everywhere() -> bool:
            schemas = {h.split(".")[0] for h in await holders(database_url, marker)}
            return schemas == set(SCHEMAS)

        await eventually(everywhere, timeout=60, interval=0.5, wanted="the marker everywhere")

        # the status stream's snapshots carry the nodes' expanded paths: the marker too
        status = tasks.task_status_all(task.task_id)
        assert any(marker.encode() in m.data for m in await stream_messages(bus, status, STATUS))

        erased = await client.erase(task.task_id)
        assert erased.erased_at is not None and erased.erased_by
        again = await client.erase(task.task_id)
        assert (again.erased_at, again.erased_by) == (erased.erased_at, erased.erased_by)
        await downstream.control(release=True)
        await wait_status(client, running.task_id, {"SUCCEEDED"})

        # every service applies it: no table holds the marker any more; the task refused
        # keeps its payload
        await eventually(
            lambda: holders(database_url, marker),
            lambda left: not left,
            timeout=180,  # the reconciler erases once its reconciliation (60 s on) is done
            interval=0.5,
            wanted="the marker gone from every table",
        )
        assert {h.split(".")[0] for h in await holders(database_url, other)} == set(SCHEMAS)
        # and the erased task's snapshots are purged from the status stream
        assert await stream_messages(bus, status, STATUS) == []
        assert await holders(database_url, f'{marker}"') == []
        view = await client.get(task.task_id)
        assert view.status == "SUCCEEDED" and view.task_id == task.task_id
        assert view.erased_at == erased.erased_at
        assert view.completion is not None and view.completion.finished_at is not None
        assert marker not in str(view.raw)
        assert all(n.status == "SUCCEEDED" and n.finished_at for n in view.nodes)


async def test_the_cli_erases_a_failed_task_which_then_cannot_be_resumed(
    stack: Stack, downstream: Downstream, database_url: str
) -> None:
    name = f"fails-{uuid.uuid4().hex}"
    await downstream.control(fail={"status": 400, "times": 1, "path": f"/step/{name}"})
    async with stack.client() as client:
        task = await client.submit("shop", [cell("step", name=name)])
        await wait_status(client, task.task_id, {"FAILED"})
    held = stack.cli("failed", "show", task.task_id)
    assert held.returncode == 0, held.stderr

    erased = stack.cli("tasks", "erase", task.task_id, "--json")
    assert erased.returncode == 0, erased.stderr
    reply = json.loads(erased.stdout)
    assert reply["erasure"]["erased_by"].startswith("admin")
    assert reply["task"]["status"] == "TASK_STATUS_FAILED"
    shown = stack.cli("tasks", "show", task.task_id)
    assert "erased" in shown.stdout, shown.stdout
    assert json.loads(stack.cli("tasks", "erase", task.task_id, "--json").stdout) == reply

    # once every service applied the erasure, a resume is refused: the payloads are gone
    await eventually(
        lambda: holders(database_url, name), lambda left: not left, timeout=180, wanted="erased"
    )
    resumed = stack.cli("failed", "resume", task.task_id)
    assert resumed.returncode != 0
    assert "erased" in resumed.stderr, resumed.stderr
