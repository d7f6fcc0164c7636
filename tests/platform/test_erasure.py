"""Erasure with the gateway, the executor and the reconciler as real processes: a finished
task whose payloads, node output, signal and result carry a marker is erased, and no table of any
service's schema holds the marker any more; GetTask answers its skeleton marked erased; a
running task is refused; erasing twice answers the same. A FAILED task is sealed against a
resume before it is erased (ADR-0114): a resume asked before the reconciler applied the
erasure is refused, across a restart; a resume in flight refuses the erasure; and without
the reconciler nothing is erased."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import pytest
import yaml
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as rpb
from dispo.libs.api.reconciler.v1 import reconciler_pb2_grpc
from dispo.libs.auth.channel import open_channel
from dispo.libs.contracts import tasks
from dispo.libs.process import free_port
from dispo.reconciler.settings import DEFAULT_CONFIG
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
    # Where the reconciler listens, known before the gateway starts (it seals there).
    reconciler_port: int = 0
    reconciler_env: dict[str, str] | None = None

    async def start_reconciler(self) -> Any:
        self.reconciler = await self.start_service(
            "reconciler", self.reconciler_env, port=self.reconciler_port
        )
        return self.reconciler

    @asynccontextmanager
    async def recovery(self) -> AsyncIterator[reconciler_pb2_grpc.ReconcilerServiceStub]:
        """The reconciler's API, as the admin."""
        channel = open_channel(self.reconciler.address, self.token)
        try:
            yield reconciler_pb2_grpc.ReconcilerServiceStub(channel)
        finally:
            await channel.close()

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


async def start_stack(
    start_service, catalogue_file, downstream: Downstream, **reconciler_env: str
) -> Stack:
    pipeline = Stack(start_service, catalogue_file, downstream.url)
    pipeline.reconciler_port = free_port()
    await pipeline.start_gateway(
        DISPO_GATEWAY_RECONCILER_ADDRESS=f"127.0.0.1:{pipeline.reconciler_port}",
        DISPO_GATEWAY_SEAL_TIMEOUT_SECONDS="2",
    )
    await pipeline.start_executor()
    pipeline.reconciler_env = {
        "DISPO_CATALOGUE": str(catalogue_file),
        "DISPO_EGRESS_ALLOW": downstream.url,
        "DISPO_RECONCILER_GATEWAY_ADDRESS": pipeline.gateway.address,
        "DISPO_RECONCILER_EXECUTOR_ADDRESS": pipeline.executor_address,
        "DISPO_RECONCILER_SWEEP_INTERVAL_SECONDS": "1",
        **reconciler_env,
    }
    await pipeline.start_reconciler()
    return pipeline


@pytest.fixture
async def stack(start_service, catalogue_file, downstream: Downstream) -> Stack:
    return await start_stack(start_service, catalogue_file, downstream)


@pytest.fixture
async def held_stack(start_service, catalogue_file, downstream: Downstream, tmp_path) -> Stack:
    """The stack with the reconciliation of a finished task an hour away: the reconciler
    holds its erasure of a task back all the while (as it does for the first 60 s by
    default), so whatever happens meanwhile happens before it applied it."""
    policy = yaml.safe_load(Path(DEFAULT_CONFIG).read_text())
    policy["reconciliation"]["delay"] = 3600
    config = tmp_path / "recovery.yaml"
    config.write_text(yaml.safe_dump(policy))
    return await start_stack(
        start_service, catalogue_file, downstream, DISPO_RECONCILER_CONFIG=str(config)
    )


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


async def failed_task(stack: Stack, downstream: Downstream, name: str) -> str:
    """A task FAILED on a permanent failure (its one call answered 400), held FAILED by the
    reconciler: an operator may resume it."""
    await downstream.control(fail={"status": 400, "times": 1, "path": f"/step/{name}"})
    async with stack.client() as client:
        task = await client.submit("shop", [cell("step", name=name)])
        await wait_status(client, task.task_id, {"FAILED"})
    async with stack.recovery() as recovery:

        async def state() -> int:
            try:
                reply = await recovery.GetRecoveryTask(
                    rpb.GetRecoveryTaskRequest(task_id=task.task_id)
                )
            except grpc.aio.AioRpcError:
                return 0
            return reply.task.state

        await eventually(state, lambda s: s == rpb.RECOVERY_STATE_FAILED, timeout=60)
    return task.task_id


async def calls(downstream: Downstream) -> int:
    return sum((await downstream.calls()).values())


async def refused_resume(stack: Stack, task_id: str) -> grpc.aio.AioRpcError:
    async with stack.recovery() as recovery:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await recovery.RedriveTask(
                rpb.RedriveTaskRequest(task_id=task_id, actor="test", reason="resume")
            )
    return refused.value


async def test_an_erased_failed_task_is_never_resumed_even_before_the_reconciler_erased_it(
    held_stack: Stack, downstream: Downstream, database_url: str
) -> None:
    stack = held_stack
    name = f"fails-{uuid.uuid4().hex}"
    task_id = await failed_task(stack, downstream, name)
    before = await calls(downstream)
    async with stack.client() as client:
        await client.erase(task_id)
    # the reconciler has not applied the erasure (its reconciliation is an hour away): its
    # recovery record still holds the payload a resume would run on
    async with stack.recovery() as recovery:
        held = await recovery.GetRecoveryTask(rpb.GetRecoveryTaskRequest(task_id=task_id))
    assert name in str(held.envelope)
    generation = held.task.generation

    refused = await refused_resume(stack, task_id)
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert task_id in refused.details() and "erased" in refused.details()
    # the CLI says the same, from the status
    resumed = stack.cli("failed", "resume", task_id)
    assert resumed.returncode != 0 and "erased" in resumed.stderr, resumed.stderr

    # the seal outlives a restart of the reconciler
    stack.reconciler.kill()
    await stack.start_reconciler()
    refused = await refused_resume(stack, task_id)
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION and "erased" in refused.details()
    async with stack.recovery() as recovery:
        await recovery.RunSweep(rpb.RunSweepRequest())  # every sweep: none runs it
        held = await recovery.GetRecoveryTask(rpb.GetRecoveryTaskRequest(task_id=task_id))
    assert held.task.state == rpb.RECOVERY_STATE_FAILED and held.task.generation == generation
    assert await calls(downstream) == before  # no new call with the erased payload


async def test_a_failed_task_being_resumed_is_not_erased(
    held_stack: Stack, downstream: Downstream, database_url: str
) -> None:
    stack = held_stack
    name = f"resumed-{uuid.uuid4().hex}"
    task_id = await failed_task(stack, downstream, name)
    # the resume is in flight: recorded and sent, the executor (paused) has not taken it,
    # so the gateway still shows the task FAILED
    executor = stack.executors[0]
    os.kill(executor.pid, signal.SIGSTOP)
    try:
        async with stack.recovery() as recovery:
            await recovery.RedriveTask(
                rpb.RedriveTaskRequest(task_id=task_id, actor="test", reason="resume")
            )
        async with stack.client() as client:
            assert (await client.get(task_id)).status == "FAILED"
            with pytest.raises(DispoError) as refused:
                await client.erase(task_id)
            assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert task_id in refused.value.message and "being resumed" in refused.value.message
            assert "task_id" in refused.value.violations
            # nothing changed: not erased, the payload still there in every service
            view = await client.get(task_id)
            assert view.erased_at is None and name in str(view.raw)
        assert {h.split(".")[0] for h in await holders(database_url, name)} == set(SCHEMAS)
    finally:
        os.kill(executor.pid, signal.SIGCONT)
    async with stack.client() as client:
        await wait_status(client, task_id, {"SUCCEEDED"})
        # once the resume has ended, the erasure goes through
        assert (await client.erase(task_id)).erased_at is not None


async def test_without_the_reconciler_a_failed_task_is_not_erased(
    held_stack: Stack, downstream: Downstream, database_url: str, bus
) -> None:
    stack = held_stack
    name = f"unsealed-{uuid.uuid4().hex}"
    task_id = await failed_task(stack, downstream, name)
    sent: list[bytes] = []

    async def on_erase(msg: Any) -> None:
        sent.append(msg.data)

    subscription = await bus.nc.subscribe(tasks.TASK_ERASE, cb=on_erase)
    reconciler = stack.reconciler
    os.kill(reconciler.pid, signal.SIGSTOP)  # hung: the seal is not answered
    try:
        async with stack.client() as client:
            with pytest.raises(DispoError) as refused:
                await client.erase(task_id)
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE
            assert task_id in refused.value.message
            view = await client.get(task_id)
            assert view.erased_at is None and name in str(view.raw)
    finally:
        os.kill(reconciler.pid, signal.SIGCONT)
    try:
        # no half-written erasure: no task.erase was sent, the payload is everywhere still
        assert {h.split(".")[0] for h in await holders(database_url, name)} == set(SCHEMAS)
        async with stack.client() as client:
            erased = await client.erase(task_id)  # with the reconciler back, it goes through
        assert erased.erased_at is not None
        await eventually(lambda: len(sent), timeout=30, wanted="the task.erase")
        assert [task_id.encode() in data for data in sent] == [True]
    finally:
        await subscription.unsubscribe()
