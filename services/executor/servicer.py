"""ExecutorService: the downstream registry and breaker states and the worker queues
(operational views), and the
outputs a task's nodes recorded (ADR-0093). WorkerService: worker runs taken, heartbeated,
completed and handed back (ADR-0099)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from dispo.executor.envelope import task_result
from dispo.executor.runner import Executor
from dispo.executor.states import TaskState
from dispo.executor.store import node_runs, task_runs, worker_runs
from dispo.executor.store.worker_runs import Outcome, RunKey
from dispo.executor.worker_runs import MAX_WAIT_MS, BadToken, WorkerRuns, parse_token
from dispo.libs.api.executor.v1 import executor_pb2, executor_pb2_grpc, worker_pb2, worker_pb2_grpc
from dispo.libs.error_text import truncate_error
from dispo.libs.errors import Aborted, InvalidArgument, NotFound
from dispo.libs.payload import PayloadError, json_payload, parse_json_value, payload_problem
from dispo.libs.proto_enums import from_short_name
from dispo.libs.timestamps import to_timestamp


class ExecutorServicer(executor_pb2_grpc.ExecutorServiceServicer):
    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    async def ListDownstreams(
        self, request: executor_pb2.ListDownstreamsRequest, context: grpc.aio.ServicerContext
    ) -> executor_pb2.ListDownstreamsResponse:
        now = self.executor.clock.now()
        out = executor_pb2.ListDownstreamsResponse()
        for name, d in sorted(self.executor.registry.items()):
            breaker = self.executor.breakers[name]
            item = out.downstreams.add(
                name=name,
                base_url=d.base_url,
                timeout_ms=d.timeout_ms,
                max_concurrency=d.max_concurrency,
                health_url=d.health_url,
                breaker_state=from_short_name(executor_pb2.BreakerState, breaker.state.name),
                recent_failures=breaker.recent_failures(now),
            )
            if breaker.open_until is not None:
                item.open_until.CopyFrom(to_timestamp(breaker.open_until))
        return out

    async def ListQueues(
        self, request: executor_pb2.ListQueuesRequest, context: grpc.aio.ServicerContext
    ) -> executor_pb2.ListQueuesResponse:
        out = executor_pb2.ListQueuesResponse()
        for q in await self.executor.worker_runs.queues():
            item = out.queues.add(
                name=q.queue,
                live_workers=q.live_workers,
                live=q.live,
                offered=q.offered,
                taken=q.taken,
                max_concurrency=q.max_concurrency,
            )
            if q.last_seen is not None:
                item.last_seen.CopyFrom(to_timestamp(q.last_seen))
        return out

    async def GetOutputs(
        self, request: executor_pb2.GetOutputsRequest, context: grpc.aio.ServicerContext
    ) -> executor_pb2.GetOutputsResponse:
        task_id = request.task_id
        if not task_id:
            raise InvalidArgument("task_id", "required")
        if len(task_id) > 64:
            raise InvalidArgument("task_id", "longer than 64 characters")
        async with self.executor.db.connection() as conn:
            rows, _ = await task_runs.tasks_lock_many(conn, [task_id], lock=False, envelopes=True)
            row = rows.get(task_id)
            if row is None or row.envelope is None:
                raise NotFound(f"task {task_id} is not recorded by the executor")
            outputs = (await node_runs.node_outputs_many(conn, [(task_id, None)]))[task_id]
        out = executor_pb2.GetOutputsResponse()
        for node in row.envelope.nodes:  # in topological order
            if node.node_id in outputs:
                out.outputs.add(node_id=node.node_id, output=json_payload(outputs[node.node_id]))
        if row.status is TaskState.SUCCEEDED:
            out.result.CopyFrom(json_payload(task_result(row.envelope, outputs)))
        return out


# A PollRuns takes at most this many runs.
MAX_RUNS = 100


def _token(token: str, field: str = "run_token") -> tuple[RunKey, str]:
    try:
        return parse_token(token)
    except BadToken as bad:
        raise InvalidArgument(field, str(bad)) from None


def _worker_id(worker_id: str) -> str:
    if not worker_id:
        raise InvalidArgument("worker_id", "required")
    if len(worker_id) > 200:
        raise InvalidArgument("worker_id", "longer than 200 characters")
    return worker_id


def _held_by(tokens: Sequence[str], worker_id: str) -> list[RunKey]:
    """The runs the tokens name, each taken by ``worker_id`` (INVALID_ARGUMENT naming the
    token otherwise)."""
    keys = []
    for i, token in enumerate(tokens):
        key, holder = _token(token, f"run_tokens[{i}]")
        if holder != worker_id:
            raise InvalidArgument(f"run_tokens[{i}]", f"names a run taken by {holder!r}")
        keys.append(key)
    return keys


def _outcome(request: worker_pb2.CompleteRunRequest, field: str = "") -> Outcome:
    """A CompleteRun's outcome (INVALID_ARGUMENT naming the field, after ``field``, when
    malformed)."""
    which = request.WhichOneof("result")
    if which == "output":
        problem = payload_problem(request.output)
        if problem is not None:
            raise InvalidArgument(f"{field}output", problem)
        data = request.output.data
        if not data:
            return Outcome(worker_runs.OUTPUT)
        try:
            parse_json_value(data)
        except PayloadError as error:
            raise InvalidArgument(f"{field}output", f"not JSON Dispo records: {error}") from None
        return Outcome(worker_runs.OUTPUT, data)
    if which == "error":
        if not request.error.message:
            raise InvalidArgument(f"{field}error.message", "required")
        return Outcome(
            worker_runs.ERROR, None, truncate_error(request.error.message), request.error.retryable
        )
    if which == "not_sent":
        return Outcome(worker_runs.NOT_SENT, None, truncate_error(request.not_sent))
    raise InvalidArgument(f"{field}result", "one of output, error or not_sent is required")


def _lost(key: RunKey, worker_id: str) -> str:
    """Why a completion was refused."""
    task_id, node_id, attempt = key
    return (
        f"the run's lease was lost: node {node_id} of task {task_id} (attempt"
        f" {attempt}) is no longer held by worker {worker_id!r}; nothing recorded"
    )


class WorkerServicer(worker_pb2_grpc.WorkerServiceServicer):
    """WorkerService (ADR-0099): thin, over :class:`WorkerRuns`."""

    def __init__(self, runs: WorkerRuns) -> None:
        self.runs = runs

    async def PollRuns(
        self, request: worker_pb2.PollRunsRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.PollRunsResponse:
        if not request.queues:
            raise InvalidArgument("queues", "at least one queue is required")
        for i, queue in enumerate(request.queues):
            if not queue or len(queue) > 63:
                raise InvalidArgument(f"queues[{i}]", "a queue name of 1 to 63 characters")
        worker_id = _worker_id(request.worker_id)
        if not 1 <= request.max_runs <= MAX_RUNS:
            raise InvalidArgument("max_runs", f"must be 1 to {MAX_RUNS}")
        if not 0 <= request.wait_ms <= MAX_WAIT_MS:
            raise InvalidArgument("wait_ms", f"must be 0 to {MAX_WAIT_MS}")
        taken = await self.runs.poll(
            list(request.queues), worker_id, request.max_runs, request.wait_ms
        )
        out = worker_pb2.PollRunsResponse(lease_ms=int(self.runs.lease_seconds * 1000))
        for t in taken:
            row = t.row
            run = out.runs.add(
                run_token=t.token,
                task_id=row.task_id,
                node_id=row.node_id,
                action=row.action,
                queue=row.queue,
                idempotency_key=row.idempotency_key,
                payload=json_payload(row.payload),
                attempt=row.attempt,
            )
            run.lease_until.CopyFrom(to_timestamp(row.lease_until))
            run.deadline.CopyFrom(to_timestamp(row.deadline))
        return out

    async def HeartbeatRuns(
        self, request: worker_pb2.HeartbeatRunsRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.HeartbeatRunsResponse:
        worker_id = _worker_id(request.worker_id)
        keys = _held_by(request.run_tokens, worker_id)
        held = await self.runs.heartbeat(worker_id, keys)
        out = worker_pb2.HeartbeatRunsResponse()
        for token, key in zip(request.run_tokens, keys, strict=True):
            lease = out.leases.add(run_token=token, held=key in held)
            if key in held:
                lease.lease_until.CopyFrom(to_timestamp(held[key]))
        return out

    async def CompleteRun(
        self, request: worker_pb2.CompleteRunRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.CompleteRunResponse:
        key, worker_id = _token(request.run_token)
        outcome = _outcome(request)
        if not (await self.runs.complete([(key, worker_id, outcome)]))[0]:
            raise Aborted(_lost(key, worker_id))
        return worker_pb2.CompleteRunResponse()

    async def CompleteRuns(
        self, request: worker_pb2.CompleteRunsRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.CompleteRunsResponse:
        if not 1 <= len(request.completions) <= MAX_RUNS:
            raise InvalidArgument("completions", f"1 to {MAX_RUNS} completions")
        completions = []
        for i, one in enumerate(request.completions):  # all checked before any is recorded
            key, worker_id = _token(one.run_token, f"completions[{i}].run_token")
            completions.append((key, worker_id, _outcome(one, f"completions[{i}].")))
        recorded = await self.runs.complete(completions)
        out = worker_pb2.CompleteRunsResponse()
        for one, (key, worker_id, _), ok in zip(
            request.completions, completions, recorded, strict=True
        ):
            out.results.add(
                run_token=one.run_token, recorded=ok, detail="" if ok else _lost(key, worker_id)
            )
        return out

    async def ReleaseRuns(
        self, request: worker_pb2.ReleaseRunsRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.ReleaseRunsResponse:
        worker_id = _worker_id(request.worker_id)
        keys = _held_by(request.run_tokens, worker_id)
        return worker_pb2.ReleaseRunsResponse(released=await self.runs.release(worker_id, keys))
