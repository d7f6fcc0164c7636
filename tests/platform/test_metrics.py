"""Every service serves its Prometheus metrics; the counters move where the events happen,
with the right labels; docs/metrics.md lists exactly the families the services export.

One stack of the five services for the module (real processes, as ``dispo up`` runs them),
each with its metrics endpoint on a free port.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from dispo.libs import metrics
from dispo.libs.process import ManagedProcess, free_port
from dispo.sdk import AsyncClient, DispoError, cell
from dispo.tools.stack.stack import SERVICES
from pipeline_fixtures import EXECUTOR_TEST_ENV, TEST_CATALOGUE, Downstream
from prometheus_client.parser import text_string_to_metric_families
from support import eventually
from support.auth import session_tokens

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@dataclass
class Stack:
    processes: dict[str, ManagedProcess]
    metrics: dict[str, str]
    downstream: Downstream

    def client(self) -> AsyncClient:
        return AsyncClient(self.processes["gateway"].address, token=session_tokens().admin)

    async def scrape(self, service: str) -> Samples:
        async with httpx.AsyncClient() as http:
            answer = await http.get(self.metrics[service])
        answer.raise_for_status()
        return {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(answer.text)
            for sample in family.samples
        }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture(scope="module")
async def stack(
    module_services: Any, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    root = tmp_path_factory.mktemp("metrics")
    downstream = Downstream(free_port(), root / "downstream.log")
    downstream.spawn()
    await downstream.wait_ready(15)
    catalogue = root / "catalogue.yaml"
    catalogue.write_text(TEST_CATALOGUE.format(url=downstream.url))
    ports = {name: free_port() for name in SERVICES}
    common = {"DISPO_CATALOGUE": str(catalogue), "DISPO_METRICS_CACHE_SECONDS": "0"}
    env = {
        # at debug, every call's rpc line is logged (a Submit's among them)
        "gateway": {"DISPO_EGRESS_ALLOW": downstream.url, "DISPO_LOG_LEVEL": "debug"},
        # and every node's line (a task's own line alone is at info)
        "executor": {**EXECUTOR_TEST_ENV, "DISPO_LOG_LEVEL": "debug"},
        "reconciler": {"DISPO_RECONCILER_DRIFT_INTERVAL_SECONDS": "3600"},
        "intelligence": {},
        "pool": {"DISPO_POOL_LOCAL_REGISTRY": str(root / "registry.sqlite")},
    }
    processes = dict(
        zip(
            SERVICES,
            await asyncio.gather(
                *(
                    module_services.start(
                        name,
                        {
                            **common,
                            **env[name],
                            f"DISPO_{name.upper()}_METRICS_PORT": str(ports[name]),
                        },
                    )
                    for name in SERVICES
                )
            ),
            strict=True,
        )
    )
    yield Stack(
        processes,
        {name: f"http://127.0.0.1:{port}/metrics" for name, port in ports.items()},
        downstream,
    )
    downstream.kill()


# A family each service's scrape-time probes always fill in.
PROBED = {
    "gateway": "dispo_outbox_unsent_rows",
    "executor": "dispo_breaker_state",
    "reconciler": "dispo_recovery_backlog_tasks",
    "intelligence": "dispo_consumer_pending_messages",
    "pool": "dispo_pool_queue_depth",
}


# The services that write an outbox (the intelligence service publishes nothing).
OUTBOXES = ("gateway", "executor", "reconciler", "pool")
OUTBOX_GAUGES = (
    "dispo_outbox_unsent_rows",
    "dispo_outbox_oldest_unsent_age_seconds",
    "dispo_outbox_quarantined_rows",
)


async def test_every_service_serves_its_families(stack: Stack) -> None:
    for service in SERVICES:
        samples = await stack.scrape(service)
        names = {name for name, _ in samples}
        assert {"process_cpu_seconds_total", PROBED[service]} <= names, (service, names)
        outbox = {name for name, labels in samples if labels == frozenset({("outbox", "outbox")})}
        expected = set(OUTBOX_GAUGES) if service in OUTBOXES else set()
        assert outbox == expected, (service, outbox)
    executor = await stack.scrape("executor")
    assert value(executor, "dispo_breaker_state", downstream="demo") == 0  # closed


async def test_a_task_and_a_failing_task_move_the_counters_with_their_labels(
    stack: Stack,
) -> None:
    before = {s: await stack.scrape(s) for s in ("gateway", "executor", "reconciler")}
    # the first call answers 500 (a short retry), the second succeeds; the other task's call
    # is refused for good (400)
    await stack.downstream.control(fail={"path": "/step/flaky", "status": 500, "times": 1})
    await stack.downstream.control(fail={"path": "/step/broken", "status": 400, "times": 1})
    async with stack.client() as client:
        ok = await client.submit("metrics", [cell("step", name="flaky")])
        bad = await client.submit("metrics", [cell("step", name="broken"), cell("noop")])
        assert (await client.wait(ok.task_id, timeout=60)).status == "SUCCEEDED"
        assert (await client.wait(bad.task_id, timeout=60)).status == "FAILED"

    def moved(service: str, now: Samples, name: str, **labels: str) -> float:
        return value(now, name, **labels) - value(before[service], name, **labels)

    gateway = await eventually(
        lambda: stack.scrape("gateway"),
        lambda s: (
            moved("gateway", s, "dispo_tasks_finished_total", business="metrics", status="failed")
            == 1
        ),
        wanted="the failed task counted by the gateway",
    )
    assert moved("gateway", gateway, "dispo_tasks_accepted_total", business="metrics") == 2
    assert (
        moved("gateway", gateway, "dispo_cells_accepted_total", business="metrics", cell="step")
        == 2
    )
    assert (
        moved("gateway", gateway, "dispo_cells_accepted_total", business="metrics", cell="noop")
        == 1
    )
    assert (
        moved(
            "gateway", gateway, "dispo_tasks_finished_total", business="metrics", status="succeeded"
        )
        == 1
    )
    assert (
        moved(
            "gateway",
            gateway,
            "dispo_cells_finished_total",
            business="metrics",
            cell="noop",
            status="failed",
        )
        == 1
    )

    # the failed task is held by the reconciler for an operator: its backlog gauge moved
    await eventually(
        lambda: stack.scrape("reconciler"),
        lambda s: moved("reconciler", s, "dispo_recovery_backlog_tasks", kind="failed") == 1,
        wanted="the failed task in the reconciler's backlog",
    )
    executor = await stack.scrape("executor")
    call = {"action": "call", "downstream": "demo"}
    assert moved("executor", executor, "dispo_node_runs_total", **call, status="pending") == 1
    assert moved("executor", executor, "dispo_node_runs_total", **call, status="succeeded") == 1
    assert moved("executor", executor, "dispo_node_runs_total", **call, status="failed") == 1
    assert moved("executor", executor, "dispo_node_retries_total", **call) == 1
    assert moved("executor", executor, "dispo_node_run_duration_seconds_count", **call) == 3


async def test_the_group_commits_count_their_flushes_and_the_items_they_wrote(
    stack: Stack,
) -> None:
    """Three tasks are three items of the gateway's Submit group commit, three openings in
    the executor and three finished facts in the reconciler, however they were batched."""
    group = "dispo_group_commit_items"
    services = ("gateway", "executor", "reconciler")
    before = {s: await stack.scrape(s) for s in services}

    def moved(service: str, now: Samples, name: str, group_name: str) -> float:
        return value(now, name, group=group_name) - value(before[service], name, group=group_name)

    async with stack.client() as client:
        accepted = await asyncio.gather(
            *(client.submit("metrics-groups", [cell("noop")]) for _ in range(3))
        )
        for task in accepted:
            assert (await client.wait(task.task_id, timeout=60)).status == "SUCCEEDED"

    reconciler = await eventually(
        lambda: stack.scrape("reconciler"),
        lambda s: moved("reconciler", s, f"{group}_sum", "finished facts") >= 3,
        wanted="the three finished facts flushed by the reconciler",
    )
    assert moved("reconciler", reconciler, f"{group}_sum", "finished facts") == 3
    gateway = await stack.scrape("gateway")
    assert moved("gateway", gateway, f"{group}_sum", "submits") == 3
    assert 1 <= moved("gateway", gateway, f"{group}_count", "submits") <= 3
    assert moved("gateway", gateway, f"{group}_sum", "statuses") >= 3  # a terminal one each
    executor = await stack.scrape("executor")
    assert moved("executor", executor, f"{group}_sum", "task openings") == 3
    flushes = moved("executor", executor, f"{group}_count", "task openings")
    assert 1 <= flushes <= 3
    # each of those flushes had at most three items: all in the bucket of up to five
    assert (
        value(executor, f"{group}_bucket", group="task openings", le="5.0")
        - value(before["executor"], f"{group}_bucket", group="task openings", le="5.0")
        == flushes
    )


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    """docs/metrics.md's table rows: name -> (type, labels)."""
    rows = re.findall(r"^\| `([a-z_]+)` \| (\w+) \| ([^|]*) \|", DOCS.read_text(), re.M)
    return {name: (kind, tuple(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows}


def test_docs_list_every_family_with_its_type_and_labels() -> None:
    declared = {d.name: (d.kind, d.labels) for d in metrics.DECLARED}
    assert documented() == declared


async def test_a_task_is_one_info_line_in_each_service_it_passes(stack: Stack) -> None:
    """Not one a step: the nodes' lines and the rpc lines are at debug (these logs keep them)."""
    async with stack.client() as client:
        task = await client.submit(
            "lines",
            [cell("review_and_close", name="one-line")],
            idempotency_key="one-line",
        )
        assert (await client.wait(task.task_id, timeout=60)).status == "SUCCEEDED"
    wanted = {
        "gateway": ["task accepted"],
        "executor": ["task pass done"],
        "reconciler": ["task finished"],
    }
    for service, events in wanted.items():
        log = stack.processes[service].log_path
        lines = await eventually(
            lambda log=log: [
                line for line in lines_about(log, task.task_id) if line["level"] == "info"
            ],
            lambda lines: len(lines) >= 1,
            wanted=f"the task's line in the {service}'s log",
        )
        assert [line["event"] for line in lines] == events, (service, lines)
    # the per-step lines are there, at debug: two nodes finished
    nodes = [
        line["node_id"]
        for line in lines_about(stack.processes["executor"].log_path, task.task_id)
        if line["event"] == "node finished" and line["level"] == "debug"
    ]
    assert sorted(nodes) == ["review_and_close.close", "review_and_close.open"]


def lines_about(log: Path, task_id: str) -> list[dict[str, Any]]:
    """The JSON lines of a service's log that mention ``task_id`` anywhere."""
    return [json.loads(line) for line in log.read_text().splitlines() if task_id in line]


def rpc_lines(log: Path, method: str, business: str) -> list[dict[str, Any]]:
    """The rpc lines of a service's log for calls of ``method`` naming ``business``."""
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [
        line
        for line in lines
        if line["event"] == "rpc"
        and line["method"].endswith(f"/{method}")
        and line.get("business") == business
    ]


async def test_the_call_slot_gauges_count_calls_under_way_and_waiting_and_return_to_zero(
    stack: Stack,
) -> None:
    """``narrow`` takes two calls at a time: of three ready nodes, two are claimed and
    calling, one waits for a slot; once every call ended, no slot is held or awaited (a
    slot lost on any path would show here)."""
    await stack.downstream.control(hold={"path": "/narrow/"})
    async with stack.client() as client:
        task = await client.submit(
            "metrics", [cell("narrow_step", ref=f"n{i}", name=f"slots{i}") for i in range(3)]
        )
        await stack.downstream.wait_held(2)
        during = await eventually(
            lambda: stack.scrape("executor"),
            lambda s: value(s, "dispo_downstream_calls_waiting", downstream="narrow") == 1,
            wanted="one node waiting for a narrow slot",
        )
        assert value(during, "dispo_downstream_calls_in_flight", downstream="narrow") == 2
        await stack.downstream.control(release=True)  # held calls answer 503: retried
        assert (await client.wait(task.task_id, timeout=60)).status == "SUCCEEDED"
    after = await eventually(
        lambda: stack.scrape("executor"),
        lambda s: value(s, "dispo_downstream_calls_in_flight", downstream="narrow") == 0,
        wanted="no narrow slot held",
    )
    for downstream in ("narrow", "demo"):
        assert value(after, "dispo_downstream_calls_in_flight", downstream=downstream) == 0
        assert value(after, "dispo_downstream_calls_waiting", downstream=downstream) == 0
    # The one executor holds the whole of each limit across the cluster (ADR-0108).
    assert value(after, "dispo_downstream_slots_share", downstream="narrow") == 2


async def test_every_log_line_about_a_task_carries_its_ids(stack: Stack) -> None:
    async with stack.client() as client:
        task = await client.submit("logs", [cell("step", name="logged")], idempotency_key="logs")
        assert (await client.wait(task.task_id, timeout=60)).status == "SUCCEEDED"
        again = await client.submit("logs", [cell("step", name="logged")], idempotency_key="logs")
        assert again.task_id == task.task_id
        with pytest.raises(DispoError, match="already SUCCEEDED"):
            await client.cancel(task.task_id)
    gateway = stack.processes["gateway"].log_path
    executor = stack.processes["executor"].log_path

    # a line logged without naming the task carries it: the refused call's, bound from the
    # request
    refused = await eventually(
        lambda: [
            line
            for line in lines_about(gateway, task.task_id)
            if line["event"] == "rpc" and line["code"] != "OK"
        ],
        wanted="the refused cancel logged",
    )
    assert refused[0]["task_id"] == task.task_id and refused[0]["code"] == "FAILED_PRECONDITION"
    # the repeated Submit is logged with the task it answered with, as the first one is
    submits = await eventually(
        lambda: rpc_lines(gateway, "Submit", "logs"),
        lambda lines: len(lines) == 2,
        wanted="both Submits logged",
    )
    assert [line["task_id"] for line in submits] == [task.task_id] * 2, submits
    # the node's lines carry the node and the business, bound where task.create was handled
    finished = await eventually(
        lambda: [
            line for line in lines_about(executor, task.task_id) if line["event"] == "node finished"
        ],
        wanted="the node's result logged",
    )
    assert (finished[0]["node_id"], finished[0]["business"]) == ("step.call", "logs")
    for log in (gateway, executor):
        lines = lines_about(log, task.task_id)
        assert lines and all(line.get("task_id") == task.task_id for line in lines), lines
