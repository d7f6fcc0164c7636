"""Worker actions (ADR-0099) through real processes: gateway, executor, the demo downstream,
the Python SDK's worker run by ``dispo worker run`` (tests/executor/worker_app.py), which
appends a line per effect to a file and deduplicates nothing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections import Counter
from pathlib import Path

import grpc
import pytest
from dispo.executor.worker_runs import parse_token, run_token
from dispo.libs.api.auth.v1 import auth_pb2, auth_pb2_grpc
from dispo.libs.api.executor.v1 import worker_pb2, worker_pb2_grpc
from dispo.libs.auth import open_channel
from dispo.libs.payload import canonical_json, json_payload, payload_data
from dispo.libs.process import ManagedProcess, ProcessSpec
from dispo.sdk import AsyncClient, DispoError, RunContext, Worker, cell
from pipeline_fixtures import TEST_CATALOGUE, Downstream, dump, wait_until
from support import eventually
from support.auth import admin_channel, worker_token

from .test_outputs import as_json, outputs_of

pytestmark = pytest.mark.long_file

WORKER_CELLS = """
  w_ticket:
    description: Open a ticket through a worker.
    fields:
      name: {{type: string, required: true}}
    actions:
      open:
        kind: worker
        queue: tickets
        idempotent: true
        output: {{ticket_id: {{type: string, required: true}}}}
  w_echo:
    description: A worker answers its payload.
    fields:
      name: {{type: string, required: true}}
      ticket: {{type: string}}
    actions:
      echo: {{kind: worker, queue: echo, idempotent: true}}
  w_sized:
    description: A worker answers its payload, at most 60 bytes of it.
    fields:
      name: {{type: string, required: true}}
      ticket: {{type: string}}
    actions:
      echo: {{kind: worker, queue: echo, idempotent: true, max_output_bytes: 60}}
  w_open_close:
    description: A worker opens a ticket, an http call closes it by its number.
    fields:
      name: {{type: string, required: true}}
    actions:
      open:
        kind: worker
        queue: tickets
        idempotent: true
        output: {{ticket_id: string}}
      close:
        kind: http
        downstream: demo
        path: /closed/{{nodes.open.output.ticket_id}}
        idempotent: true
        depends_on: [open]
  w_slow:
    description: A worker run that takes its time (idempotent).
    fields:
      name: {{type: string, required: true}}
    actions:
      run: {{kind: worker, queue: slow, idempotent: true}}
  w_slow_once:
    description: A worker run that takes its time, not to be repeated blindly.
    fields:
      name: {{type: string, required: true}}
    actions:
      run: {{kind: worker, queue: slow_once, idempotent: false}}
  w_limited:
    description: A worker run on a queue with a limit.
    fields:
      name: {{type: string, required: true}}
    actions:
      run: {{kind: worker, queue: limited, idempotent: true}}
queues:
  limited:
    max_concurrency: 2
"""

# The queues tests/executor/worker_app.py serves (its worker token's).
QUEUES = ("tickets", "echo", "slow", "slow_once", "limited")
# A worker silent for this long has lost its run (heartbeats every third of it).
RUN_LEASE = "3"


@pytest.fixture
def catalogue_file(tmp_path: Path, downstream: Downstream) -> Path:
    path = tmp_path / "catalogue.yaml"
    path.write_text((TEST_CATALOGUE + WORKER_CELLS).format(url=downstream.url))
    return path


@pytest.fixture
async def pipeline(start_service, catalogue_file, egress_allow):
    from pipeline_fixtures import Pipeline

    p = Pipeline(start_service, catalogue_file, egress_allow)
    await p.start_gateway()
    await p.start_executor(DISPO_EXECUTOR_RUN_LEASE_SECONDS=RUN_LEASE)
    yield p


class Workers:
    """Worker processes of tests/executor/worker_app.py, and the effects they recorded."""

    def __init__(self, pipeline, folder: Path, token: str) -> None:
        self.pipeline = pipeline
        self.folder = folder
        self.token = token  # a worker token of the app's queues
        self.effects_file = folder / "effects.txt"
        self.started: list[ManagedProcess] = []

    def start(self, executor: int = 0, **env: str) -> ManagedProcess:
        n = len(self.started)
        process = ManagedProcess(
            ProcessSpec(
                f"worker-{n}",
                [
                    sys.executable,
                    "-m",
                    "dispo.tools.cli",
                    "--token",
                    self.token,
                    "worker",
                    "run",
                    "worker_app:worker",
                    "--executor",
                    self.pipeline.executors[executor].address,
                ],
                {
                    "PYTHONPATH": str(Path(__file__).parent),
                    "WORKER_EFFECTS": str(self.effects_file),
                    "WORKER_RUNNING": str(self.folder / "running.txt"),
                    **env,
                },
                None,
                self.folder / f"worker-{n}.log",
            )
        )
        process.spawn()
        self.started.append(process)
        return process

    def effects(self) -> list[tuple[str, str, int, int]]:
        if not self.effects_file.exists():
            return []
        lines = self.effects_file.read_text().splitlines()
        return [(q, key, int(attempt), int(pid)) for q, key, attempt, pid in map(str.split, lines)]

    async def wait_effects(self, count: int, timeout: float = 30.0) -> list[tuple]:
        return await eventually(
            self.effects,
            lambda found: len(found) >= count,
            timeout=timeout,
            wanted=f"{count} effect(s)",
        )

    def kill_all(self) -> None:
        for process in self.started:
            if process.running():
                os.kill(process.pid, signal.SIGCONT)
                process.kill()


@pytest.fixture
async def workers(pipeline, tmp_path):
    found = Workers(pipeline, tmp_path, await worker_token(pipeline.gateway.address, *QUEUES))
    yield found
    found.kill_all()


async def test_outputs_flow_between_http_and_worker_nodes(pipeline, client, downstream, workers):
    """An http node's output reaches a worker's payload, a worker's output reaches an http
    node's payload and an http path; each worker run is done once."""
    workers.start()
    task = await client.submit(
        "tests",
        [
            cell("ticket", ref="t", name="h1"),
            cell("w_echo", ref="e", name="e1", ticket="{nodes.t.open.output.ticket_id}").after("t"),
            cell("w_ticket", ref="w", name="w1"),
            cell("tell", ref="n", name="owner", ticket="{nodes.w.open.output.ticket_id}").after(
                "w"
            ),
            cell("w_open_close", ref="c", name="w2"),
        ],
    )
    done = await client.wait(task.task_id, timeout=60)
    assert done.status == "SUCCEEDED", dump(done)

    recorded = {
        o.node_id: as_json(o.output) for o in (await outputs_of(pipeline, task.task_id)).outputs
    }
    http_ticket = recorded["t.open"]["ticket_id"]
    assert recorded["e.echo"] == {"name": "e1", "ticket": http_ticket}
    assert recorded["w.open"] == {"ticket_id": "W-w1", "key": f"{task.task_id}/w.open"}
    state = await downstream.state()
    assert json.loads(state["bodies"][f"{task.task_id}/n.send"]) == {
        "name": "owner",
        "ticket": "W-w1",
    }
    assert state["paths"][f"{task.task_id}/c.close"] == "/closed/W-w2"
    # One effect per worker node, under the node's stable key.
    assert Counter(key for _, key, _, _ in workers.effects()) == {
        f"{task.task_id}/e.echo": 1,
        f"{task.task_id}/w.open": 1,
        f"{task.task_id}/c.open": 1,
    }


async def test_a_worker_failure_retryable_or_not_and_an_oversized_output(client, workers):
    workers.start()
    retry = await client.submit("tests", [cell("w_echo", name="retry")])
    boom = await client.submit("tests", [cell("w_echo", name="boom")])
    big = await client.submit("tests", [cell("w_sized", name="big", ticket="x" * 80)])

    retried = await client.wait(retry.task_id, timeout=60)
    assert retried.status == "SUCCEEDED", dump(retried)
    assert retried.node("w_echo.echo").attempts == 2
    failed = await client.wait(boom.task_id, timeout=60)
    assert failed.status == "FAILED", dump(failed)
    error = failed.node("w_echo.echo").last_error
    assert error.startswith("definite failure: worker: ValueError: boom"), error
    oversized = await client.wait(big.task_id, timeout=60)
    assert oversized.status == "FAILED", dump(oversized)
    error = oversized.node("w_sized.echo").last_error
    assert "is over the limit of 60 bytes" in error, error


async def test_two_workers_on_one_queue_take_each_run_once(client, workers):
    workers.start()
    workers.start()
    tasks = [await client.submit("tests", [cell("w_ticket", name=f"n{i}")]) for i in range(30)]
    for t in tasks:
        done = await client.wait(t.task_id, timeout=60)
        assert done.status == "SUCCEEDED", dump(done)
    counted = Counter(key for _, key, _, _ in workers.effects())
    assert counted == {f"{t.task_id}/w_ticket.open": 1 for t in tasks}


async def test_a_queues_max_concurrency_holds_across_three_racing_workers(client, workers):
    """Three workers with free credit for ten runs each race for the runs of a queue whose
    catalogue limit is two: at no moment do more than two run, across the three."""
    for _ in range(3):
        workers.start()
    tasks = [await client.submit("tests", [cell("w_limited", name=f"l{i}")]) for i in range(12)]
    for t in tasks:
        done = await client.wait(t.task_id, timeout=60)
        assert done.status == "SUCCEEDED", dump(done)
    effects = workers.effects()
    assert sorted(key for _, key, _, _ in effects) == sorted(
        f"{t.task_id}/w_limited.run" for t in tasks
    )
    high_water = max(seen for _, _, seen, _ in effects)
    assert high_water <= 2, effects


async def test_with_no_worker_the_node_waits_offered_and_runs_once_one_connects(
    pipeline, client, workers
):
    task = await client.submit("tests", [cell("w_ticket", name="later")])
    await wait_until(
        client,
        task.task_id,
        lambda v: v.node("w_ticket.open").status == "RUNNING",
        wanted="the worker node RUNNING",
    )
    # Offered, and still offered after several pass leases and heartbeats: nothing failed.
    async with admin_channel(pipeline.executors[0].address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        empty = await stub.PollRuns(
            worker_pb2.PollRunsRequest(queues=["other"], worker_id="t", max_runs=1, wait_ms=3000)
        )
    assert list(empty.runs) == []
    view = await client.get(task.task_id)
    assert view.status == "RUNNING" and view.node("w_ticket.open").attempts == 1, dump(view)
    assert workers.effects() == []

    workers.start()
    done = await client.wait(task.task_id, timeout=60)
    assert done.status == "SUCCEEDED", dump(done)
    assert done.node("w_ticket.open").attempts == 1
    assert [key for _, key, _, _ in workers.effects()] == [f"{task.task_id}/w_ticket.open"]


async def test_complete_run_refuses_a_malformed_or_foreign_token_and_records_nothing(
    pipeline, client
):
    """The test is the worker here, on the protocol itself."""
    task = await client.submit("tests", [cell("w_ticket", name="raw")])
    async with admin_channel(pipeline.executors[0].address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        taken = await stub.PollRuns(
            worker_pb2.PollRunsRequest(
                queues=["tickets"], worker_id="raw-worker", max_runs=5, wait_ms=20000
            )
        )
        [run] = taken.runs
        forged = run.run_token
        beat = worker_pb2.HeartbeatRunsRequest(worker_id="raw-worker", run_tokens=[forged])
        assert [lease.held for lease in (await stub.HeartbeatRuns(beat)).leases] == [True]
        assert (run.task_id, run.node_id, run.attempt) == (task.task_id, "w_ticket.open", 1)
        assert run.idempotency_key == f"{task.task_id}/w_ticket.open"
        assert json.loads(payload_data(run.payload)) == {"name": "raw"}
        assert taken.lease_ms == 3000

        answer = json_payload(canonical_json({"ticket_id": "forged"}))
        with pytest.raises(grpc.aio.AioRpcError) as malformed:
            await stub.CompleteRun(worker_pb2.CompleteRunRequest(run_token="x!", output=answer))
        assert malformed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "run_token" in malformed.value.details()
        # The same run, as another worker would name it.
        key, _ = parse_token(forged)
        with pytest.raises(grpc.aio.AioRpcError) as foreign:
            await stub.CompleteRun(
                worker_pb2.CompleteRunRequest(
                    run_token=run_token(key, "someone-else"), output=answer
                )
            )
        assert foreign.value.code() == grpc.StatusCode.ABORTED
        assert "lease was lost" in foreign.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as not_json:
            await stub.CompleteRun(
                worker_pb2.CompleteRunRequest(run_token=forged, output=json_payload(b"{not json"))
            )
        assert not_json.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "output" in not_json.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as as_probe:  # a call's run, not a probe's
            await stub.CompleteRun(
                worker_pb2.CompleteRunRequest(
                    run_token=forged, probe=worker_pb2.ProbeResult(done=True)
                )
            )
        assert as_probe.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert as_probe.value.details().startswith("probe: "), as_probe.value.details()
        await wait_until(
            client,
            task.task_id,
            lambda v: v.node("w_ticket.open").status == "RUNNING",
            wanted="the worker node RUNNING, nothing recorded",
        )
        assert [lease.held for lease in (await stub.HeartbeatRuns(beat)).leases] == [True]
        await stub.CompleteRun(
            worker_pb2.CompleteRunRequest(
                run_token=forged, output=json_payload(canonical_json({"ticket_id": "T-raw"}))
            )
        )
        done = await client.wait(task.task_id, timeout=30)
        assert done.status == "SUCCEEDED", dump(done)
        recorded = (await outputs_of(pipeline, task.task_id)).outputs
        assert [as_json(o.output) for o in recorded] == [{"ticket_id": "T-raw"}]
        # Once recorded, the run is gone: a second completion is refused.
        with pytest.raises(grpc.aio.AioRpcError) as again:
            await stub.CompleteRun(worker_pb2.CompleteRunRequest(run_token=forged, output=answer))
        assert again.value.code() == grpc.StatusCode.ABORTED


async def test_complete_runs_records_each_held_run_and_refuses_the_one_whose_lease_was_lost(
    pipeline, client
):
    """Several completions in one CompleteRuns call, on the protocol itself: a malformed one
    refuses the whole call (INVALID_ARGUMENT naming it) and records nothing; then the run
    whose lease ran out is refused on its own (nothing recorded, its node stays UNKNOWN)
    while the two runs still held are recorded."""
    lost = await client.submit("tests", [cell("w_slow_once", name="late")])
    async with admin_channel(pipeline.executors[0].address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)

        async def take(queue: str, count: int) -> list[worker_pb2.Run]:
            taken: list[worker_pb2.Run] = []
            while len(taken) < count:
                reply = await stub.PollRuns(
                    worker_pb2.PollRunsRequest(
                        queues=[queue], worker_id="raw-worker", max_runs=5, wait_ms=20000
                    )
                )
                taken.extend(reply.runs)
            return taken

        [late] = await take("slow_once", 1)
        # No heartbeat: its lease runs out, its node (not idempotent) becomes UNKNOWN.
        await wait_until(
            client,
            lost.task_id,
            lambda v: v.node("w_slow_once.run").status == "UNKNOWN",
            timeout=30,
            wanted="the silent run's node UNKNOWN",
        )
        held = [await client.submit("tests", [cell("w_ticket", name=f"b{i}")]) for i in range(2)]
        runs = {run.task_id: run for run in await take("tickets", 2)}
        first, second = (runs[task.task_id] for task in held)

        def done(run: worker_pb2.Run, ticket: str) -> worker_pb2.CompleteRunRequest:
            answer = json_payload(canonical_json({"ticket_id": ticket}))
            return worker_pb2.CompleteRunRequest(run_token=run.run_token, output=answer)

        with pytest.raises(grpc.aio.AioRpcError) as malformed:
            await stub.CompleteRuns(
                worker_pb2.CompleteRunsRequest(
                    completions=[
                        done(first, "T-1"),
                        worker_pb2.CompleteRunRequest(run_token="x!", not_sent="no"),
                    ]
                )
            )
        assert malformed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "completions[1].run_token" in malformed.value.details()
        beat = worker_pb2.HeartbeatRunsRequest(
            worker_id="raw-worker", run_tokens=[first.run_token, second.run_token]
        )
        assert [lease.held for lease in (await stub.HeartbeatRuns(beat)).leases] == [True, True]

        reply = await stub.CompleteRuns(
            worker_pb2.CompleteRunsRequest(
                completions=[done(first, "T-1"), done(late, "T-late"), done(second, "T-2")]
            )
        )
        assert [(r.run_token, r.recorded) for r in reply.results] == [
            (first.run_token, True),
            (late.run_token, False),
            (second.run_token, True),
        ]
        assert "lease was lost" in reply.results[1].detail
        assert not reply.results[0].detail and not reply.results[2].detail
    for task, ticket in zip(held, ["T-1", "T-2"], strict=True):
        finished = await client.wait(task.task_id, timeout=30)
        assert finished.status == "SUCCEEDED", dump(finished)
        recorded = (await outputs_of(pipeline, task.task_id)).outputs
        assert [as_json(o.output) for o in recorded] == [{"ticket_id": ticket}]
    after = await client.get(lost.task_id)
    assert after.node("w_slow_once.run").status == "UNKNOWN", dump(after)
    assert not (await outputs_of(pipeline, lost.task_id)).outputs


async def test_the_sdk_worker_sends_the_completions_of_runs_ending_together_in_one_call(
    pipeline, client
):
    """Five runs whose handlers end at the same moment: their completions reach the executor
    in one CompleteRuns call (at most two), each recorded."""
    calls: list[int] = []

    class Counted(Worker):
        async def _send_call(self, requests):
            calls.append(len(requests))
            return await super()._send_call(requests)

    worker = Counted(pipeline.executors[0].address, pipeline.token, concurrency=10)
    started: list[str] = []
    all_in = asyncio.Event()

    @worker.action("echo")
    async def echo(ctx: RunContext, payload: dict) -> dict:
        started.append(ctx.task_id)
        if len(started) == 5:
            all_in.set()
        await all_in.wait()
        return payload

    tasks = [await client.submit("tests", [cell("w_echo", name=f"n{i}")]) for i in range(5)]
    running = asyncio.create_task(worker.run(handle_signals=False))
    try:
        for task in tasks:
            done = await client.wait(task.task_id, timeout=30)
            assert done.status == "SUCCEEDED", dump(done)
    finally:
        worker.stop(grace=1)
        await running
    assert sum(calls) == 5 and len(calls) <= 2, calls


async def test_a_worker_killed_mid_run_idempotent_runs_again_elsewhere_once(client, workers):
    first = workers.start(WORKER_HOLD="60")
    task = await client.submit("tests", [cell("w_slow", name="k")])
    [(_, key, attempt, pid)] = await workers.wait_effects(1)
    assert (key, attempt, pid) == (f"{task.task_id}/w_slow.run", 1, first.pid)
    first.kill()  # SIGKILL, mid-run: its lease runs out
    second = workers.start()
    done = await client.wait(task.task_id, timeout=60)
    assert done.status == "SUCCEEDED", dump(done)
    assert workers.effects() == [
        ("slow", key, 1, first.pid),
        ("slow", key, 2, second.pid),
    ]


async def test_a_worker_killed_mid_run_not_idempotent_leaves_the_node_unknown(
    pipeline, client, workers
):
    first = workers.start(WORKER_HOLD="60")
    task = await client.submit("tests", [cell("w_slow_once", name="k1")])
    await workers.wait_effects(1)
    first.kill()
    workers.start()
    view = await wait_until(
        client,
        task.task_id,
        lambda v: v.node("w_slow_once.run").status == "UNKNOWN",
        timeout=60,
        wanted="the node UNKNOWN",
    )
    assert "worker's lease on the run expired" in view.node("w_slow_once.run").last_error
    # Not re-sent: another worker polls the queue, and nothing is offered to it.
    async with admin_channel(pipeline.executors[0].address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        empty = await stub.PollRuns(
            worker_pb2.PollRunsRequest(
                queues=["slow_once"], worker_id="t", max_runs=5, wait_ms=2000
            )
        )
    assert list(empty.runs) == []
    assert len(workers.effects()) == 1


async def test_a_paused_worker_past_its_lease_has_its_late_completion_refused(client, workers):
    paused = workers.start(WORKER_HOLD="3")
    task = await client.submit("tests", [cell("w_slow_once", name="p")])
    await workers.wait_effects(1)
    os.kill(paused.pid, signal.SIGSTOP)
    view = await wait_until(
        client,
        task.task_id,
        lambda v: v.node("w_slow_once.run").status == "UNKNOWN",
        timeout=60,
        wanted="the node UNKNOWN",
    )
    os.kill(paused.pid, signal.SIGCONT)
    # Its handler ends (or its heartbeat learns first that the run is gone): either way
    # nothing is recorded, and no second effect.
    await eventually(
        lambda: paused.log_tail(200),
        lambda log: (
            "completion refused: the run's lease was lost" in log
            or "run lease lost; its handler is cancelled" in log
        ),
        timeout=30,
        wanted="the worker told its run was lost",
    )
    after = await client.get(task.task_id)
    assert after.node("w_slow_once.run").status == "UNKNOWN", dump(after)
    assert after.node("w_slow_once.run").last_error == view.node("w_slow_once.run").last_error
    assert len(workers.effects()) == 1


async def test_a_worker_token_serves_its_queues_only_and_nothing_else(pipeline, client):
    token = await worker_token(pipeline.gateway.address, "echo")
    task = await client.submit("tests", [cell("w_echo", name="scoped")])
    async with open_channel(pipeline.executors[0].address, token) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as other:
            await stub.PollRuns(
                worker_pb2.PollRunsRequest(
                    queues=["echo", "tickets"], worker_id="scoped", max_runs=1, wait_ms=0
                )
            )
        assert other.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert other.value.details().startswith("queues: "), other.value.details()
        assert "tickets" in other.value.details()
        taken = await stub.PollRuns(
            worker_pb2.PollRunsRequest(
                queues=["echo"], worker_id="scoped", max_runs=1, wait_ms=20000
            )
        )
        [run] = taken.runs
        assert (run.task_id, run.queue) == (task.task_id, "echo")
        # A run token naming another queue is refused before anything is read or written.
        foreign = run_token((run.task_id, run.node_id, run.attempt), "scoped", "tickets")
        answer = json_payload(canonical_json({"from": "scoped"}))
        with pytest.raises(grpc.aio.AioRpcError) as forged:
            await stub.CompleteRun(worker_pb2.CompleteRunRequest(run_token=foreign, output=answer))
        assert forged.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert forged.value.details().startswith("run_token: "), forged.value.details()
        beat = await stub.HeartbeatRuns(
            worker_pb2.HeartbeatRunsRequest(worker_id="scoped", run_tokens=[run.run_token])
        )
        assert [lease.held for lease in beat.leases] == [True]
        await stub.CompleteRun(
            worker_pb2.CompleteRunRequest(run_token=run.run_token, output=answer)
        )
    done = await client.wait(task.task_id, timeout=60)
    assert done.status == "SUCCEEDED", dump(done)
    assert done.node("w_echo.echo").output == {"from": "scoped"}

    # Refused everywhere else: it can neither submit nor read tasks.
    async with AsyncClient(pipeline.gateway.address, token=token) as as_worker:
        with pytest.raises(DispoError) as submit:
            await as_worker.submit("tests", [cell("w_echo", name="no")])
        assert submit.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert "a worker token of queues echo" in submit.value.message
        with pytest.raises(DispoError) as read:
            await as_worker.get(task.task_id)
        assert read.value.code == grpc.StatusCode.PERMISSION_DENIED

    # A business token cannot serve a queue.
    async with admin_channel(pipeline.gateway.address) as channel:
        made = await auth_pb2_grpc.TokenServiceStub(channel).CreateToken(
            auth_pb2.CreateTokenRequest(kind=auth_pb2.TOKEN_KIND_BUSINESS, business="tests")
        )
    async with open_channel(pipeline.executors[0].address, made.secret) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as business:
            await worker_pb2_grpc.WorkerServiceStub(channel).PollRuns(
                worker_pb2.PollRunsRequest(queues=["echo"], worker_id="b", max_runs=1)
            )
    assert business.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_a_queues_runs_reach_a_worker_in_the_fair_order_across_businesses(
    start_service, catalogue_file, egress_allow
):
    """ADR-0109 through the executor: business A's twelve runs are offered before B's
    three; a worker polling two at a time gets one of A's and one of B's per poll, B's
    within its first three polls rather than after A's twelve."""
    from pipeline_fixtures import Pipeline

    pipeline = Pipeline(start_service, catalogue_file, egress_allow)
    await pipeline.start_gateway()
    # No worker polls while the runs are offered: none is withdrawn meanwhile.
    await pipeline.start_executor(DISPO_EXECUTOR_QUEUE_IDLE_SECONDS="600")
    executor = pipeline.executors[0].address
    async with pipeline.client() as client:

        async def offered(count: int) -> None:
            async def echo() -> int:
                queues = await client.list_queues(executor)
                return next((q.offered for q in queues if q.name == "echo"), 0)

            await eventually(echo, lambda n: n == count, timeout=60, wanted=f"{count} runs offered")

        flood = {
            (await client.submit("bulk", [cell("w_echo", name=f"a{i}")])).task_id for i in range(12)
        }
        await offered(12)
        trickle = {
            (await client.submit("takedown", [cell("w_echo", name=f"b{i}")])).task_id
            for i in range(3)
        }
        await offered(15)
    polls: list[Counter[str]] = []
    async with admin_channel(executor) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        for _ in range(3):
            reply = await stub.PollRuns(
                worker_pb2.PollRunsRequest(
                    queues=["echo"], worker_id="fair-worker", max_runs=2, wait_ms=5000
                )
            )
            assert {r.task_id for r in reply.runs} <= flood | trickle
            polls.append(Counter("A" if r.task_id in flood else "B" for r in reply.runs))
    assert polls == [Counter(A=1, B=1)] * 3, polls
