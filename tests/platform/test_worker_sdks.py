"""The Go and Node workers (examples/go's ``dispo.Worker`` run by its ``ticket-worker``,
examples/node's ``worker.mjs`` run by ``ticket-worker.mjs``) against a real stack: gateway
and executor processes, the demo downstream, and each worker as a real process on the
``tickets`` queue. Each worker records every ticket it opens as a line of a file, and
deduplicates nothing: the tests count the effects. The probe test adds a reconciler whose
clock is a file the test moves. The executor logs each gRPC call it answers (at DEBUG): the
tests read which completion calls the workers made."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.libs.api.reconciler.v1 import reconciler_pb2_grpc
from dispo.libs.process import ManagedProcess, ProcessSpec
from dispo.pool.openclaw import OpenClawUnavailable
from dispo.sdk import Client, WorkerQueue, cell
from pipeline_fixtures import TEST_CATALOGUE, Pipeline, dump, wait_until
from reconciler.processes import Reconciler
from support import eventually
from support.auth import admin_channel, worker_token
from support.go import GoUnavailable, build_example
from support.node import EXAMPLE_DIR, example_node

WORKER_CELLS = """
  w_ticket:
    description: Open a ticket through a worker of another language.
    fields:
      name: {{type: string, required: true}}
      busy: {{type: integer}}
      work_ms: {{type: integer}}
      refuse: {{type: string}}
    actions:
      open:
        kind: worker
        queue: tickets
        idempotent: true
        output: {{ticket_id: {{type: string, required: true}}}}
  w_ticket_once:
    description: Open a ticket through a worker of another language, never twice blindly.
    fields:
      name: {{type: string, required: true}}
      answer_ms: {{type: integer}}
    actions:
      open:
        kind: worker
        queue: tickets
        idempotent: false
        output: {{ticket_id: {{type: string, required: true}}}}
queues:
  reports:              # declared, served by no worker
    max_concurrency: 2
"""

# A worker silent for this long loses its run: the runs held longer than this in the tests
# stay held only through the workers' heartbeats.
RUN_LEASE = "3"

# (tracker file, grace in seconds, executor address) -> the worker's command line
Command = Callable[[Path, float, str], list[str]]


@pytest.fixture(scope="module")
def go_worker() -> Command:
    try:
        binary = build_example() / "ticket-worker"
    except GoUnavailable as missing:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no Go from Debian's packages: {missing}")
    return lambda tracker, grace, executor: [
        *(str(binary), "-executor", executor, "-queue", "tickets", "-concurrency", "4"),
        *("-grace", f"{grace}s", "-tracker", str(tracker)),
    ]


@pytest.fixture(scope="module")
def node_worker() -> Command:
    try:
        node = example_node()
    except OpenClawUnavailable as missing:
        pytest.skip(f"no Node.js: {missing}")
    script = EXAMPLE_DIR / "ticket-worker.mjs"
    return lambda tracker, grace, executor: [
        *(str(node), str(script), "--executor", executor, "--queue", "tickets"),
        *("--concurrency", "4", "--grace", str(grace), "--tracker", str(tracker)),
    ]


@pytest.fixture(params=["go", "node"])
def command(request) -> Command:
    return request.getfixturevalue(f"{request.param}_worker")


@pytest.fixture(scope="module")
async def stack(module_services, module_downstream, tmp_path_factory) -> Pipeline:
    catalogue = tmp_path_factory.mktemp("worker-sdks") / "catalogue.yaml"
    catalogue.write_text((TEST_CATALOGUE + WORKER_CELLS).format(url=module_downstream.url))
    pipeline = Pipeline(module_services.start, catalogue, module_downstream.url)
    await asyncio.gather(
        pipeline.start_gateway(),
        # DEBUG: a line per gRPC call answered (completion_calls)
        pipeline.start_executor(
            DISPO_EXECUTOR_RUN_LEASE_SECONDS=RUN_LEASE, DISPO_LOG_LEVEL="debug"
        ),
    )
    return pipeline


def completion_calls(executor, since: int = 0) -> Counter[str]:
    """The CompleteRun and CompleteRuns calls ``executor`` answered after byte ``since`` of
    its log, by method (its rpc lines, logged at DEBUG)."""
    with executor.log_path.open("rb") as log:
        log.seek(since)
        lines = [json.loads(x) for x in log.read().decode().splitlines() if x[:1] == "{"]
    return Counter(
        method
        for line in lines
        if line.get("event") == "rpc"
        and (method := line.get("method", "").rpartition("/")[2]) in ("CompleteRun", "CompleteRuns")
    )


@pytest.fixture
async def client(stack):
    async with stack.client() as c:
        yield c


class Workers:
    """Worker processes of one language, and the tickets they opened."""

    def __init__(self, stack: Pipeline, command: Command, folder: Path, token: str) -> None:
        self.stack = stack
        self.command = command
        self.folder = folder
        self.token = token  # a worker token of the tickets queue
        self.tracker = folder / "tickets.txt"
        self.started: list[ManagedProcess] = []

    def start(self, grace: float = 30) -> ManagedProcess:
        n = len(self.started)
        process = ManagedProcess(
            ProcessSpec(
                f"worker-{n}",
                self.command(self.tracker, grace, self.stack.executors[0].address),
                {"DISPO_TOKEN": self.token},
                None,
                self.folder / f"worker-{n}.log",
            )
        )
        process.spawn()
        self.started.append(process)
        return process

    def effects(self) -> list[tuple[str, int, int]]:
        """Each ticket opened: (idempotency key, attempt, pid)."""
        if not self.tracker.exists():
            return []
        lines = self.tracker.read_text().splitlines()
        effects = [line.split()[:3] for line in lines]  # the ticket's id is last
        return [(key, int(attempt), int(pid)) for key, attempt, pid in effects]

    def opened(self) -> list[tuple[str, int]]:
        """Each ticket opened: (idempotency key, pid)."""
        return [(key, pid) for key, _, pid in self.effects()]

    def kill_all(self) -> None:
        for process in self.started:
            process.kill()


@pytest.fixture
async def reconciler(stack, file_clock, tmp_path):
    """A reconciler process on the stack, asking its executor to probe worker nodes; its
    redrive backoff is 10 s of its clock."""
    config = tmp_path / "recovery.yaml"
    redrive = {"max_redrives": 3, "base_delay": 10, "max_delay": 10, "jitter": 0}
    config.write_text(yaml.safe_dump({"redrive": {"default": redrive}}))
    file_clock.set(datetime.now(UTC))
    process = await stack.start_service(
        "reconciler",
        {
            **file_clock.env,
            "DISPO_RECONCILER_CONFIG": str(config),
            "DISPO_CATALOGUE": str(stack.catalogue),
            "DISPO_RECONCILER_SWEEP_INTERVAL_SECONDS": "0.5",
            "DISPO_EGRESS_ALLOW": stack.egress_allow,
            "DISPO_RECONCILER_EXECUTOR_ADDRESS": stack.executors[0].address,
            # A probe no worker answers costs the settle sweep this long.
            "DISPO_RECONCILER_HTTP_TIMEOUT_SECONDS": "2",
        },
    )
    async with admin_channel(process.address) as channel:
        yield Reconciler(
            process, file_clock, channel, reconciler_pb2_grpc.ReconcilerServiceStub(channel)
        )
    process.kill()


@pytest.fixture
async def workers(stack, command, tmp_path):
    token = await worker_token(stack.gateway.address, "tickets")
    found = Workers(stack, command, tmp_path, token)
    yield found
    found.kill_all()


async def test_a_worker_output_is_recorded_and_flows_into_a_later_payload(
    client, workers, module_downstream
):
    worker = workers.start()
    task = await client.submit(
        "tests",
        [
            cell("w_ticket", ref="w", name="flow"),
            cell("tell", ref="n", name="owner", ticket="{nodes.w.open.output.ticket_id}").after(
                "w"
            ),
        ],
    )
    done = await client.wait(task.task_id, timeout=60)
    assert done.status == "SUCCEEDED", dump(done)
    key = f"{task.task_id}/w.open"
    # The worker's returned value is the node's output, handed the node's stable key.
    assert done.node("w.open").output == {"ticket_id": "T-flow", "key": key}
    state = await module_downstream.state()
    assert json.loads(state["bodies"][f"{task.task_id}/n.send"]) == {
        "name": "owner",
        "ticket": "T-flow",
    }
    assert workers.opened() == [(key, worker.pid)]


async def test_a_retryable_error_is_retried_and_any_other_fails_the_node(client, workers):
    worker = workers.start()
    busy = await client.submit("tests", [cell("w_ticket", name="busy", busy=1)])
    refused = await client.submit("tests", [cell("w_ticket", name="no", refuse="it is Sunday")])

    done = await client.wait(busy.task_id, timeout=60)
    assert done.status == "SUCCEEDED", dump(done)
    node = done.node("w_ticket.open")
    assert node.output["ticket_id"] == "T-busy"
    failed = await client.wait(refused.task_id, timeout=60)
    assert failed.status == "FAILED", dump(failed)
    assert failed.node("w_ticket.open").attempts == 1
    error = failed.node("w_ticket.open").last_error
    assert error.startswith("definite failure: worker: ") and error.endswith(
        "the tracker refused the ticket: it is Sunday"
    ), error
    # The busy run had no effect, the refused run none: one ticket, on the retry.
    [(key, attempt, pid)] = workers.effects()
    assert (key, pid) == (f"{busy.task_id}/w_ticket.open", worker.pid)
    assert attempt == node.attempts >= 2
    assert worker.log_tail(100).count(f"of task {busy.task_id}, attempt") == 2


async def test_sigterm_finishes_a_run_within_the_grace_and_hands_back_the_other(client, workers):
    """Two runs in flight at SIGTERM: the one that ends within the grace is completed by
    the stopping worker; the other is handed back, offered again at once and done by the
    next worker. One ticket each. Both are held past the run lease: by heartbeats."""
    quick = await client.submit("tests", [cell("w_ticket", name="quick", work_ms=2000)])
    slow = await client.submit("tests", [cell("w_ticket", name="slow", work_ms=5000)])
    first = workers.start(grace=4)
    await eventually(
        lambda: first.log_tail(100),
        lambda log: log.count("run started") >= 2,
        timeout=30,
        wanted="both runs taken",
    )
    assert workers.effects() == []

    assert await first.stop(timeout=30) == 0  # SIGTERM: it drains, then exits
    log = first.log_tail(100)
    assert "runs handed back: 1" in log, log
    assert "lease lost" not in log and "completion refused" not in log, log
    quick_key, slow_key = f"{quick.task_id}/w_ticket.open", f"{slow.task_id}/w_ticket.open"
    assert workers.opened() == [(quick_key, first.pid)]
    finished = await client.wait(quick.task_id, timeout=30)
    assert finished.status == "SUCCEEDED", dump(finished)

    second = workers.start()
    done = await client.wait(slow.task_id, timeout=60)
    assert done.status == "SUCCEEDED", dump(done)
    assert done.node("w_ticket.open").output == {"ticket_id": "T-slow", "key": slow_key}
    assert workers.opened() == [(quick_key, first.pid), (slow_key, second.pid)]
    # Handed back, not left to expire: offered again at the attempt the first worker had.
    [handed] = re.findall(rf"of task {slow.task_id}, attempt (\d+)", log)
    assert workers.effects()[1][1] == int(handed)


async def test_a_worker_killed_after_its_effect_is_settled_done_by_a_probe(
    client, workers, reconciler
):
    """A non-idempotent run whose worker is SIGKILLed after opening its ticket, before
    answering: its node is UNKNOWN, never re-sent; a second worker of the same language
    answers the reconciler's probe from the tracker: SUCCEEDED with the probe's output, one
    ticket."""
    first = workers.start()
    task = await client.submit("tests", [cell("w_ticket_once", name="once", answer_ms=60_000)])
    key = f"{task.task_id}/w_ticket_once.open"
    await eventually(
        lambda: workers.effects(), lambda effects: effects != [], timeout=30, wanted="the ticket"
    )
    assert workers.opened() == [(key, first.pid)]
    first.kill()  # SIGKILL: the ticket is opened, the answer lost
    await wait_until(
        client,
        task.task_id,
        lambda v: v.node("w_ticket_once.open").status == "UNKNOWN",
        timeout=60,
        wanted="the node UNKNOWN",
    )
    await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_AWAITING_SETTLEMENT, timeout=60)

    second = workers.start()  # answers the queue's probes
    for _ in range(20):  # sweep (past the redrive's backoff) until the task ended
        await reconciler.sweep(seconds=11)
        view = await client.get(task.task_id)
        if view.status in ("SUCCEEDED", "FAILED"):
            break
    assert view.status == "SUCCEEDED", dump(view)
    # The probe's output, recorded with the node: the ticket the first worker opened.
    assert view.node("w_ticket_once.open").output == {
        "ticket_id": "T-once",
        "key": key,
        "found_by": second.pid,
    }
    assert workers.opened() == [(key, first.pid)]  # one ticket, never re-sent
    assert "probe: node w_ticket_once.open" in second.log_tail(100)
    detail = await reconciler.stub.GetRecoveryTask(pb.GetRecoveryTaskRequest(task_id=task.task_id))
    assert [(s.node_id, s.method, s.outcome) for s in detail.settlements] == [
        ("w_ticket_once.open", pb.SETTLEMENT_METHOD_PROBE, common_pb2.NODE_STATUS_SUCCEEDED)
    ]


async def test_the_sdk_lists_the_queues_a_worker_of_another_language_serves(client, workers, stack):
    """AsyncClient.list_queues and Client.list_queues (the executor's ListQueues): the queue
    the worker polls is live with its worker; a declared queue no worker serves is listed
    with its limit, not live."""
    worker = workers.start()
    executor = stack.executors[0].address

    async def live() -> dict[str, WorkerQueue]:
        return {q.name: q for q in await client.list_queues(executor)}

    found = await eventually(
        live, lambda q: "tickets" in q and q["tickets"].live, timeout=30, wanted="tickets live"
    )
    assert found["tickets"].live_workers >= 1 and found["tickets"].last_seen is not None
    assert found["reports"] == WorkerQueue("reports", 0, False, None, 0, 0, 2)

    def blocking() -> list[WorkerQueue]:
        with Client(stack.gateway.address, token=stack.token) as dispo:
            return dispo.list_queues(executor)

    listed = {q.name: q for q in await asyncio.to_thread(blocking)}
    assert listed["tickets"].live and listed["reports"].max_concurrency == 2
    assert worker.running()


async def test_runs_ending_together_are_completed_together_by_completeruns(client, workers, stack):
    """Four runs taken by one poll and ending together: the worker sends their completions
    in CompleteRuns calls (the first at once, those ending while it is on its way in the
    next: how many go together depends on how close their ends fall on this machine), never
    a CompleteRun each; every one is recorded."""
    executor = stack.executors[0]
    since = executor.log_path.stat().st_size
    tasks = [
        await client.submit("tests", [cell("w_ticket", name=f"t{i}", work_ms=1000)])
        for i in range(4)
    ]

    async def tickets() -> WorkerQueue | None:
        return next(
            (q for q in await client.list_queues(executor.address) if q.name == "tickets"), None
        )

    await eventually(  # all four offered, so that the worker's first poll takes them all
        tickets, lambda q: q is not None and q.offered == 4, timeout=30, wanted="four runs offered"
    )
    worker = workers.start()  # concurrency 4
    for i, task in enumerate(tasks):
        done = await client.wait(task.task_id, timeout=60)
        assert done.status == "SUCCEEDED", dump(done)
        assert done.node("w_ticket.open").output["ticket_id"] == f"T-t{i}"
    assert sorted(pid for _, pid in workers.opened()) == [worker.pid] * 4
    calls = await eventually(
        lambda: completion_calls(executor, since),
        lambda c: c.total() >= 1,
        timeout=10,
        wanted="the completions' calls logged",
    )
    assert calls["CompleteRun"] == 0 and 1 <= calls["CompleteRuns"] <= 4, calls
    assert "completion refused" not in worker.log_tail(100)


async def test_a_paused_worker_has_its_late_completion_refused_in_completeruns(
    client, workers, stack
):
    """A non-idempotent run whose worker is SIGSTOPped after opening its ticket, past its
    lease: its node is UNKNOWN. SIGCONT: the handler answers before the heartbeat learns the
    run is gone, so the worker sends the completion in a CompleteRuns, which refuses that
    item (recorded false): the worker logs it as the lease lost; nothing is recorded, the
    node stays UNKNOWN, one ticket."""
    executor = stack.executors[0]
    since = executor.log_path.stat().st_size
    paused = workers.start()
    task = await client.submit("tests", [cell("w_ticket_once", name="late", answer_ms=1500)])
    await eventually(
        lambda: workers.effects(), lambda effects: effects != [], timeout=30, wanted="the ticket"
    )
    os.kill(paused.pid, signal.SIGSTOP)
    view = await wait_until(
        client,
        task.task_id,
        lambda v: v.node("w_ticket_once.open").status == "UNKNOWN",
        timeout=60,
        wanted="the node UNKNOWN",
    )
    os.kill(paused.pid, signal.SIGCONT)
    # Its handler's answer and its heartbeat are both due at SIGCONT: the answer is sent
    # first (as nearly always) and refused, or the heartbeat learns of the loss first and
    # the handler is cancelled, nothing sent. Either way nothing is recorded.
    refused = "completion refused"
    log = await eventually(
        lambda: paused.log_tail(100),
        lambda log: refused in log or "run lease lost; its handler is cancelled" in log,
        timeout=30,
        wanted="the late completion refused, or the run let go",
    )
    calls = completion_calls(executor, since)
    assert calls["CompleteRun"] == 0, calls
    if refused in log:
        assert (
            f"{refused}: the run's lease was lost: node w_ticket_once.open of task {task.task_id}: "
            in log
        ), log
        assert calls["CompleteRuns"] >= 1, calls
    after = await client.get(task.task_id)
    assert after.node("w_ticket_once.open").status == "UNKNOWN", dump(after)
    assert after.node("w_ticket_once.open").last_error == view.node("w_ticket_once.open").last_error
    assert after.node("w_ticket_once.open").output is None
    assert len(workers.effects()) == 1
