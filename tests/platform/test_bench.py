"""`dispo bench`: its figures from facts, its CPU accounting of real process trees, the
commit ceiling from pgbench, and tiny runs of every shape and mode against real stacks.
No test looks at how fast anything was: only that the figures exist, add up and have sane
types."""

import json
import os
import signal
import subprocess
import sys

import pytest
from dispo.sdk import AsyncClient, cell
from dispo.tools.bench import ceiling, group_commits, load, machine
from dispo.tools.bench.report import (
    CLIENT,
    TABLE_HEADER,
    LoadFacts,
    Outcome,
    Submission,
    build_report,
    cpu_per_task,
    latency,
    render,
    result_name,
    table_row,
)
from dispo.tools.bench.run import Target, measure, parser, running_stack, write_result
from dispo.tools.bench.shapes import SHAPES, catalogue_yaml
from support.bench import run_bench


def test_latency_summary_is_in_milliseconds_and_none_when_empty():
    summary = latency([v / 1000 for v in range(101)])
    assert summary.n == 101
    assert (summary.p50_ms, summary.p99_ms, summary.max_ms) == pytest.approx((50, 99, 100))
    assert latency([]).p50_ms is None


def test_cpu_per_task_subtracts_samples_and_keeps_the_client_apart():
    cpu = cpu_per_task(
        {"gateway": 1.0, "postgres": 2.0, CLIENT: 0.5},
        {"gateway": 3.0, "postgres": 3.0, CLIENT: 1.5, "executor-2": 0.5},
        tasks=1000,
    )
    assert cpu["per_process"]["gateway"] == {"seconds": 2.0, "ms_per_task": 2.0}
    assert cpu["per_process"]["executor-2"]["seconds"] == 0.5  # started after the first sample
    assert cpu["stack_seconds"] == 3.5
    assert (cpu["stack_ms_per_task"], cpu["all_ms_per_task"]) == (3.5, 4.5)


def synthetic_report(rate: float | None = None) -> dict:
    facts = LoadFacts(started_at=1000.0, offered_rate=rate)
    facts.submissions = [
        Submission(0.0, 0.010, "t1"),
        Submission(0.5, 0.020, "t2", lag=0.001),
        Submission(1.0, 0.5, "", error="UNAVAILABLE"),
        *(Submission(1.2, 0.001, "", error="RESOURCE_EXHAUSTED") for _ in range(2)),
    ]
    outcomes = [
        Outcome("t1", "SUCCEEDED", 1000.0, 1000.5),
        Outcome("t2", "SUCCEEDED", 1000.5, 1002.0),
    ]
    return build_report(
        created="2026-12-01T10:00:00+00:00",
        machine={"cores": 2, "memory_bytes": 2**30, "cpu_model": "x", "loadavg_before": [0.1]},
        config={
            "shape": "dag3",
            "rate": rate,
            "tasks": 3,
            "concurrency": None if rate else 8,
            "gateways": 2,
            "executors": 3,
            "nats_nodes": 3,
        },
        nodes_per_task=3,
        load=facts,
        outcomes=outcomes,
        cpu_before={"gateway": 0.0},
        cpu_after={"gateway": 1.0},
        machine_busy=(3.0, 2.0),
        ceiling={"tps_by_clients": {"1": 100.0, "32": 900.0}},
        status_events=(3, 2),
        wal_bytes=13_000,
    )


def test_report_counts_from_the_run_start_and_names_its_file():
    report = synthetic_report(rate=2.0)
    through = report["throughput"]
    assert (through["submitted"], through["submit_errors"], through["completed"]) == (2, 3, 2)
    assert through["submit_errors_by_code"] == {"RESOURCE_EXHAUSTED": 2, "UNAVAILABLE": 1}
    [submitted] = [line for line in render(report) if line.startswith("submitted")]
    assert "3 errors: RESOURCE_EXHAUSTED 2, UNAVAILABLE 1" in submitted
    assert "DISPO_GATEWAY_SUBMIT_RATE_PER_SECOND" in submitted
    assert through["submitted_per_s"] == pytest.approx(2 / 1.5)  # last answer at 1.5 s
    assert through["completed_per_s"] == 1.0  # last terminal 2 s after the start
    assert through["node_runs_per_s"] == 3.0
    assert report["latency"]["submit_to_terminal"]["max_ms"] == 1500.0
    assert report["machine"]["during_run"]["busy_cores"] == 1.5
    assert report["machine"]["during_run"]["others_cpu_seconds"] == 2.0
    assert report["statuses"] == {"SUCCEEDED": 2}
    assert report["status_events_per_task"] == 1.5  # 3 snapshots in 2 tasks' histories
    assert any("1.50 per task" in line for line in render(report))
    assert report["postgres_wal_bytes_per_task"] == 6_500  # 13,000 bytes for 2 completed tasks
    assert any("6,500 bytes per completed task" in line for line in render(report))
    assert result_name(report) == "20261201T100000-dag3-rate2-g2e3-nats3.json"
    assert any("commit ceiling" in line for line in render(report))
    row = table_row(report)
    assert row.count("|") == TABLE_HEADER.splitlines()[0].count("|")
    assert "dag3, 2/s offered" in row and "100 / 900" in row
    assert synthetic_report()["latency"]["send_lag"] is None  # saturation: no schedule


SCRAPE = """\
# HELP dispo_group_commit_items Items written by one flush of a group commit
# TYPE dispo_group_commit_items histogram
dispo_group_commit_items_bucket{group="submits",le="1.0"} 3.0
dispo_group_commit_items_bucket{group="submits",le="+Inf"} 10.0
dispo_group_commit_items_count{group="submits"} 10.0
dispo_group_commit_items_sum{group="submits"} 250.0
dispo_group_commit_items_count{group="statuses"} 4.0
dispo_group_commit_items_sum{group="statuses"} 4.0
# HELP dispo_tasks_accepted_total Tasks accepted
# TYPE dispo_tasks_accepted_total counter
dispo_tasks_accepted_total{business="b"} 250.0
"""


def test_group_commits_are_read_from_a_scrape_and_compared_between_two_readings():
    assert group_commits.parse(SCRAPE) == {"statuses": (4.0, 4.0), "submits": (10.0, 250.0)}
    assert group_commits.parse("# nothing here\n") == {}
    before = {"gateway": group_commits.parse(SCRAPE)}
    after = {
        "gateway": {"statuses": (4.0, 4.0), "submits": (14.0, 650.0)},  # statuses: no flush
        "executor": {"task openings": (5.0, 400.0)},  # not read before: from zero
    }
    moved = group_commits.between(before, after)
    assert moved == {
        "executor": {"task openings": {"flushes": 5, "items": 400, "items_per_flush": 80.0}},
        "gateway": {"submits": {"flushes": 4, "items": 400, "items_per_flush": 100.0}},
    }
    report = synthetic_report()
    assert report["group_commits"] is None
    assert not any(line.startswith("items per flush") for line in render(report))
    report["group_commits"] = moved
    [line] = [line for line in render(report) if line.startswith("items per flush")]
    assert line.endswith(
        "executor: task openings 80.0 (5 flushes); gateway: submits 100.0 (4 flushes)"
    )


def test_a_running_stack_in_the_data_folder_lends_its_processes_when_the_load_goes_to_it(
    tmp_path,
):
    """Against ``dispo up``'s stack (its state file in the data folder), the bench measures
    the processes recorded there that still run and reads the metrics of those services."""
    from dispo.tools.stack.ownership import start_ticks
    from dispo.tools.stack.state import STATE_FILE

    assert running_stack(["127.0.0.1:50051"], tmp_path) == ({}, {})  # no stack here
    me = {"pid": os.getpid(), "started": start_ticks(os.getpid())}
    gone = {"pid": os.getpid(), "started": 1}  # a pid reused by another process since
    state = {
        "services": {
            "gateway": {"address": "127.0.0.1:50051", "metrics": "http://m/gw", **me},
            "gateway-2": {"address": "127.0.0.1:50061", "metrics": "http://m/gw2", **me},
            "executor": {"address": "127.0.0.1:50052", "metrics": "http://m/ex", **gone},
        },
        "companions": {"demo-downstream": me},
        "infrastructure": {"postgres": me, "nats": gone},
    }
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    pids, metrics = running_stack(["127.0.0.1:50061"], tmp_path)
    assert pids == {
        name: os.getpid() for name in ("gateway", "gateway-2", "demo-downstream", "postgres")
    }
    assert metrics == {"gateway": "http://m/gw", "gateway-2": "http://m/gw2"}
    # The load goes to another stack's gateway: nothing of this one is counted.
    assert running_stack(["127.0.0.1:60000"], tmp_path) == ({}, {})


BURNER = """
import os, sys, time
def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        burn(0.32)  # over 0.3 s as /proc counts it, in 10 ms ticks
        print("burnt", flush=True)
        time.sleep(120)
        os._exit(0)
    kids.append(pid)
print(*kids, flush=True)
while kids:
    kids.remove(os.wait()[0])
print("reaped", flush=True)
time.sleep(120)
"""


async def test_cpu_of_a_process_tree_sums_its_live_and_its_reaped_children():
    parent = subprocess.Popen(
        [sys.executable, "-c", BURNER], stdout=subprocess.PIPE, text=True, bufsize=1
    )
    try:
        assert parent.stdout is not None
        kids = [int(pid) for pid in parent.stdout.readline().split()]
        assert [parent.stdout.readline().strip() for _ in kids] == ["burnt", "burnt"]
        tree = machine.tree_cpu_seconds({"tree": parent.pid})["tree"]
        parts = [machine.process_times(pid) for pid in (parent.pid, *kids)]
        assert tree == pytest.approx(sum(own + reaped for _, own, reaped in parts))
        assert tree >= 0.6  # each child burnt over 0.3 s of CPU time
        for kid in kids:
            os.kill(kid, signal.SIGKILL)
        assert parent.stdout.readline().strip() == "reaped"
        # Gone from /proc, their time now counted as the parent's reaped children's.
        assert machine.tree_cpu_seconds({"tree": parent.pid})["tree"] >= tree
    finally:
        parent.kill()
        parent.wait()


def test_machine_description_and_busy_time():
    described = machine.describe()
    assert described["cores"] >= 1 and described["memory_bytes"] > 0
    assert isinstance(described["cpu_model"], str) and len(described["loadavg_before"]) == 3
    assert machine.busy_cpu_seconds() > 0


def test_commit_ceiling_runs_pgbench_in_a_scratch_database(infra):
    figures = ceiling.commit_ceiling(infra.postgres.url, clients=(1, 2), seconds=1)
    assert set(figures["tps_by_clients"]) == {"1", "2"}
    assert all(isinstance(v, float) and v > 0 for v in figures["tps_by_clients"].values())
    assert figures["fsync"] == "off"  # the tests' throwaway cluster, reported as such
    assert not infra.postgres.psql(
        f"SELECT 1 FROM pg_database WHERE datname = '{ceiling.SCRATCH}'"
    ).strip()


def test_parse_tps_refuses_output_without_a_figure():
    assert ceiling.parse_tps("tps = 812.5 (without initial connection time)\n") == 812.5
    with pytest.raises(ValueError):
        ceiling.parse_tps("connection refused")
    # Nothing committed in the duration (a machine too busy): no rate printed, none reached.
    idle = "number of clients: 32\nduration: 1 s\nnumber of transactions actually processed: 0\n"
    assert ceiling.parse_tps(idle) == 0.0
    with pytest.raises(ValueError):
        ceiling.parse_tps("number of transactions actually processed: 10\n")


@pytest.fixture
async def bench_stack(start_service, downstream, infra, tmp_path):
    """A gateway and an executor on the bench catalogue (HTTP actions on the demo downstream)."""
    catalogue = tmp_path / "bench-catalogue.yaml"
    catalogue.write_text(catalogue_yaml(downstream.url))
    env = {"DISPO_CATALOGUE": str(catalogue)}
    gateway = await start_service("gateway", env)
    executor = await start_service("executor", env)
    pids = {"gateway": gateway.pid, "executor": executor.pid, "nats": infra.nats.process.pid}
    return Target([gateway.address], pids, None, infra.tokens.admin)


def check_report(report: dict, tasks: int, shape: str) -> None:
    assert report["statuses"] == {"SUCCEEDED": tasks}
    through = report["throughput"]
    assert (through["submitted"], through["completed"], through["submit_errors"]) == (
        tasks,
        tasks,
        0,
    )
    for key in ("submitted_per_s", "completed_per_s", "node_runs_per_s", "seconds"):
        assert isinstance(through[key], float) and through[key] > 0, key
    for name in ("submit", "submit_to_terminal"):
        summary = report["latency"][name]
        assert summary["n"] == tasks
        assert all(isinstance(summary[k], float) for k in ("p50_ms", "p95_ms", "p99_ms"))
        assert summary["p50_ms"] <= summary["p95_ms"] <= summary["p99_ms"]
    assert report["config"]["shape"] == shape
    assert report["config"]["nodes_per_task"] == SHAPES[shape].nodes
    cpu = report["cpu"]
    # A run of a few tasks may fall within one clock tick of CPU: measured, not necessarily > 0.
    assert isinstance(cpu["stack_ms_per_task"], float) and cpu["stack_ms_per_task"] >= 0
    for process in ("gateway", "executor", CLIENT):
        assert isinstance(cpu["per_process"][process]["seconds"], float), process
    assert isinstance(report["machine"]["during_run"]["busy_cores"], float)
    json.dumps(report, allow_nan=False)  # a file any JSON reader takes


async def test_each_shape_runs_through_a_real_stack(bench_stack, downstream, tmp_path):
    for shape in ("noop", "dag3", "http"):
        args = parser().parse_args(["--shape", shape, "--tasks", "6", "--concurrency", "3"])
        report = await measure(args, bench_stack)
        check_report(report, 6, shape)
        written = json.loads(write_result(report, tmp_path / "results").read_text())
        assert written == report
    # The HTTP shape called the downstream for each of its three nodes (warm-up tasks too).
    calls = await downstream.calls()
    assert sum(calls.values()) >= 3 * 6


async def test_the_outputs_shape_passes_the_first_nodes_output_into_the_later_paths(
    bench_stack, downstream
):
    args = parser().parse_args(["--shape", "outputs", "--tasks", "6", "--concurrency", "3"])
    report = await measure(args, bench_stack)
    check_report(report, 6, "outputs")
    # b and c called a path carrying a's output: a's idempotency key, as a's answer gave it.
    paths = (await downstream.state())["paths"]
    firsts = [key for key in paths if key.endswith("bench_outputs3.a")]
    assert len(firsts) >= 6  # the run's tasks, and the warm-up's
    for first in firsts:
        task = first.removesuffix("bench_outputs3.a")
        for later in ("b", "c"):
            assert paths[f"{task}bench_outputs3.{later}"] == f"/bench/{later}/{first}"


async def test_the_wait_shape_parks_every_task_reads_the_executor_then_signals_each(
    bench_stack,
):
    """``--shape wait``: every task parks on its wait node (the executor read while they all
    wait: its memory, and its CPU over the sampled seconds), then each is signalled once
    and ends SUCCEEDED with the bench's payload."""
    args = parser().parse_args(
        ["--shape", "wait", "--tasks", "6", "--concurrency", "3", "--wait-seconds", "0.5"]
    )
    report = await measure(args, bench_stack)
    check_report(report, 6, "wait")
    parked = report["waiting"]
    assert parked["tasks"] == 6
    assert parked["executor_rss_mib_waiting"] > 0 and parked["executor_rss_mib_before"] > 0
    assert isinstance(parked["executor_cpu_percent_waiting"], float)
    assert any(line.startswith("waiting ") for line in render(report))


async def test_submit_only_measures_acceptance_without_waiting(gateway_only):
    gateway = gateway_only.gateway
    target = Target([gateway.address], {"gateway": gateway.pid}, None, gateway_only.token)
    args = parser().parse_args(["--submit-only", "--tasks", "10", "--concurrency", "4"])
    report = await measure(args, target)
    assert report["statuses"] == {"ACCEPTED": 10}  # no executor: nothing ran, nothing waited
    assert (report["throughput"]["submitted"], report["throughput"]["completed"]) == (10, 0)
    assert report["throughput"]["completed_per_s"] is None
    assert report["latency"]["submit"]["n"] == 10
    assert report["latency"]["submit_to_terminal"]["n"] == 0
    assert report["cpu"]["per"] == "accepted task"
    assert isinstance(report["cpu"]["per_process"]["gateway"]["ms_per_task"], float)
    # The SDK's submit(): submits in flight gathered into SubmitEach calls.
    assert report["config"]["gather"] is True
    assert "submit() gathered" in "\n".join(render(report))
    assert result_name(report).endswith("-noop-saturation-submit-gathered-g1.json")

    # One Submit call per task (--unary), as a client without the SDK sends them.
    args = parser().parse_args(["--submit-only", "--tasks", "10", "--concurrency", "4", "--unary"])
    report = await measure(args, target)
    assert report["config"]["gather"] is False
    assert report["statuses"] == {"ACCEPTED": 10}
    assert "Submit " in "\n".join(render(report))
    assert result_name(report).endswith("-noop-saturation-submit-g1.json")

    # By SubmitMany: 10 tasks in calls of 4 (the last of 2), latency figures per task.
    args = parser().parse_args(
        ["--submit-only", "--tasks", "10", "--concurrency", "2", "--batch", "4"]
    )
    report = await measure(args, target)
    assert report["config"]["batch"] == 4
    assert report["config"]["gather"] is False
    assert report["statuses"] == {"ACCEPTED": 10}
    assert report["latency"]["submit"]["n"] == 10
    assert "SubmitMany(4) per call" in "\n".join(render(report))
    assert result_name(report).endswith("-noop-saturation-submit-batch4-g1.json")

    # From 6 threads sharing the blocking Client, which gathers their submits.
    args = parser().parse_args(["--submit-only", "--tasks", "30", "--threads", "6"])
    report = await measure(args, target)
    assert (report["config"]["threads"], report["config"]["concurrency"]) == (6, None)
    assert report["config"]["gather"] is True
    assert report["statuses"] == {"ACCEPTED": 30}
    assert report["latency"]["submit"]["n"] == 30
    assert "Client.submit() gathered" in "\n".join(render(report))
    assert "6 threads" in table_row(report)
    assert result_name(report).endswith("-noop-saturation-submit-threads6-gathered-g1.json")


async def test_rate_mode_offers_the_asked_count_on_schedule_order(bench_stack):
    async with AsyncClient(bench_stack.gateways[0], token=bench_stack.token) as client:
        answers: list[None] = []
        submitter = load.Submitter(
            [client], "rate-check", lambda: [cell("noop")], answered=lambda: answers.append(None)
        )
        facts = await load.offer(submitter, 25, rate=200.0)
        outcomes = await load.outcomes(client, "rate-check", timeout=60)
    assert facts.offered_rate == 200.0
    assert len(facts.submissions) == len(answers) == 25  # each answer a step of the bar
    assert len({s.task_id for s in facts.accepted}) == 25
    # Open loop on schedule: the i-th send is never before i / rate (all at once would be).
    sends = sorted(s.sent_at for s in facts.submissions)
    assert all(sent >= i / 200.0 for i, sent in enumerate(sends))
    assert sorted(o.task_id for o in outcomes) == sorted(s.task_id for s in facts.accepted)
    assert {o.status for o in outcomes} == {"SUCCEEDED"}


async def test_dispo_bench_submit_on_its_own_scaled_out_stack(tmp_path):
    """The command end to end: two gateways, two executors, a three-node NATS cluster, the
    HTTP shape at a fixed rate; the result file accounts for every process it started."""
    results = tmp_path / "results"
    path, report, out = run_bench(
        results,
        "submit",
        "--start",
        "--shape",
        "http",
        "--rate",
        "20",
        "--tasks",
        "8",
        "--gateways",
        "2",
        "--executors",
        "2",
        "--cluster",
        "--ceiling-seconds",
        "1",
    )
    check_report(report, 8, "http")
    assert path.name.endswith("-http-rate20-gathered-g2e2-nats3.json")
    processes = set(report["cpu"]["per_process"])
    expected = {"gateway-2", "executor-2", "reconciler", "postgres", "demo-downstream"}
    assert expected | {f"nats-{i}" for i in range(3)} <= processes
    assert report["cpu"]["per_process"]["postgres"]["seconds"] > 0
    assert set(report["postgres_commit_ceiling"]["tps_by_clients"]) == {"1", "32"}
    assert report["throughput"]["offered_per_s"] == 20.0
    assert "PostgreSQL commit ceiling" in out
    # Read back from the histories: every task has at least its terminal snapshot.
    assert report["status_events_per_task"] >= 1.0
    assert "status events" in out
    # Every accepted task was written (and its view updated) in the stack's PostgreSQL.
    assert report["postgres_wal_bytes_per_task"] > 1000
    assert "PostgreSQL WAL" in out
    # Each process's group commits, read from its metrics: every accepted task an item of a
    # gateway's Submit flushes, an executor's openings and the reconciler's finished facts.
    groups = report["group_commits"]

    def items(group: str, *processes: str) -> int:
        return sum(groups.get(p, {}).get(group, {}).get("items", 0) for p in processes)

    assert items("submits", "gateway", "gateway-2") >= 8
    assert items("task openings", "executor", "executor-2") >= 8
    assert items("finished facts", "reconciler") >= 8
    assert all(g["flushes"] >= 1 for by in groups.values() for g in by.values())
    assert "items per flush" in out


def test_dispo_bench_submit_runs_the_worker_shape_on_workers_of_its_own(tmp_path):
    """``--shape worker``: the bench starts its worker processes beside its stack, their
    runs take every node of every task, and their CPU is reported as the stack's is."""
    results = tmp_path / "results"
    path, report, out = run_bench(
        results,
        "submit",
        "--start",
        "--shape",
        "worker",
        "--workers",
        "2",
        "--tasks",
        "8",
        "--concurrency",
        "4",
        "--ceiling-seconds",
        "0",
    )
    check_report(report, 8, "worker")
    assert path.name.endswith("-worker-saturation-gathered-g1e1w2.json")
    assert (report["config"]["workers"], report["config"]["worker_concurrency"]) == (2, 100)
    processes = report["cpu"]["per_process"]
    assert {"worker-1", "worker-2"} <= set(processes)
    # (Sampled in clock ticks: a few runs may cost a worker less than one.)
    assert all(isinstance(processes[w]["seconds"], float) for w in ("worker-1", "worker-2"))
    assert "worker-1" in out and "2 workers of 100 runs" in out
    # Every node ran as a worker run (only the bench's workers serve its queue), offered
    # in the executor's group commits.
    assert report["group_commits"]["executor"]["worker run offers"]["items"] >= 3 * 8
