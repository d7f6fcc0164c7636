"""Retention on the clock, with the gateway, the executor and the reconciler as real processes
on one file clock: each deletes what it keeps about the tasks finished before their
business's retention (SUCCEEDED, CANCELLED, FAILED), and keeps what is running and what is
within the period; a business's own period in the policy file is honoured; a task submitted
again under a purged task's idempotency key is a new task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import pytest
from dispo.sdk import AsyncClient, DispoError, cell
from pipeline_fixtures import Downstream, Pipeline, wait_status
from support import eventually

pytestmark = pytest.mark.long_file

POLICY = """
default:
  retention_days: 30
businesses:
  keeper:
    retention_days: 90
  brief:
    retention_days: 7
"""

# Where each service keeps a task, by the column naming it.
TABLES = {
    "gateway": ["gateway.tasks"],
    "executor": ["executor.task_runs", "executor.node_runs"],
    "reconciler": ["reconciler.completions"],
}


@dataclass
class Stack:
    pipeline: Pipeline
    clock: Any
    database_url: str
    reconciler: Any

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``dispo args`` against these services, as the admin."""
        env = {
            "PATH": os.environ["PATH"],
            "DISPO_DATA_DIR": "/nonexistent",  # no stack there: the addresses below
            "DISPO_TOKEN": self.pipeline.token,
        }
        for name, process in (
            ("gateway", self.pipeline.gateway),
            ("executor", self.pipeline.executors[0]),
            ("reconciler", self.reconciler),
        ):
            host, port = process.address.rsplit(":", 1)
            env[f"DISPO_{name.upper()}_HOST"], env[f"DISPO_{name.upper()}_PORT"] = host, port
        dispo = str(Path(sys.executable).parent / "dispo")
        return subprocess.run([dispo, *args], capture_output=True, text=True, env=env, timeout=120)

    async def kept(self, task_id: str) -> dict[str, bool]:
        """Whether each table still holds ``task_id``."""
        conn = await asyncpg.connect(self.database_url)
        try:
            return {
                table: bool(
                    await conn.fetchval(f"SELECT count(*) FROM {table} WHERE task_id = $1", task_id)
                )
                for tables in TABLES.values()
                for table in tables
            }
        finally:
            await conn.close()

    async def until(self, wanted: str, check) -> None:
        """Until ``check()`` holds, the clock moved a second at each look (the services'
        periodic passes wait on it)."""

        async def look() -> bool:
            self.clock.advance(seconds=1)
            return bool(await check())

        await eventually(look, timeout=60, interval=0.3, wanted=wanted)


@pytest.fixture
async def make_stack(
    start_service, catalogue_file, downstream: Downstream, file_clock, tmp_path, database_url
):
    """``await make_stack(**env)``: the three services on the file clock and the policy."""

    async def make(**env: str) -> Stack:
        policy = tmp_path / "policy.yaml"
        policy.write_text(POLICY)
        common = {
            **file_clock.env,
            "DISPO_BUSINESS_POLICY": str(policy),
            "DISPO_RETENTION_INTERVAL_SECONDS": "1",
            "DISPO_RETENTION_BATCH": "2",  # several batches a pass
            **env,
        }
        pipeline = Pipeline(start_service, catalogue_file, downstream.url)
        await pipeline.start_gateway(**common)
        await pipeline.start_executor(**common)
        reconciler = await start_service(
            "reconciler",
            {
                **common,
                "DISPO_CATALOGUE": str(catalogue_file),
                "DISPO_EGRESS_ALLOW": downstream.url,
                "DISPO_RECONCILER_GATEWAY_ADDRESS": pipeline.gateway.address,
                "DISPO_RECONCILER_EXECUTOR_ADDRESS": pipeline.executor_address,
                "DISPO_RECONCILER_SWEEP_INTERVAL_SECONDS": "1",
            },
        )
        return Stack(pipeline, file_clock, database_url, reconciler)

    return make


@pytest.fixture
async def stack(make_stack) -> AsyncIterator[Stack]:
    yield await make_stack()


async def finish(client: AsyncClient, business: str, name: str) -> str:
    task = await client.submit(business, [cell("step", name=name)], idempotency_key=name)
    await wait_status(client, task.task_id, {"SUCCEEDED", "FAILED", "CANCELLED"})
    return task.task_id


async def gone(client: AsyncClient, task_id: str) -> bool:
    try:
        await client.get(task_id)
    except DispoError as error:
        assert error.code == grpc.StatusCode.NOT_FOUND, error
        return True
    return False


async def test_retention_deletes_the_finished_tasks_past_their_period_in_every_service(
    stack: Stack, downstream: Downstream
) -> None:
    async with stack.pipeline.client() as client:
        succeeded = await finish(client, "shop", "shop-ok")
        await downstream.control(fail={"status": 400, "times": 1, "path": "/step/shop-fail"})
        failed = await finish(client, "shop", "shop-fail")
        await downstream.control(hold={"path": "/step/shop-cancel", "times": 1})
        cancelling = await client.submit(
            "shop", [cell("step", name="shop-cancel")], idempotency_key="shop-cancel"
        )
        await downstream.wait_held()
        await client.cancel(cancelling.task_id)
        await downstream.control(release=True)
        kept_long = await finish(client, "keeper", "keeper-ok")
        brief = await finish(client, "brief", "brief-ok")
        statuses = {t: (await client.get(t)).status for t in (succeeded, failed)}
        statuses[cancelling.task_id] = (
            await wait_status(client, cancelling.task_id, {"CANCELLED"})
        ).status
        assert statuses == {
            succeeded: "SUCCEEDED",
            failed: "FAILED",
            cancelling.task_id: "CANCELLED",
        }
        # work in flight: its call held
        await downstream.control(hold={"path": "/step/shop-running"})
        running = await client.submit(
            "shop", [cell("step", name="shop-running")], idempotency_key="shop-running"
        )
        await downstream.wait_held()
        finished = [succeeded, failed, cancelling.task_id]
        every = [*finished, kept_long, brief]
        # each service holds every finished task once the reconciler recorded it
        await stack.until(
            "every finished task recorded everywhere",
            lambda: all_kept(stack, every),
        )

        # a week and a day on: only the brief business's task is past its period (7 days)
        stack.clock.advance(days=8)
        await stack.until(
            "the brief business's task deleted everywhere",
            lambda: nowhere(stack, brief),
        )
        assert await gone(client, brief)
        for task_id in [*finished, kept_long]:
            assert all((await stack.kept(task_id)).values()), task_id

        # a month on: the default 30 days have passed for the shop's finished tasks
        stack.clock.advance(days=23)
        for task_id in finished:
            await stack.until(f"{task_id} deleted everywhere", lambda t=task_id: nowhere(stack, t))
            assert await gone(client, task_id)
        # the keeper's 90 days have not; the running task is not finished
        assert all((await stack.kept(kept_long)).values())
        assert (await client.get(kept_long)).status == "SUCCEEDED"
        running_now = await stack.kept(running.task_id)
        assert running_now["gateway.tasks"] and running_now["executor.task_runs"], running_now
        assert (await client.get(running.task_id)).status not in {
            "SUCCEEDED",
            "FAILED",
            "CANCELLED",
        }

        # the purged task's idempotency key is free: the same Submit is a new task
        again = await client.submit(
            "shop", [cell("step", name="shop-ok")], idempotency_key="shop-ok"
        )
        assert again.task_id != succeeded
        await wait_status(client, again.task_id, {"SUCCEEDED"})

        # three months on, the keeper's task goes too
        stack.clock.advance(days=60)
        await stack.until("the keeper's task deleted", lambda: nowhere(stack, kept_long))
        await downstream.control(release=True)


async def all_kept(stack: Stack, task_ids: list[str]) -> bool:
    for task_id in task_ids:
        if not all((await stack.kept(task_id)).values()):
            return False
    return True


async def nowhere(stack: Stack, task_id: str) -> bool:
    return not any((await stack.kept(task_id)).values())


async def test_a_dry_run_counts_what_each_service_would_delete_and_deletes_nothing(
    make_stack,
) -> None:
    stack = await make_stack(DISPO_RETENTION_ENABLED="false")
    async with stack.pipeline.client() as client:
        done = [await finish(client, "shop", f"dry-{i}") for i in range(2)]
        kept_long = await finish(client, "keeper", "dry-keeper")
        await stack.until("recorded everywhere", lambda: all_kept(stack, [*done, kept_long]))
    # set aside by the relays: a task.create never published (work: held for an operator),
    # and a status snapshot set aside longer ago than the longest retention (90 days)
    conn = await asyncpg.connect(stack.database_url)
    try:
        for schema, subject in [("gateway", "task.create"), ("executor", "task.status.x.failed")]:
            await conn.execute(
                f"INSERT INTO {schema}.outbox (subject, msg_id, payload, created_at, attempts,"
                " last_error, quarantined_at) VALUES ($1, 'set-aside', 'x', $2, 8, 'refused', $2)",
                subject,
                datetime(2025, 9, 1, tzinfo=UTC),
            )
    finally:
        await conn.close()
    stack.clock.advance(days=31)

    def rows(report: dict[str, Any]) -> dict[str, dict[str, tuple[int, int]]]:
        return {
            service: {b["business"]: (b["retention_days"], int(b["due"])) for b in r["businesses"]}
            for service, r in report.items()
        }

    def shown_json() -> dict[str, Any]:
        stack.clock.advance(seconds=1)  # the reconciler's facts reconciled first
        shown = stack.cli("retention", "show", "--json")
        assert shown.returncode == 0, shown.stderr
        return json.loads(shown.stdout)

    wanted = {"shop": (30, 2), "keeper": (90, 0)}
    report = await eventually(
        shown_json,
        lambda r: rows(r) == dict.fromkeys(("gateway", "executor", "reconciler"), wanted),
        timeout=60,
        wanted="every service's dry run",
    )
    for service, reply in report.items():
        assert reply["service"] == service and reply["enabled"] is False
        assert reply["default_retention_days"] == 30
    records = {
        service: {r["table"]: (int(r["due"]), int(r["held"])) for r in reply["records"]}
        for service, reply in report.items()
    }
    assert records == {
        "gateway": {"bulk_actions": (0, 0), "outbox": (0, 1), "quarantine": (0, 0)},
        "executor": {"outbox": (1, 0), "quarantine": (0, 0)},
        "reconciler": {"outbox": (0, 0), "quarantine": (0, 0)},
    }
    assert all(r["retention_days"] == 90 for r in report["gateway"]["records"])
    # nothing was deleted: a dry run, and retention off
    for task_id in [*done, kept_long]:
        assert all((await stack.kept(task_id)).values())
    # one business, one service, as a table
    shown = stack.cli("retention", "show", "--service", "executor", "--business", "shop")
    assert shown.returncode == 0 and "shop" in shown.stdout and "keeper" not in shown.stdout
    assert "quarantine" in shown.stdout  # the records it keeps besides the tasks
    shown = stack.cli("retention", "show", "--service", "gateway")
    assert "1 set-aside messages held until an operator acts" in shown.stdout, shown.stdout
    # a malformed business is refused, naming the field
    refused = stack.cli("retention", "show", "--business", "not a business!")
    assert refused.returncode == 4 and "business" in refused.stderr, refused
